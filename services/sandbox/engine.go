package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// RuntimeInsecureDev is the runtime of the insecure development setting.
const RuntimeInsecureDev = events.SandboxRuntimeInsecureDev

// probeTimeout bounds the trial job each runtime runs at start.
const probeTimeout = 60 * time.Second

// Engine runs jobs: it picks the runtime, a job slot (and with it the job's
// host uid), the limits, runs the code and turns what happened into a result.
// The service feeds it jobs from JetStream; tests and benchmarks call it
// directly.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	runtimes map[string]runtime
	problems map[string]error // why a runtime does not work here
	def      string           // the deployment's runtime; "" when none works
	insecure runtime          // non-nil only with Config.InsecureDev
	cgroups  *cgroups
	cgErr    error
	slots    chan int
	uids     *uidClaim // nil when the service is not root: jobs share its uid
	closed   sync.Once
	// stopping counts the jobs answered before their stop ended (execute),
	// which Close waits for; none is added once closing is set (stopMu).
	stopping sync.WaitGroup
	stopMu   sync.Mutex
	closing  bool
}

// NewEngine finds out what works on this host: cgroups, and each runtime by
// running a trial job in it. A runtime that does not work is kept out, with
// the reason, and jobs that ask for it are refused with that reason.
func NewEngine(ctx context.Context, cfg Config, log *slog.Logger) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sandbox config: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil { //nolint:gosec // job uids traverse it to their own 0700 dirs
		return nil, fmt.Errorf("sandbox state dir: %w", err)
	}
	e := &Engine{
		cfg: cfg, log: log,
		runtimes: map[string]runtime{}, problems: map[string]error{},
		slots: make(chan int, cfg.Concurrency),
	}
	for i := range cfg.Concurrency {
		e.slots <- i
	}
	if os.Geteuid() == 0 {
		uids, err := claimUIDs(cfg.UIDBase, cfg.Concurrency)
		if err != nil {
			return nil, err
		}
		e.uids = uids
	}
	if cfg.Cgroups == "auto" {
		e.cgroups, e.cgErr = detectCgroups(ctx, "/sys/fs/cgroup", "toolwire-sandbox")
	} else {
		e.cgErr = errors.New("cgroups are off (" + EnvCgroups + "=off)")
	}
	if e.cgErr != nil {
		log.Warn("sandbox jobs run without a cgroup: rlimits only", "reason", e.cgErr)
	} else {
		log.Info("sandbox jobs get a cgroup each", "cgroups", e.cgroups.describe())
	}
	if e.uids == nil {
		log.Warn("the sandbox service does not run as root: jobs share its uid, and RLIMIT_NPROC cannot be set per job")
	}

	candidates := []struct {
		name string
		make func(Config) (runtime, error)
	}{
		{RuntimeGVisor, func(c Config) (runtime, error) { return newGVisor(c) }},
		{RuntimeBwrap, func(c Config) (runtime, error) { return newBwrap(c) }},
	}
	for _, c := range candidates {
		rt, err := c.make(cfg)
		if err == nil {
			err = e.probe(ctx, rt)
		}
		if err != nil {
			e.problems[c.name] = err
			log.Warn("sandbox runtime does not work here", "runtime", c.name, "reason", err)
			continue
		}
		e.runtimes[c.name] = rt
		log.Info("sandbox runtime works", "runtime", c.name)
	}
	switch cfg.Runtime {
	case RuntimeAuto:
		for _, n := range []string{RuntimeGVisor, RuntimeBwrap} {
			if _, ok := e.runtimes[n]; ok {
				e.def = n
				break
			}
		}
	default:
		if _, ok := e.runtimes[cfg.Runtime]; ok {
			e.def = cfg.Runtime
		}
	}
	if cfg.InsecureDev {
		rt, err := newInsecure()
		if err != nil {
			e.Close()
			return nil, err
		}
		e.insecure = rt
		log.Error("INSECURE DEVELOPMENT SETTING IS ON (" + EnvInsecureDev + "=1): when no sandbox runtime works, " +
			"code runs WITHOUT ISOLATION and can read and change what this service can. Never use this in production.")
	}
	switch {
	case e.def != "":
		log.Info("sandbox ready", "runtime", e.def)
	case e.insecure != nil:
		log.Error("NO SANDBOX RUNTIME WORKS: code will run WITHOUT ISOLATION (insecure development setting)",
			"problems", e.problemText())
	default:
		log.Error("no sandbox runtime works: every job will be refused with SANDBOX_ERROR", "problems", e.problemText())
	}
	return e, nil
}

// Close ends the engine: it waits (up to closeWait) for the jobs answered
// TIMEOUT before their stop ended, then takes every job slot, so that no job starts
// after it, and releases the job uids. A job still running (a drain that ran
// out of time) keeps its slot, and then every uid stays claimed until the
// process ends: another service process must not hand a uid to a new job
// while processes of an old one may still run as it.
func (e *Engine) Close() {
	e.closed.Do(func() {
		e.awaitStopping()
		for range cap(e.slots) {
			select {
			case <-e.slots:
			default:
				if e.uids != nil {
					e.log.Warn("sandbox jobs still run: their uids stay claimed until the process ends")
				}
				return
			}
		}
		if e.uids != nil {
			e.uids.release()
		}
	})
}

// closeWait bounds how long Close waits for the jobs answered before their
// stop ended: the stop grace, and the cleanup's own bounds.
const closeWait = 30 * time.Second

// awaitStopping waits, up to closeWait, for the jobs answered before their
// stop ended.
func (e *Engine) awaitStopping() {
	e.stopMu.Lock()
	e.closing = true
	e.stopMu.Unlock()
	stopped := make(chan struct{})
	go func() {
		e.stopping.Wait()
		close(stopped)
	}()
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		e.log.Warn("sandbox jobs answered TIMEOUT are still being stopped", "waited", closeWait)
	}
}

// UIDs lists the host uids of the job slots (none when the service is not
// root).
func (e *Engine) UIDs() []int {
	if e.uids == nil {
		return nil
	}
	return append([]int(nil), e.uids.uids...)
}

// Runtime returns the deployment's runtime ("" when none works; then jobs are
// refused, or run without isolation under the insecure development setting).
func (e *Engine) Runtime() string { return e.def }

// Available lists the runtimes that work here, sorted.
func (e *Engine) Available() []string {
	out := make([]string, 0, len(e.runtimes))
	for n := range e.runtimes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Problem says why a runtime does not work here (nil when it does).
func (e *Engine) Problem(name string) error { return e.problems[name] }

// Cgroups describes the cgroups jobs get, or why they get none.
func (e *Engine) Cgroups() string {
	if e.cgroups == nil {
		return "none: " + e.cgErr.Error()
	}
	return e.cgroups.describe()
}

func (e *Engine) problemText() string {
	var parts []string
	for _, n := range []string{RuntimeGVisor, RuntimeBwrap} {
		if p := e.problems[n]; p != nil {
			parts = append(parts, n+": "+p.Error())
		}
	}
	return strings.Join(parts, "; ")
}

// probe runs a trial job in rt.
func (e *Engine) probe(ctx context.Context, rt runtime) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	job := &events.SandboxJob{Source: "import json, sys\nprint(json.dumps(json.load(sys.stdin)['a'] * 7))",
		Input: []byte(`{"a":6}`), Stdout: events.SandboxStdoutJSON}
	o, pr, err := e.execute(ctx, rt, job, e.cfg.Limits, probeTimeout/2)
	switch {
	case err != nil:
		return err
	case o.err != nil:
		msg := o.err.Message
		if s := strings.TrimSpace(string(pr.Stderr)); s != "" {
			msg += ": " + lastBytes([]byte(s), 600)
		}
		return fmt.Errorf("trial job failed: %s", msg)
	case string(o.output) != "42":
		return fmt.Errorf("trial job printed %q, want 42", o.output)
	}
	return nil
}

// Run runs a job and returns its result. The error is errInterrupted (wrapped)
// when ctx ended first: the job's outcome is then unknown and it should run
// again.
func (e *Engine) Run(ctx context.Context, job *events.SandboxJob) (events.SandboxResult, error) {
	res := events.SandboxResult{RunID: job.RunID, CallID: job.CallID, Worker: e.cfg.ID}
	start := time.Now()
	fail := func(te *envelope.ToolError) (events.SandboxResult, error) {
		res.Error = te
		res.DurationMS = time.Since(start).Milliseconds()
		return res, nil
	}
	rt, te := e.pick(job.Runtime)
	if te != nil {
		return fail(te)
	}
	res.Runtime = rt.Name()
	if rt.Name() == RuntimeInsecureDev {
		e.log.Warn("running a job WITHOUT ISOLATION (insecure development setting)", "run_id", job.RunID, "call_id", job.CallID)
	}
	o, pr, err := e.execute(ctx, rt, job, e.cfg.Limits.forJob(job.Limits), job.Timeout())
	res.DurationMS = time.Since(start).Milliseconds()
	if err != nil {
		if errors.Is(err, errInterrupted) {
			return res, err
		}
		if errors.Is(err, errNoTimeLeft) {
			return fail(envelope.NewToolError(envelope.CodeTimeout, "the job waited past its deadline before a sandbox could run it").
				WithDetails(ErrorDetails{Limit: LimitWallTime, LimitValue: int64(job.TimeoutMS), Runtime: rt.Name()}))
		}
		e.log.Error("sandbox runtime failed", "runtime", rt.Name(), "run_id", job.RunID, "call_id", job.CallID, "err", err)
		return fail(envelope.NewToolError(envelope.CodeSandboxError, "the %s sandbox could not run the code: %v", rt.Name(), err))
	}
	res.Output, res.Error = o.output, o.err
	res.ExitCode = pr.ExitCode
	res.Stderr = lastBytes(pr.Stderr, e.cfg.Limits.StderrBytes)
	res.StderrTruncated = pr.StderrTruncated
	return res, nil
}

// pick returns the runtime for a job that asks for name ("" for the
// deployment's), or the error that refuses the job.
func (e *Engine) pick(name string) (runtime, *envelope.ToolError) {
	if name == "" {
		if e.def != "" {
			return e.runtimes[e.def], nil
		}
		if e.insecure != nil {
			return e.insecure, nil
		}
		return nil, envelope.NewToolError(envelope.CodeSandboxError,
			"no sandbox runtime works on this host, so code is not run (%s)", e.problemText())
	}
	if rt, ok := e.runtimes[name]; ok {
		return rt, nil
	}
	if p := e.problems[name]; p != nil {
		return nil, envelope.NewToolError(envelope.CodeSandboxError, "the %s sandbox runtime the tool asks for does not work on this host: %v", name, p)
	}
	return nil, envelope.NewToolError(envelope.CodeSandboxError, "unknown sandbox runtime %q", name)
}

// answerMargin is the part of the time left before a job's deadline (when
// its caller stops waiting) that the sandbox keeps to end the program and
// answer: the runtime's graceful stop (stopGrace), the kill and the cleanup,
// the result's publication. A tenth of the time left, at least 200 ms and at
// most stopGrace and a second. A job stopped at its timeout whose stop takes
// longer than a third of it is answered TIMEOUT without waiting for the stop
// (answerReserve), without the program's last stderr: with gVisor, whose
// graceful stop alone can take that long, often. The executor keeps the same margin
// between a job's timeout and its deadline (services/executor/tools/sandboxtool).
func answerMargin(left time.Duration) time.Duration {
	return min(max(left/10, 200*time.Millisecond), stopGrace+time.Second)
}

// runTimeout is how long a job that starts now may run: its timeout, and no
// longer than its deadline less the answer margin, so that its answer (a
// TIMEOUT included) reaches the caller before the caller stops waiting. It is
// computed when the job has its slot: time spent waiting for one counts. Zero
// or less: no time is left.
func runTimeout(timeout time.Duration, deadline, now time.Time) time.Duration {
	if deadline.IsZero() {
		return timeout
	}
	left := deadline.Sub(now)
	return min(timeout, left-answerMargin(left))
}

// errNoTimeLeft is returned by execute when the job's time ran out before it
// had a slot.
var errNoTimeLeft = errors.New("sandbox: no time left to run the job")

// execute runs the job's code in rt, in a job slot, for timeout at most and
// no longer than the job's deadline allows once it has its slot, and
// classifies what happened. A job with a deadline is answered by then less
// answerReserve, even when its stop has not ended (it goes on, holding the
// slot, and Close waits for it).
func (e *Engine) execute(ctx context.Context, rt runtime, job *events.SandboxJob, l Limits, timeout time.Duration) (outcome, procResult, error) {
	var slot int
	select {
	case slot = <-e.slots:
	case <-ctx.Done():
		return outcome{}, procResult{}, fmt.Errorf("%w: waiting for a job slot: %w", errInterrupted, context.Cause(ctx))
	}
	now := time.Now()
	timeout = runTimeout(timeout, job.Deadline, now)
	if timeout <= 0 {
		e.slots <- slot
		return outcome{}, procResult{}, errNoTimeLeft
	}
	x := &execution{
		ID: newJobID(), Python: e.cfg.Python, Source: job.Source, Stdin: job.Input,
		Limits: l, Timeout: timeout, Slot: slot, SlotUID: -1, Cgroups: e.cgroups,
	}
	if e.uids != nil {
		x.SlotUID = e.uids.uids[slot]
	}

	// The job runs in its own goroutine, which gives its slot back once
	// the runtime is done with it (processes killed, cgroup and container
	// removed). Its answer waits for that, but no longer than answerBy: a
	// job stopped at its timeout whose stop and cleanup outlast the answer
	// margin (a loaded host) is answered TIMEOUT then, while its stop goes
	// on (detached), so that the answer still reaches the caller in time.
	type ran struct {
		pr  procResult
		err error
	}
	var (
		mu       sync.Mutex
		detached bool
		done     = make(chan ran, 1)
	)
	go func() {
		pr, err := runRecovered(ctx, rt, x)
		e.slots <- slot
		if pr.Leftovers != nil {
			e.log.Error("processes of a sandbox job survived it", "runtime", rt.Name(), "job", x.ID, "err", pr.Leftovers)
		}
		mu.Lock()
		defer mu.Unlock()
		if detached {
			e.log.Info("a job answered before its stop ended is stopped", "runtime", rt.Name(), "job", x.ID,
				"run_id", job.RunID, "call_id", job.CallID, "err", err)
			e.stopping.Done()
			return
		}
		done <- ran{pr, err}
	}()
	var answerBy <-chan time.Time
	if !job.Deadline.IsZero() {
		t := time.NewTimer(job.Deadline.Sub(now) - answerReserve(job.Deadline.Sub(now)))
		defer t.Stop()
		answerBy = t.C
	}
	var r ran
	select {
	case r = <-done:
	case <-answerBy:
		// Only a job whose timeout has fired is answered before its stop
		// ends: its outcome is known. One that finished, or is stopped
		// because its output went past the limit or the service shuts down
		// (ctx), is answered with what happened, when its stop ends.
		mu.Lock()
		select {
		case r = <-done: // it ended meanwhile
			mu.Unlock()
		default:
			if !x.timedOut.Load() || ctx.Err() != nil || !e.detach() {
				mu.Unlock()
				r = <-done
				break
			}
			detached = true
			mu.Unlock()
			e.log.Warn("a job's stop outlasted its answer margin: answered TIMEOUT before its cleanup ended",
				"runtime", rt.Name(), "job", x.ID, "run_id", job.RunID, "call_id", job.CallID, "timeout", timeout)
			return outcome{err: envelope.NewToolError(envelope.CodeTimeout,
					"the program ran longer than its timeout of %s and is being killed", timeout).
					WithDetails(ErrorDetails{Limit: LimitWallTime, LimitValue: timeout.Milliseconds(), Runtime: rt.Name()})},
				procResult{TimedOut: true, ExitCode: -1}, nil
		}
	}
	if r.err != nil {
		return outcome{}, r.pr, r.err
	}
	return classify(job.Stdout, rt.Name(), l, timeout, &r.pr), r.pr, nil
}

// runRecovered runs x in rt; a panic in the runtime is an error (the job's
// caller retries it), so that the goroutine that runs it still gives its slot
// back.
func runRecovered(ctx context.Context, rt runtime, x *execution) (pr procResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sandbox runtime %s panicked: %v", rt.Name(), p)
		}
	}()
	return rt.Run(ctx, x)
}

// detach counts a job answered before its stop ended, which Close waits for;
// false once Close has begun (the job is then waited for where it runs).
func (e *Engine) detach() bool {
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	if e.closing {
		return false
	}
	e.stopping.Add(1)
	return true
}

// answerReserve is the part of the time left before a job's deadline that
// its answer keeps for itself whatever the job's stop costs: two thirds of
// the answer margin, for the result's publication and delivery (on a loaded
// host, with six jobs stopped at once: 100-250 ms from the answer to its
// publication). A job stopped at its timeout has the rest of the margin to
// end and be cleaned up; past it, its answer does without the program's
// last stderr.
func answerReserve(left time.Duration) time.Duration {
	return answerMargin(left) * 2 / 3
}

// newJobID returns a fresh id for a job's cgroup, bundle and container.
func newJobID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "tw" + hex.EncodeToString(b[:])
}

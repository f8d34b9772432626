package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// gateScript holds the started process until the supervisor has put it in its
// cgroup and set its rlimits: it waits for a line on fd 3, closes fd 3, and
// execs the runtime. Everything the runtime starts is then born inside the
// limits; nothing can fork before them.
const gateScript = `read -r go <&3 || exit 126; exec 3<&-; exec "$@"`

// gateShell runs gateScript; a POSIX shell is on every host the runtimes run
// on (bubblewrap and runsc are started through it).
const gateShell = "/bin/sh"

// rlimit is one resource limit set on the job's first process and inherited
// by everything it starts.
type rlimit struct {
	resource int
	value    uint64
}

// hard is the rlimit's hard limit: its value, one more for RLIMIT_CPU (the
// kernel sends SIGXCPU at the soft limit and SIGKILL at the hard one, and the
// SIGXCPU tells what happened).
func (l rlimit) hard() uint64 {
	if l.resource == unix.RLIMIT_CPU {
		return l.value + 1
	}
	return l.value
}

// procSpec is one supervised host process: a runtime (bwrap, runsc) or, in
// insecure development mode, python3 itself.
type procSpec struct {
	Path  string
	Args  []string
	Env   []string // the whole environment: nothing of the service's is inherited
	Dir   string
	Stdin []byte
	// ExtraFiles are fds 4, 5, ... of the program (fd 3 is the gate's, closed
	// before the program starts).
	ExtraFiles []*os.File
	// UID and GID run the process as another user (-1: the service's).
	UID, GID    int
	Rlimits     []rlimit
	Cgroup      *jobCgroup // nil: none
	Timeout     time.Duration
	OutputLimit int64
	StderrLimit int
	// TimedOut, when set, is set as soon as the timeout fires, before the
	// stop: the job's outcome is then known (TIMEOUT) while it is stopped.
	TimedOut *atomic.Bool
	// Stop is the runtime's graceful way to end a job early (runsc kill): the
	// runtime then exits by itself and cleans up. Without it, or when it does
	// not work within stopGrace, every process of the job gets SIGKILL.
	Stop func(ctx context.Context)
	// Kill is the runtime's own way to end the job (besides SIGKILL to the
	// process group and the cgroup). It is called when the job ends, and when
	// it must end early and has no cgroup; it must be idempotent.
	Kill func(ctx context.Context)
	// SignalExit reports that exit codes 129-192 mean "killed by signal N-128"
	// (bwrap and runsc report their child's death so).
	SignalExit bool
}

// procResult is what happened to a supervised process.
type procResult struct {
	Stdout          []byte
	Stderr          []byte
	StderrTruncated bool
	ExitCode        int            // -1 when a signal ended it
	Signal          syscall.Signal // the signal that ended it, 0 if it exited
	TimedOut        bool
	OutputExceeded  bool
	MemoryEvent     bool // the cgroup's memory limit killed a process
	PidsEvent       bool // the cgroup's pids limit refused a fork
	Duration        time.Duration
	CPUTime         time.Duration
	// Leftovers is set when processes of the job could not be killed.
	Leftovers error
}

// stopGrace is how long a runtime's graceful stop may take.
const stopGrace = 2 * time.Second

// errInterrupted is returned when ctx ended before the process did (a
// shutdown): the job must run again elsewhere, its outcome says nothing.
var errInterrupted = errors.New("sandbox: job interrupted")

// runProcess starts the process behind the gate, puts it into its cgroup,
// sets its rlimits, releases it, and supervises it: it is killed at its
// timeout, when its stdout exceeds the limit, or when ctx ends. When it ends,
// everything it started is killed too.
func runProcess(ctx context.Context, spec procSpec) (res procResult, err error) {
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	cgroupRemoved := false
	removeCgroup := func() {
		if spec.Cgroup == nil || cgroupRemoved {
			return
		}
		cgroupRemoved = true
		// The removal outlives ctx (a job interrupted by a shutdown still
		// leaves no cgroup), bounded of its own.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := spec.Cgroup.remove(rctx); err != nil {
			res.Leftovers = errors.Join(res.Leftovers, err)
		}
	}
	// A job that fails to start leaves no cgroup either.
	defer removeCgroup()
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("pipe: %w", err)
		}
		closers = append(closers, r, w)
		return r, w, nil
	}
	gateR, gateW, err := pipe()
	if err != nil {
		return res, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return res, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return res, err
	}
	errR, errW, err := pipe()
	if err != nil {
		return res, err
	}

	env := spec.Env
	if env == nil {
		env = []string{} // nil would inherit the service's environment
	}
	args := []string{"-c", gateScript, "toolwire-sandbox-gate"}
	if spec.UID >= 0 {
		// The gate runs as the service's uid, so that the service may set its
		// rlimits (it need not hold CAP_SYS_RESOURCE); setpriv then takes the
		// job's uid and execs the runtime.
		setpriv, err := lookPath("", "setpriv")
		if err != nil {
			return res, fmt.Errorf("setpriv (util-linux) is needed to run a job as its own uid: %w", err)
		}
		args = append(args, setpriv, "--reuid="+strconv.Itoa(spec.UID), "--regid="+strconv.Itoa(spec.GID),
			"--clear-groups", "--")
	}
	args = append(append(args, spec.Path), spec.Args...)
	// Cleanup outlives ctx (a shutdown still cleans up), bounded of its own.
	cleanupCtx, cancelCleanup := context.WithTimeout(context.WithoutCancel(ctx), spec.Timeout+time.Minute)
	defer cancelCleanup()
	// The supervisor below ends the job, at its timeout or when ctx ends, so
	// that the runtime may stop gracefully first: ctx must not kill the
	// process. cleanupCtx only backstops the supervisor: whatever happens,
	// the process is killed a minute after its timeout.
	cmd := exec.CommandContext(cleanupCtx, gateShell, args...) //nolint:gosec // fixed script; the runtime's argv is passed as "$@", never parsed by the shell
	cmd.Env = env
	cmd.Dir = spec.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	cmd.ExtraFiles = append([]*os.File{gateR}, spec.ExtraFiles...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start %s: %w", spec.Path, err)
	}
	pid := cmd.Process.Pid
	// The child holds its ends now.
	for _, f := range []*os.File{gateR, inR, outW, errW} {
		_ = f.Close()
	}

	var killMu sync.Mutex
	// killAll ends every process of the job: the cgroup, the process group,
	// and the runtime's own way. While the runtime process still runs, the
	// runtime's way (runsc delete) is slow and, with a cgroup, not needed.
	killAll := func(runtimeAlive bool) {
		killMu.Lock()
		defer killMu.Unlock()
		if spec.Cgroup != nil {
			spec.Cgroup.kill()
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		if spec.Kill != nil && (!runtimeAlive || spec.Cgroup == nil) {
			spec.Kill(cleanupCtx)
		}
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	if err := setupProcess(pid, spec); err != nil {
		killAll(true)
		return res, errors.Join(err, <-waited)
	}
	start := time.Now()
	if _, err := gateW.Write([]byte("go\n")); err != nil {
		killAll(true)
		return res, errors.Join(fmt.Errorf("release the gate: %w", err), <-waited)
	}
	_ = gateW.Close()

	// Input: written by a goroutine, so that a program that never reads its
	// stdin does not block us; closing inW at the end unblocks it.
	go func() {
		_, _ = inW.Write(spec.Stdin)
		_ = inW.Close()
	}()
	exceeded := make(chan struct{})
	var stdout []byte
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		stdout = readCapped(outR, spec.OutputLimit, exceeded)
	}()
	tail := &tailBuffer{max: spec.StderrLimit}
	go func() {
		defer readers.Done()
		_, _ = io.Copy(tail, errR)
	}()

	timer := time.NewTimer(spec.Timeout)
	defer timer.Stop()
	var waitErr error
	interrupted := false
	// stop ends the job early: the runtime's graceful stop first (it lets the
	// runtime clean up after itself), everything at once after stopGrace.
	stop := func() error {
		if spec.Stop != nil {
			spec.Stop(cleanupCtx)
			grace := time.NewTimer(stopGrace)
			defer grace.Stop()
			select {
			case err := <-waited:
				return err
			case <-grace.C:
			}
		}
		killAll(true)
		return <-waited
	}
	select {
	case waitErr = <-waited:
	case <-timer.C:
		res.TimedOut = true
		if spec.TimedOut != nil {
			spec.TimedOut.Store(true)
		}
		waitErr = stop()
	case <-exceeded:
		res.OutputExceeded = true
		waitErr = stop()
	case <-ctx.Done():
		interrupted = true
		waitErr = stop()
	}
	res.Duration = time.Since(start)
	// The job is over: nothing of it may outlive it.
	killAll(false)
	if spec.Cgroup != nil {
		res.MemoryEvent, res.PidsEvent = spec.Cgroup.limitEvents()
		removeCgroup()
	}
	// Every writer is dead; a reader still blocked would be on a pipe an
	// escaped process holds: give up on it after a moment.
	_ = outR.SetReadDeadline(time.Now().Add(2 * time.Second))
	_ = errR.SetReadDeadline(time.Now().Add(2 * time.Second))
	readers.Wait()
	_ = inW.Close()

	select {
	case <-exceeded:
		res.OutputExceeded = true
	default:
	}
	res.Stdout = stdout
	res.Stderr, res.StderrTruncated = tail.bytes()
	if ps := cmd.ProcessState; ps != nil {
		res.CPUTime = ps.UserTime() + ps.SystemTime()
		ws, ok := ps.Sys().(syscall.WaitStatus)
		switch {
		case ok && ws.Signaled():
			res.ExitCode, res.Signal = -1, ws.Signal()
		case ok:
			res.ExitCode = ws.ExitStatus()
			if spec.SignalExit && res.ExitCode > 128 && res.ExitCode <= 128+64 {
				res.ExitCode, res.Signal = -1, syscall.Signal(res.ExitCode-128)
			}
		}
	} else if waitErr != nil {
		return res, fmt.Errorf("wait %s: %w", spec.Path, waitErr)
	}
	if interrupted {
		return res, fmt.Errorf("%w: %w", errInterrupted, context.Cause(ctx))
	}
	return res, nil
}

// setupProcess puts the gated process into its cgroup and sets its rlimits.
func setupProcess(pid int, spec procSpec) error {
	if spec.Cgroup != nil {
		if err := spec.Cgroup.add(pid); err != nil {
			return err
		}
	}
	for _, l := range spec.Rlimits {
		lim := unix.Rlimit{Cur: l.value, Max: l.hard()}
		if err := unix.Prlimit(pid, l.resource, &lim, nil); err != nil {
			return fmt.Errorf("set rlimit %d of process %d: %w", l.resource, pid, err)
		}
	}
	return nil
}

// readCapped reads r to its end and returns at most limit bytes of it; it
// closes exceeded (and stops reading) when r holds more.
func readCapped(r io.Reader, limit int64, exceeded chan<- struct{}) []byte {
	var out []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if int64(len(out)+n) > limit {
				out = append(out, buf[:limit-int64(len(out))]...)
				close(exceeded)
				return out
			}
			out = append(out, buf[:n]...)
		}
		if err != nil {
			return out
		}
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu        sync.Mutex
	max       int
	buf       []byte
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.truncated = true
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...), t.truncated
}

// processesOf lists the live processes whose real uid is uid. A zombie is
// not one: it runs nothing and holds nothing but its pid until its parent (or
// init, for an orphan) reaps it.
func processesOf(uid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.Itoa(uid)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var state, ruid string
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(rest)
			} else if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				if fs := strings.Fields(rest); len(fs) > 0 {
					ruid = fs[0]
				}
				break
			}
		}
		if ruid == want && !strings.HasPrefix(state, "Z") && !strings.HasPrefix(state, "X") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killUID kills every process of uid until none is left, bounded by ctx. A
// job slot's uid belongs to that job alone, so whatever runs as it when the
// job is over is a leftover of the job.
func killUID(ctx context.Context, uid int) error {
	wait := time.Millisecond
	for {
		pids := processesOf(uid)
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("processes %v of uid %d survive: %w", pids, uid, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}

package sandbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// TestPythonContract checks the language contract in both runtimes: the input
// as JSON on stdin, the output as one JSON value on stdout (json mode) or
// {stdout, stderr} (text mode), stderr kept as a capped diagnostic, and the
// program's failures as SANDBOX_ERROR with what it said.
func TestPythonContract(t *testing.T) {
	e := newTestEngine(t, Config{})
	cases := []struct {
		name, mode, source, input string
		want                      string // output; "" when an error is wanted
		msg                       string // in the error's message
	}{
		{"json in, json out", events.SandboxStdoutJSON,
			"import json, sys\nd = json.load(sys.stdin)\nprint(json.dumps({'sum': sum(d['xs'])}))",
			`{"xs":[1,2,3.5]}`, `{"sum": 6.5}`, ""},
		{"whitespace around the value", events.SandboxStdoutJSON, "print('\\n  [1, 2]  \\n')", "", `[1, 2]`, ""},
		{"stderr is not output", events.SandboxStdoutJSON,
			"import sys\nprint('debugging', file=sys.stderr)\nprint('true')", "", `true`, ""},
		{"text mode", events.SandboxStdoutText,
			"import sys\nprint('hello')\nprint('oops', file=sys.stderr)", "", `{"stderr":"oops\n","stdout":"hello\n"}`, ""},
		{"printed nothing", events.SandboxStdoutJSON, "x = 1", "", "", "printed nothing"},
		{"not JSON", events.SandboxStdoutJSON, "print('hello world')", "", "", "not one JSON value"},
		{"two values", events.SandboxStdoutJSON, "print('1')\nprint('2')", "", "", "not one JSON value"},
		{"exception", events.SandboxStdoutJSON, "raise ValueError('bad input')", "", "", "exited with status 1: ValueError: bad input"},
		{"exit status", events.SandboxStdoutText, "import sys\nsys.exit(3)", "", "", "exited with status 3"},
		{"syntax error", events.SandboxStdoutJSON, "def (", "", "", "SyntaxError"},
		{"killed by a signal", events.SandboxStdoutJSON, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "", "", "killed by SIGSEGV"},
	}
	for _, rt := range []string{RuntimeGVisor, RuntimeBwrap} {
		t.Run(rt, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					job := testJob(rt, c.source, c.input, 10*time.Second)
					job.Stdout = c.mode
					res := run(t, e, job)
					if c.want != "" {
						require.Nil(t, res.Error, "stderr: %s", res.Stderr)
						require.JSONEq(t, c.want, string(res.Output))
						return
					}
					require.NotNil(t, res.Error, "output %s", res.Output)
					require.Equal(t, envelope.CodeSandboxError, res.Error.Code)
					require.Contains(t, res.Error.Message, c.msg)
					d := details(t, res)
					require.Empty(t, d.Limit, "a program's own failure names no limit")
				})
			}
		})
	}

	t.Run("stderr is capped, its end kept", func(t *testing.T) {
		job := testJob(RuntimeBwrap, "import sys\nsys.stderr.write('a' * 100000 + 'THE END')\nprint(1)", "", 10*time.Second)
		res := run(t, e, job)
		require.Nil(t, res.Error)
		require.True(t, res.StderrTruncated)
		require.Len(t, res.Stderr, testLimits().StderrBytes)
		require.True(t, strings.HasSuffix(res.Stderr, "THE END"))
	})
}

// TestSeccompDeniesSyscalls runs code in bwrap that calls what the filter
// denies: each fails with EPERM (ENOSYS for clone3), while ordinary work goes
// on.
func TestSeccompDeniesSyscalls(t *testing.T) {
	e := newTestEngine(t, Config{})
	src := `import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    r = getattr(libc, name)(*args)
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
res = {
    "unshare(CLONE_NEWUSER)": call("unshare", 0x10000000),
    "unshare(CLONE_NEWNET)": call("unshare", 0x40000000),
    "mount": call("mount", b"none", b"/work", b"tmpfs", 0, None),
    "ptrace(PTRACE_TRACEME)": call("ptrace", 0, 0, None, None),
    "keyctl": call("syscall", 250, 0, 0, 0, 0),
    "bpf": call("syscall", 321, 0, 0, 0),
    "perf_event_open": call("syscall", 298, 0, 0, -1, -1, 0),
    "userfaultfd": call("syscall", 323, 0),
    "io_uring_setup": call("syscall", 425, 1, 0),
    "clone3": call("syscall", 435, 0, 0),
    "clone(CLONE_NEWUSER)": call("syscall", 56, 0x10000000 | 17, 0, 0, 0, 0),
    "getpid": call("getpid"),
}
pid = os.fork()
if pid == 0:
    os._exit(7)
res["fork"] = "ok" if os.WEXITSTATUS(os.waitpid(pid, 0)[1]) == 7 else "bad"
print(json.dumps(res))
`
	res := run(t, e, testJob(RuntimeBwrap, src, "", 10*time.Second))
	require.Nil(t, res.Error, "stderr: %s", res.Stderr)
	var got map[string]string
	require.NoError(t, json.Unmarshal(res.Output, &got))
	want := map[string]string{
		"unshare(CLONE_NEWUSER)": "EPERM", "unshare(CLONE_NEWNET)": "EPERM", "mount": "EPERM",
		"ptrace(PTRACE_TRACEME)": "EPERM", "keyctl": "EPERM", "bpf": "EPERM", "perf_event_open": "EPERM",
		"userfaultfd": "EPERM", "io_uring_setup": "EPERM", "clone3": "ENOSYS", "clone(CLONE_NEWUSER)": "EPERM",
		"getpid": "ok", "fork": "ok",
	}
	require.Equal(t, want, got)
}

func TestSeccompProgram(t *testing.T) {
	prog, err := seccompProgram()
	require.NoError(t, err)
	require.NotEmpty(t, prog)
	require.Zero(t, len(prog)%8, "an array of 8-byte struct sock_filter")
	require.Less(t, len(prog)/8, 4096, "BPF_MAXINSNS")
}

// TestRuntimeChoice: a job asking for a runtime that does not work here, or
// any job when none works, is refused with SANDBOX_ERROR saying why; the
// insecure development setting runs it without isolation, and says so.
func TestRuntimeChoice(t *testing.T) {
	if os.Geteuid() != 0 {
		needSandbox(t, "not running as root")
	}
	noRunsc := Config{StateDir: t.TempDir(), Runsc: "/nonexistent/runsc", Limits: testLimits(), Concurrency: 1}
	e, err := NewEngine(t.Context(), noRunsc, nil)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	require.ErrorContains(t, e.Problem(RuntimeGVisor), "runsc")
	if e.Problem(RuntimeBwrap) != nil {
		needSandbox(t, "bwrap does not work: "+e.Problem(RuntimeBwrap).Error())
	}
	require.Equal(t, RuntimeBwrap, e.Runtime(), "auto falls back to bwrap")

	res := run(t, e, testJob(RuntimeGVisor, "print(1)", "", 5*time.Second))
	require.NotNil(t, res.Error)
	require.Equal(t, envelope.CodeSandboxError, res.Error.Code)
	require.Contains(t, res.Error.Message, "the gvisor sandbox runtime the tool asks for does not work on this host")
	require.Contains(t, res.Error.Message, "/nonexistent/runsc")

	res = run(t, e, testJob("", "print(1)", "", 5*time.Second))
	require.Nil(t, res.Error)
	require.Equal(t, RuntimeBwrap, res.Runtime)

	neither := noRunsc
	neither.StateDir, neither.Bwrap = t.TempDir(), "/nonexistent/bwrap"
	e2, err := NewEngine(t.Context(), neither, nil)
	require.NoError(t, err)
	t.Cleanup(e2.Close)
	require.Empty(t, e2.Runtime())
	res = run(t, e2, testJob("", "print(1)", "", 5*time.Second))
	require.NotNil(t, res.Error)
	require.Equal(t, envelope.CodeSandboxError, res.Error.Code)
	require.Contains(t, res.Error.Message, "no sandbox runtime works on this host, so code is not run")
	require.Contains(t, res.Error.Message, "bubblewrap (Debian package bubblewrap) is not installed")
	require.Empty(t, res.Runtime)

	insecure := neither
	insecure.StateDir, insecure.InsecureDev = t.TempDir(), true
	e3, err := NewEngine(t.Context(), insecure, nil)
	require.NoError(t, err)
	t.Cleanup(e3.Close)
	res = run(t, e3, testJob("", "import json, os\nprint(json.dumps(os.getuid()))", "", 5*time.Second))
	require.Nil(t, res.Error, "stderr: %s", res.Stderr)
	require.Equal(t, RuntimeInsecureDev, res.Runtime)
	require.Equal(t, e3.UIDs()[0], mustInt(t, res.Output), "even without isolation a job runs as its slot's uid")
	res = run(t, e3, testJob("", "while True:\n    pass", "", time.Second))
	require.NotNil(t, res.Error)
	require.Equal(t, envelope.CodeTimeout, res.Error.Code, "the limits still hold")
	require.Empty(t, processesOf(e3.UIDs()[0]))
}

func mustInt(t *testing.T, b json.RawMessage) int {
	t.Helper()
	var n int
	require.NoError(t, json.Unmarshal(b, &n))
	return n
}

// TestDeadlinePassed: a job whose caller stopped waiting before it could run
// is answered TIMEOUT without running.
func TestDeadlinePassed(t *testing.T) {
	e := newTestEngine(t, Config{})
	job := testJob(RuntimeBwrap, "print(1)", "", 5*time.Second)
	job.Deadline = time.Now().Add(-time.Second)
	res := run(t, e, job)
	require.NotNil(t, res.Error)
	require.Equal(t, envelope.CodeTimeout, res.Error.Code)
	require.Contains(t, res.Error.Message, "waited past its deadline")
	require.Zero(t, res.ExitCode)
}

// TestJobLimitsOnlyTighten: a tool may ask for lower limits, never for more
// than the deployment's.
func TestJobLimitsOnlyTighten(t *testing.T) {
	e := newTestEngine(t, Config{})
	src := "import json, resource\nprint(json.dumps([resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))"
	for _, rt := range []string{RuntimeGVisor, RuntimeBwrap} {
		job := testJob(rt, src, "", 10*time.Second)
		job.Limits = &events.SandboxLimits{MemoryBytes: 64 << 20, OpenFiles: 1 << 20}
		res := run(t, e, job)
		require.Nil(t, res.Error, "stderr: %s", res.Stderr)
		require.JSONEq(t, `[67108864, 64]`, string(res.Output), rt)
	}
}

// TestCloseKeepsUIDsOfRunningJobs: an engine closed while a job still runs
// (a shutdown whose drain ran out of time) keeps its job uids claimed, so
// that no other service process hands one to a new job while the old job's
// processes may still run as it; closed idle, it releases them.
func TestCloseKeepsUIDsOfRunningJobs(t *testing.T) {
	e := newTestEngine(t, Config{Concurrency: 1})
	uids := e.UIDs()
	require.Len(t, uids, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(ctx, testJob(RuntimeBwrap, "import time\ntime.sleep(600)", "", time.Minute))
		done <- err
	}()
	require.Eventually(t, func() bool { return len(processesOf(uids[0])) > 0 }, time.Minute, 10*time.Millisecond,
		"the job never ran as its slot's uid")
	e.Close()
	require.Equal(t, uids, e.UIDs(), "a running job's uid stays claimed")
	cancel()
	require.ErrorIs(t, <-done, errInterrupted)
	require.Empty(t, processesOf(uids[0]))
	require.Equal(t, uids, e.UIDs(), "claimed until the process ends")

	idle := newTestEngine(t, Config{Concurrency: 1})
	require.Len(t, idle.UIDs(), 1)
	idle.Close()
	require.Empty(t, idle.UIDs(), "an idle engine releases its uids")
}

// TestRunTimeoutLeavesTheAnswerMargin: a job runs for its timeout at most,
// and no longer than its deadline less the margin the sandbox keeps to stop
// it and answer, whatever the two are.
func TestRunTimeoutLeavesTheAnswerMargin(t *testing.T) {
	now := time.Now()
	require.Equal(t, 5*time.Second, runTimeout(5*time.Second, time.Time{}, now), "no deadline: the timeout")
	for _, timeout := range []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 3 * time.Second, 30 * time.Second, 10 * time.Minute} {
		for _, left := range []time.Duration{-time.Second, 0, 150 * time.Millisecond, 250 * time.Millisecond, time.Second, 2900 * time.Millisecond,
			3 * time.Second, 10 * time.Second, 30 * time.Second, 31 * time.Second, time.Hour} {
			got := runTimeout(timeout, now.Add(left), now)
			require.LessOrEqual(t, got, timeout, "timeout %s, %s left", timeout, left)
			if got > 0 {
				require.GreaterOrEqual(t, left-got, answerMargin(left), "timeout %s, %s left", timeout, left)
				require.GreaterOrEqual(t, left-got, 200*time.Millisecond, "timeout %s, %s left", timeout, left)
			}
			if left >= 10*(stopGrace+time.Second) && timeout < left/2 {
				require.Equal(t, timeout, got, "a deadline far off does not shorten the timeout")
			}
		}
	}
	require.Equal(t, stopGrace+time.Second, answerMargin(time.Hour), "the margin holds the whole stop grace")
}

// TestDeadlineBoundsTheRun: a job whose deadline is closer than its timeout
// (a caller that waits only as long as the job may run, or a job that waited
// for a slot) runs only until its deadline less the answer margin: its
// TIMEOUT names that limit, and leaves its caller the margin to get it.
func TestDeadlineBoundsTheRun(t *testing.T) {
	e := newTestEngine(t, Config{})
	for _, rt := range []string{RuntimeGVisor, RuntimeBwrap} {
		job := testJob(rt, "while True:\n    pass\n", "", 2*time.Second)
		job.Deadline = time.Now().Add(job.Timeout())
		res := run(t, e, job)
		require.NotNil(t, res.Error, rt)
		require.Equal(t, envelope.CodeTimeout, res.Error.Code, "%s: %s", rt, res.Error.Message)
		d := details(t, res)
		require.Equal(t, LimitWallTime, d.Limit, rt)
		require.Less(t, d.LimitValue, int64(job.TimeoutMS)-answerMargin(job.Timeout()).Milliseconds()+1, rt)
		require.Positive(t, d.LimitValue, rt)
	}
}

// slowStop is a runtime whose jobs run to their timeout and then take stop
// to end (a loaded host whose runtime stops and cleans up slowly).
type slowStop struct {
	stop      time.Duration
	finishes  bool          // the program ends by itself before its timeout
	onTimeout func()        // called when the timeout fires, before the stop
	ended     chan struct{} // closed when the job's stop has ended
}

func (s *slowStop) Name() string { return "slow-stop" }

func (s *slowStop) Run(ctx context.Context, x *execution) (procResult, error) {
	defer close(s.ended)
	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			time.Sleep(s.stop) // a shutdown stops the job, as slowly
			return errInterrupted
		}
	}
	if s.finishes {
		// The program exits just before its timeout; its cleanup is slow.
		if err := wait(x.Timeout - 5*time.Millisecond + s.stop); err != nil {
			return procResult{}, err
		}
		return procResult{Stdout: []byte(`{"done":true}`)}, nil
	}
	if err := wait(x.Timeout); err != nil {
		return procResult{}, err
	}
	x.timedOut.Store(true)
	if s.onTimeout != nil {
		s.onTimeout()
	}
	if err := wait(s.stop); err != nil {
		return procResult{}, err
	}
	return procResult{TimedOut: true, ExitCode: -1, Stderr: []byte("stopped")}, nil
}

// TestAnswerBeforeTheDeadlineWhateverTheStopCosts: a job stopped at its
// timeout whose stop outlasts the answer margin is answered TIMEOUT (its
// wall_time limit) before its deadline less the reserve for the answer's
// delivery; its slot comes back only once the stop has ended, and Close waits
// for it. A stop within the margin is answered as it ends, with what the
// runtime saw.
func TestAnswerBeforeTheDeadlineWhateverTheStopCosts(t *testing.T) {
	engine := func(rt runtime) *Engine {
		e := &Engine{cfg: Config{Concurrency: 1}.WithDefaults(), log: slog.New(slog.DiscardHandler),
			runtimes: map[string]runtime{rt.Name(): rt}, problems: map[string]error{}, def: rt.Name(), slots: make(chan int, 1)}
		e.slots <- 0
		return e
	}
	job := func(left time.Duration) *events.SandboxJob {
		j := testJob("", "pass", "", left)
		j.Deadline = time.Now().Add(left)
		return j
	}

	slow := &slowStop{stop: 1500 * time.Millisecond, ended: make(chan struct{})}
	e := engine(slow)
	j := job(2 * time.Second)
	res, err := e.Run(t.Context(), j)
	answered := time.Now()
	require.NoError(t, err)
	require.NoError(t, res.Validate())
	require.NotNil(t, res.Error)
	require.Equal(t, envelope.CodeTimeout, res.Error.Code, res.Error.Message)
	require.Contains(t, res.Error.Message, "ran longer than its timeout")
	d, ok := res.Error.Details.(ErrorDetails)
	require.True(t, ok, "%T", res.Error.Details)
	require.Equal(t, LimitWallTime, d.Limit)
	require.Equal(t, "slow-stop", d.Runtime)
	require.Positive(t, d.LimitValue)
	require.False(t, answered.After(j.Deadline.Add(-answerReserve(2*time.Second)+50*time.Millisecond)),
		"answered %s before the deadline; want at least the reserve, %s", j.Deadline.Sub(answered), answerReserve(2*time.Second))
	select {
	case <-slow.ended:
		t.Fatal("the stop had ended: the test shows nothing")
	default:
	}
	require.Empty(t, e.slots, "the slot is the stopping job's until its stop ends")
	e.Close()
	select {
	case <-slow.ended:
	default:
		t.Fatal("Close returned before the stop it waits for ended")
	}

	// A stop that fits in the margin: the runtime's own result.
	quick := &slowStop{stop: 10 * time.Millisecond, ended: make(chan struct{})}
	e = engine(quick)
	res, err = e.Run(t.Context(), job(2*time.Second))
	require.NoError(t, err)
	require.NotNil(t, res.Error)
	require.Equal(t, envelope.CodeTimeout, res.Error.Code)
	require.Contains(t, res.Error.Message, "and was killed")
	require.Equal(t, "stopped", string(res.Stderr))
	require.Len(t, e.slots, 1, "the slot is back")
	e.Close()

	// A program that ended before its timeout, with a slow cleanup: its
	// own result, never a TIMEOUT, however late.
	finished := &slowStop{stop: time.Second, finishes: true, ended: make(chan struct{})}
	e = engine(finished)
	res, err = e.Run(t.Context(), job(2*time.Second))
	require.NoError(t, err)
	require.Nil(t, res.Error, "a program that ended by itself is not a TIMEOUT: %+v", res.Error)
	require.JSONEq(t, `{"done":true}`, string(res.Output))
	e.Close()

	// A job stopped by a shutdown is interrupted (run again elsewhere), not
	// answered TIMEOUT, even when its stop passes the answer time.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stopped := &slowStop{stop: 1500 * time.Millisecond, onTimeout: cancel, ended: make(chan struct{})}
	e = engine(stopped)
	_, err = e.Run(ctx, job(2*time.Second))
	require.ErrorIs(t, err, errInterrupted)
	e.Close()
}

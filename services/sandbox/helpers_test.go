package sandbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// Test environment variables: the sandbox tests need root, bubblewrap and
// runsc (.ci/run installs them). In CI (CI=true) a missing piece fails the
// tests; elsewhere TOOLWIRE_SKIP_SANDBOX=1 skips them instead.
const (
	envCI          = "CI"
	envSkipSandbox = "TOOLWIRE_SKIP_SANDBOX"
)

// testLimits are small, so that the escape suite hits every limit quickly.
func testLimits() Limits {
	return Limits{
		MemoryBytes: 128 << 20, Processes: 32, CPUSeconds: 30, OpenFiles: 64,
		FileSizeBytes: 4 << 20, DiskBytes: 8 << 20, OutputBytes: 64 << 10, StderrBytes: 8 << 10,
	}
}

// needSandbox fails (in CI) or skips (with TOOLWIRE_SKIP_SANDBOX=1) a test
// that cannot get what it needs; why says what is missing.
func needSandbox(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(envCI) != "true" && os.Getenv(envSkipSandbox) == "1" {
		t.Skipf("sandbox tests skipped (%s=1): %s", envSkipSandbox, why)
	}
	t.Fatalf("%s\nthe sandbox tests need root, bubblewrap and runsc (Debian packages bubblewrap, runsc; .ci/run installs them); "+
		"outside CI, %s=1 skips them", why, envSkipSandbox)
}

// newTestEngine starts an engine with both runtimes working, or fails.
func newTestEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if os.Geteuid() != 0 {
		needSandbox(t, "not running as root")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = testLimits()
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 2
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := NewEngine(ctx, cfg, log)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	for _, rt := range []string{RuntimeGVisor, RuntimeBwrap} {
		if p := e.Problem(rt); p != nil {
			needSandbox(t, "runtime "+rt+" does not work: "+p.Error())
		}
	}
	if e.cgroups == nil {
		needSandbox(t, "no cgroups: "+e.cgErr.Error())
	}
	return e
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testJob builds a job for rt.
func testJob(rt, source, input string, timeout time.Duration) *events.SandboxJob {
	if input == "" {
		input = "null"
	}
	return &events.SandboxJob{
		RunID: "run-1", CallID: "abc123", Tool: "test@1.0.0", TenantID: "acme//",
		Language: events.SandboxPython, Source: source, Input: json.RawMessage(input),
		Stdout: events.SandboxStdoutJSON, Runtime: rt,
		TimeoutMS: int(timeout.Milliseconds()), Deadline: time.Now().Add(timeout + 30*time.Second),
	}
}

// run runs a job and fails the test when the engine itself fails.
func run(t testing.TB, e *Engine, job *events.SandboxJob) events.SandboxResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), job.Timeout()+time.Minute)
	defer cancel()
	res, err := e.Run(ctx, job)
	require.NoError(t, err)
	require.NoError(t, res.Validate(), "the engine's result must be a valid result")
	return res
}

// details returns the error's details as the sandbox sets them.
func details(t testing.TB, res events.SandboxResult) ErrorDetails {
	t.Helper()
	require.NotNil(t, res.Error, "want an error, got output %s", res.Output)
	d, ok := res.Error.Details.(ErrorDetails)
	require.True(t, ok, "details are %T", res.Error.Details)
	return d
}

// assertHostClean checks that nothing of any job is left on the host: no live
// process runs as a job uid, no job cgroup exists, runsc knows no container
// and no runsc process of this engine runs.
func assertHostClean(t testing.TB, e *Engine) {
	t.Helper()
	assertNoJobLeft(t, e)
	g, ok := e.runtimes[RuntimeGVisor].(*gvisorRuntime)
	require.True(t, ok)
	out, err := exec.Command(g.bin, "--root", g.root, "list", "--format=json").Output() //nolint:gosec // test
	require.NoError(t, err)
	require.Contains(t, []string{"null", "[]"}, strings.TrimSpace(string(out)), "runsc still lists containers")
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, en := range entries {
		if _, err := strconv.Atoi(en.Name()); err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + en.Name() + "/cmdline")
		st, _ := os.ReadFile("/proc/" + en.Name() + "/stat")
		if strings.Contains(string(cmd), g.root) && !strings.Contains(string(st), ") Z ") {
			t.Fatalf("runsc process %s of this engine is left: %q", en.Name(), strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	bundles, err := os.ReadDir(g.bundles)
	require.NoError(t, err)
	require.Empty(t, bundles, "gVisor bundles are left")
}

// assertNoJobLeft checks, in /proc and the cgroup trees, that no live
// process runs as a job uid and no job cgroup exists, whatever the runtime.
func assertNoJobLeft(t testing.TB, e *Engine) {
	t.Helper()
	require.NotEmpty(t, e.UIDs(), "jobs run as uids of their own (the tests run as root)")
	for _, uid := range e.UIDs() {
		require.Empty(t, processesOf(uid), "processes of job uid %d are left", uid)
	}
	if e.cgroups == nil {
		return
	}
	prefix := strconv.Itoa(os.Getpid()) + "-"
	for _, parent := range e.cgroups.parents {
		entries, err := os.ReadDir(parent)
		require.NoError(t, err)
		for _, en := range entries {
			require.False(t, en.IsDir() && strings.HasPrefix(en.Name(), prefix), "job cgroup %s is left", filepath.Join(parent, en.Name()))
		}
	}
}

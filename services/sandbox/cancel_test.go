package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// forkAndSleep starts three children, each in a session of its own (out of
// the job's process group), and sleeps: a job that only a kill of all its
// processes ends.
const forkAndSleep = `import os, time
for _ in range(3):
    if os.fork() == 0:
        os.setsid()
        time.sleep(600)
        os._exit(0)
time.sleep(600)
print(1)
`

// TestCancelKillsTheRunsJobs: a cancel request of a run kills its running
// job, every process of it (its children escaped the process group): the
// job is answered TIMEOUT with details.cancelled long before its 60 s
// timeout, and /proc holds no process of any job uid afterwards, nor the
// cgroups a job cgroup; a job of the run that comes after the cancel is
// answered without running. On gVisor and bwrap, the engines of the other
// sandbox tests (root, bubblewrap and runsc: CI has them), and on the
// insecure development runtime (root and python3 only), which runs where
// the others do not.
func TestCancelKillsTheRunsJobs(t *testing.T) {
	for _, c := range []struct {
		name    string
		runtime string // of the job
		cfg     func(t *testing.T) Config
		// running says that the job runs: for bwrap and the insecure
		// runtime, the job and its three children as host processes of
		// the job's uid; gVisor runs them inside its Sentry, as root, so
		// there the job's cgroup holds the runtime's processes.
		running func(e *Engine) bool
	}{
		{"gvisor", RuntimeGVisor, func(t *testing.T) Config { newTestEngine(t, Config{}); return Config{} }, inJobCgroups},
		{"bwrap", RuntimeBwrap, func(t *testing.T) Config { newTestEngine(t, Config{}); return Config{} }, ofJobUIDs(4)},
		{"insecure-dev", "", func(t *testing.T) Config {
			if os.Geteuid() != 0 {
				needSandbox(t, "not running as root")
			}
			// No runtime works (their binaries are missing): the insecure
			// setting runs the job on the host, as its own uid.
			return Config{InsecureDev: true, Bwrap: "/nonexistent/bwrap", Runsc: "/nonexistent/runsc"}
		}, ofJobUIDs(4)},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := eventstest.Start(t)
			cfg := c.cfg(t)
			cfg.ID, cfg.Limits = "sandbox-cancel", testLimits()
			s := startServiceOn(t, env, cfg, prometheus.NewRegistry())
			e := s.Engine()
			runID := "run-cancel-" + c.name

			job := serviceJob("c1", forkAndSleep)
			job.RunID, job.Runtime, job.TimeoutMS, job.Deadline = runID, c.runtime, 60_000, time.Now().Add(2*time.Minute)
			publishJob(t, env.JS, job)
			require.Eventually(t, func() bool { return c.running(e) }, time.Minute, 10*time.Millisecond, "the job runs")

			cancel, err := events.NewCancelRequested("/test", events.CancelRequest{
				RunID: runID, Reason: "changed my mind", By: "tester", Tenant: envelope.Tenant{OrgID: "acme", WorkspaceID: "ws"},
			}, events.RunTrace{})
			require.NoError(t, err)
			sent := time.Now()
			env.Publish(t, cancel)
			res, _ := awaitResult(t, env.JS, runID, "c1")
			took := time.Since(sent)
			t.Logf("%s: cancel to result %s", c.name, took)
			require.NoError(t, res.Validate())
			require.NotNil(t, res.Error)
			require.Equal(t, envelope.CodeTimeout, res.Error.Code)
			require.True(t, events.IsCancelledCall(res.Error), "details say cancelled: %+v", res.Error.Details)
			require.Contains(t, res.Error.Message, "stopped: the run was cancelled by tester: changed my mind")
			require.Less(t, took, 20*time.Second, "killed, not left to its 60 s timeout")
			assertNoJobLeft(t, e)
			if c.runtime != "" {
				assertHostClean(t, e)
			}
			require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.cancelled.WithLabelValues(cancelKilled)))

			// A job of the run that comes after the cancel is not run.
			late := serviceJob("c2", "print(1)")
			late.RunID, late.Runtime = runID, c.runtime
			publishJob(t, env.JS, late)
			res, _ = awaitResult(t, env.JS, runID, "c2")
			require.NoError(t, res.Validate())
			require.NotNil(t, res.Error)
			require.True(t, events.IsCancelledCall(res.Error))
			require.Contains(t, res.Error.Message, "not run: the run was cancelled")
			require.Empty(t, res.Runtime, "no runtime ran it")
			require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.cancelled.WithLabelValues(cancelRefused)))

			// Another run's job runs on.
			other := serviceJob("c3", "print(7)")
			other.Runtime = c.runtime
			publishJob(t, env.JS, other)
			res, _ = awaitResult(t, env.JS, other.RunID, "c3")
			require.Nil(t, res.Error, "stderr: %s", res.Stderr)
			require.JSONEq(t, `7`, string(res.Output))
		})
	}
}

// ofJobUIDs says that at least n live processes run as the job slots' uids.
func ofJobUIDs(n int) func(e *Engine) bool {
	return func(e *Engine) bool {
		found := 0
		for _, uid := range e.UIDs() {
			found += len(processesOf(uid))
		}
		return found >= n
	}
}

// inJobCgroups says that a job cgroup of this process holds a process.
func inJobCgroups(e *Engine) bool {
	if e.cgroups == nil {
		return false
	}
	prefix := strconv.Itoa(os.Getpid()) + "-"
	for _, parent := range e.cgroups.parents {
		entries, err := os.ReadDir(parent)
		if err != nil {
			continue
		}
		for _, en := range entries {
			if !en.IsDir() || !strings.HasPrefix(en.Name(), prefix) {
				continue
			}
			b, err := os.ReadFile(filepath.Join(parent, en.Name(), "cgroup.procs"))
			if err == nil && strings.TrimSpace(string(b)) != "" {
				return true
			}
		}
	}
	return false
}

package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/sandbox"
)

// TestMain fails the package when a test leaves a goroutine behind: Run must
// stop the service, its consumer and its connection.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// build is what main runs.
var build = service.Builder(sandbox.Build)

// TestRun runs the binary's wiring against an embedded server: a job is run
// in gVisor (the default where it works), and cancelling the context shuts
// the service down cleanly.
func TestRun(t *testing.T) {
	env := eventstest.Start(t)
	stop := servicetest.Run(t, "sandbox", ":8084", map[string]string{
		service.EnvNATSURL:     env.URL,
		service.EnvHTTPAddr:    "127.0.0.1:0",
		sandbox.EnvConcurrency: "2",
		sandbox.EnvStateDir:    t.TempDir(),
	}, build)

	job := events.SandboxJob{
		RunID: "run-main", CallID: "c0ffee", Tool: "t@1.0.0", TenantID: "acme//", Language: events.SandboxPython,
		Source: "print(6 * 7)", Input: json.RawMessage(`null`), Stdout: events.SandboxStdoutJSON,
		TimeoutMS: 20000, Deadline: time.Now().Add(time.Minute),
	}
	out, err := events.NewSandboxJob("/toolwire/test", job, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, out)

	subj, err := events.SandboxSubject(job.RunID, job.CallID, "completed")
	require.NoError(t, err)
	ev, _ := env.Next(t, events.StreamSandbox, 90*time.Second, subj)
	var got events.SandboxResult
	require.NoError(t, events.DecodeData(ev, &got))
	require.Nil(t, got.Error, "the sandbox tests need root, bubblewrap and runsc (.ci/run installs them)")
	require.JSONEq(t, `42`, string(got.Output))
	require.Equal(t, sandbox.RuntimeGVisor, got.Runtime)

	require.NoError(t, stop())
}

func TestBuildRejectsBadConfig(t *testing.T) {
	_, _, err := build(t.Context(), service.Deps{Getenv: servicetest.Getenv(map[string]string{sandbox.EnvRuntime: "docker"})})
	require.ErrorContains(t, err, sandbox.EnvRuntime+`="docker": want one of auto, gvisor, bwrap`)
}

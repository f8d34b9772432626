package worker_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/worker"
)

// envMainChild makes the test binary run Main as a worker program would.
const envMainChild = "TOOLWIRE_TEST_WORKER_MAIN"

// TestMainExitsOnError: Main prints what Run refuses on standard error and
// exits with status 1. (Its other path, SIGTERM and a clean exit, is the
// README's program in TestREADMEWorkerExample.)
func TestMainExitsOnError(t *testing.T) {
	if os.Getenv(envMainChild) == "1" {
		worker.New(worker.Config{}).Main() // no tools: Run refuses at once
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMainExitsOnError$")
	cmd.Env = append(os.Environ(), envMainChild+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 1, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "worker: no tools to serve\n")
	require.NotContains(t, string(out), "worker: worker:")
}

package e2e

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service/servicetest"
)

// buildBinaries builds pkgs into a temporary folder and returns it, as the
// images build them (Dockerfile: static, CGO_ENABLED=0, -trimpath): the
// tests run what ships, and the deploy module's check, which replays the
// Dockerfile's go build, finds the packages compiled in the build cache.
func buildBinaries(t *testing.T, pkgs ...string) string {
	t.Helper()
	bin := t.TempDir()
	build := exec.CommandContext(t.Context(), "go", append([]string{"build", "-trimpath", "-buildvcs=false", "-o", bin + string(os.PathSeparator)}, pkgs...)...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// buildServices builds the binaries of the five services.
func buildServices(t *testing.T) string {
	t.Helper()
	var pkgs []string
	for _, s := range services {
		pkgs = append(pkgs, "github.com/toolwire/toolwire/services/"+s+"/cmd/"+s)
	}
	return buildBinaries(t, pkgs...)
}

// proc is a service or worker binary running as its own process.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *servicetest.Output
	http string // its TOOLWIRE_HTTP_ADDR
}

// launch starts bin/prog as name, with an HTTP address of its own and env
// added to the test's environment; owner's end kills it. It does not wait
// for it to be ready (waitReady does).
func launch(t, owner *testing.T, bin, prog, name string, env ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &servicetest.Output{}, http: servicetest.FreeAddr(t)}
	p.cmd = exec.Command(filepath.Join(bin, prog))
	p.cmd.Env = append(append(os.Environ(), "TOOLWIRE_HTTP_ADDR="+p.http), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	owner.Cleanup(p.kill)
	return p
}

// waitReady waits until p's /readyz answers 200; a failure shows output,
// read then.
func (p *proc) waitReady(t *testing.T, output func() string) {
	t.Helper()
	if !assert.Eventually(t, func() bool { return p.answers("/readyz") }, 60*time.Second, 50*time.Millisecond) {
		t.Fatalf("%s never became ready\n%s", p.name, output())
	}
}

// answers says whether p's HTTP server answers a GET of path with 200.
func (p *proc) answers(path string) bool {
	resp, err := http.Get("http://" + p.http + path)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// kill ends the process with SIGKILL (kill -9): nothing it holds is handed
// back.
func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.exited(t)
}

// exited waits for the process to exit cleanly after a SIGTERM.
func (p *proc) exited(t *testing.T) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "%s did not exit cleanly\n%s", p.name, p.out.String())
	case <-time.After(40 * time.Second):
		t.Fatalf("%s did not stop after SIGTERM\n%s", p.name, p.out.String())
	}
}

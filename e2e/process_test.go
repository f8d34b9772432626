package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
)

var services = []string{"executor", "policy", "orchestrator", "sandbox", "recorder"}

// syncBuffer collects a process's output for the failure message.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestServicesAsProcesses builds the five service binaries, runs each as its
// own process against one NATS server, completes a run, and stops them with
// SIGTERM: each drains and exits 0.
func TestServicesAsProcesses(t *testing.T) {
	bin := t.TempDir()
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin+string(os.PathSeparator))
	for _, s := range services {
		build.Args = append(build.Args, "github.com/toolwire/toolwire/services/"+s+"/cmd/"+s)
	}
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	env := eventstest.Start(t)
	dsn := pgtest.Schema(t)
	type proc struct {
		name string
		cmd  *exec.Cmd
		out  *syncBuffer
		http string
	}
	var procs []*proc
	for _, s := range services {
		p := &proc{name: s, out: &syncBuffer{}, http: freeAddr(t)}
		p.cmd = exec.Command(filepath.Join(bin, s))
		p.cmd.Env = append(os.Environ(),
			"NATS_URL="+env.URL, "TOOLWIRE_HTTP_ADDR="+p.http, "TOOLWIRE_LOG_LEVEL=info", "DATABASE_URL="+dsn)
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		require.NoError(t, p.cmd.Start())
		procs = append(procs, p)
		t.Cleanup(func() {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		})
	}
	dump := func() string {
		var b bytes.Buffer
		for _, p := range procs {
			fmt.Fprintf(&b, "--- %s ---\n%s\n", p.name, p.out.String())
		}
		return b.String()
	}
	for _, p := range procs {
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + p.http + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, 60*time.Second, 50*time.Millisecond, "%s never became ready\n%s", p.name, dump())
	}

	c := client.New(env.JS, "/test")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	final, err := c.Run(ctx, demo.Request("processes-1"), 0)
	require.NoError(t, err, dump())
	require.Equal(t, events.StatusCompleted, final.Status)
	require.Equal(t, demo.Response, final.Outputs.Response)
	require.Len(t, final.Outputs.ToolOrder, 4)

	recorderAddr := procs[len(procs)-1].http
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + recorderAddr + "/v1/runs/processes-1/outputs")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond, "the recorder process never stored the run\n%s", dump())

	for _, p := range procs {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, p := range procs {
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err := <-done:
			require.NoError(t, err, "%s did not exit cleanly\n%s", p.name, p.out.String())
		case <-time.After(40 * time.Second):
			t.Fatalf("%s did not stop after SIGTERM\n%s", p.name, p.out.String())
		}
	}
}

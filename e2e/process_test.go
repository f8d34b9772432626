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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/embedded"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/pkg/service/identity"
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

	t.Run("anonymous", func(t *testing.T) {
		env := eventstest.Start(t)
		runAsProcesses(t, bin, env.URL, func(string) []string { return nil }, client.New(env.JS, "/test"), "processes-1")
	})
	// Every service on its own role's nkey, the client as a producer: the
	// run completes and no process hits a permission it lacks.
	t.Run("identities", func(t *testing.T) {
		keys, err := identity.LoadOrCreate(filepath.Join(t.TempDir(), "ids"))
		require.NoError(t, err)
		s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Users: keys.ServerUsers()})
		require.NoError(t, err)
		t.Cleanup(func() { embedded.Stop(s) })
		connect := func(r identity.Role) jetstream.JetStream {
			opts, err := identity.ConnectOptions(r, keys.SeedFile(r))
			require.NoError(t, err)
			nc, err := nats.Connect(s.ClientURL(), opts...)
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			return js
		}
		// As in production: the operator provisions, the services find it done.
		require.NoError(t, events.Provision(t.Context(), connect(identity.Operator), events.StoreConfig{Replicas: 1}))
		logs := runAsProcesses(t, bin, s.ClientURL(), func(name string) []string {
			return []string{service.EnvNATSSeedFile + "=" + keys.SeedFile(identity.Role(name))}
		}, client.New(connect(identity.Producer), "/test"), "processes-ids")
		for name, log := range logs {
			require.NotContains(t, log, "nats error", "%s hit a permission it lacks", name)
			require.NotContains(t, log, "Permissions Violation", name)
		}
	})
}

// runAsProcesses runs the five binaries against url, each with the
// environment envFor gives it besides the common one, completes a run
// through c, stops them with SIGTERM and returns each one's output.
func runAsProcesses(t *testing.T, bin, url string, envFor func(name string) []string, c *client.Client, runID string) map[string]string {
	t.Helper()
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
		p.cmd.Env = append(append(os.Environ(),
			"NATS_URL="+url, "TOOLWIRE_HTTP_ADDR="+p.http, "TOOLWIRE_LOG_LEVEL=info", "DATABASE_URL="+dsn), envFor(s)...)
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

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	final, err := c.Run(ctx, demo.Request(runID), 0)
	require.NoError(t, err, dump())
	require.Equal(t, events.StatusCompleted, final.Status)
	require.Equal(t, demo.Response, final.Outputs.Response)
	require.Len(t, final.Outputs.ToolOrder, 4)

	recorderAddr := procs[len(procs)-1].http
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + recorderAddr + "/v1/runs/" + runID + "/outputs")
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
	logs := map[string]string{}
	for _, p := range procs {
		logs[p.name] = p.out.String()
	}
	return logs
}

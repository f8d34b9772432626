package e2e

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
)

var services = []string{"executor", "policy", "orchestrator", "sandbox", "recorder"}

// TestServicesAsProcesses builds the five service binaries, runs each as its
// own process against one NATS server, completes a run, and stops them with
// SIGTERM: each drains and exits 0.
func TestServicesAsProcesses(t *testing.T) {
	bin := buildServices(t)

	t.Run("anonymous", func(t *testing.T) {
		env := eventstest.Start(t)
		runAsProcesses(t, bin, env.URL, func(string) []string { return nil }, client.New(env.JS, "/test"), "processes-1")
	})
	// Every service on its own role's nkey, the client as a producer: the
	// run completes and no process hits a permission it lacks.
	t.Run("identities", func(t *testing.T) {
		keys, err := identity.LoadOrCreate(filepath.Join(t.TempDir(), "ids"))
		require.NoError(t, err)
		s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Identities: keys})
		require.NoError(t, err)
		t.Cleanup(func() { embedded.Stop(s) })
		connect := func(r identity.Role) jetstream.JetStream {
			opts, err := identity.ConnectOptions(r, keys.SeedFile(r))
			require.NoError(t, err)
			nc, err := nats.Connect(s.ClientURL(), opts...)
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			js, err := direct.JetStream(t.Context(), nc)
			require.NoError(t, err)
			return js
		}
		// As in production: the operator provisions, the services find it done.
		require.NoError(t, provision.Provision(t.Context(), connect(identity.Operator), provision.StoreConfig{Replicas: 1}))
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
	var procs []*proc
	for _, s := range services {
		procs = append(procs, launch(t, t, bin, s, s,
			append([]string{"NATS_URL=" + url, "TOOLWIRE_LOG_LEVEL=info", "DATABASE_URL=" + dsn}, envFor(s)...)...))
	}
	dump := func() string {
		var b bytes.Buffer
		for _, p := range procs {
			fmt.Fprintf(&b, "--- %s ---\n%s\n", p.name, p.out.String())
		}
		return b.String()
	}
	for _, p := range procs {
		p.waitReady(t, dump)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	final, err := c.Run(ctx, demo.Request(runID), 0)
	require.NoError(t, err, dump())
	require.Equal(t, events.StatusCompleted, final.Status)
	require.Equal(t, demo.Response, final.Outputs.Response)
	require.Len(t, final.Outputs.ToolOrder, 4)

	recorder := procs[len(procs)-1]
	require.Eventually(t, func() bool { return recorder.answers("/v1/runs/" + runID + "/outputs") }, 20*time.Second, 50*time.Millisecond, "the recorder process never stored the run\n%s", dump())

	for _, p := range procs {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, p := range procs {
		p.exited(t)
	}
	logs := map[string]string{}
	for _, p := range procs {
		logs[p.name] = p.out.String()
	}
	return logs
}

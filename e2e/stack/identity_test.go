package stack_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/sandbox"
	"github.com/toolwire/toolwire/stack"
)

// natsErrors records the NATS errors the services log (a permissions
// violation among them).
type natsErrors struct {
	mu   sync.Mutex
	seen []string
}

func (n *natsErrors) Enabled(context.Context, slog.Level) bool { return true }
func (n *natsErrors) WithAttrs([]slog.Attr) slog.Handler       { return n }
func (n *natsErrors) WithGroup(string) slog.Handler            { return n }
func (n *natsErrors) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "nats error" {
		return nil
	}
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool { b.WriteString(a.String() + " "); return true })
	n.mu.Lock()
	n.seen = append(n.seen, b.String())
	n.mu.Unlock()
	return nil
}

func (n *natsErrors) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.seen...)
}

// TestRunWithIdentities: with every service on its own role's nkey, limited
// to its role's subjects, a run with a tool call, a sandbox-free pipeline and
// an approval (the guard's preview request to the executor, an operator's
// decision) completes and is recorded, and no service hits a permission it
// lacks. Anonymous clients are turned away.
func TestRunWithIdentities(t *testing.T) {
	dir := t.TempDir()
	errs := &natsErrors{}
	mail := &mailTool{}
	st, err := stack.Start(t.Context(), stack.Options{
		DataDir: dir, Identities: true, Logger: slog.New(errs),
		Recorder:        recorder.ForStack("sqlite:" + filepath.Join(dir, "recorder.db")),
		ExecutorOptions: []executor.Option{executor.WithTools(mail)},
	})
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = st.Stop(context.Background())
		}
	})

	// The seeds are credentials: a private folder, private files.
	fi, err := os.Stat(stack.IdentitiesDir(dir))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	for _, r := range identity.Roles() {
		fi, err := os.Stat(identity.SeedFile(stack.IdentitiesDir(dir), r))
		require.NoError(t, err, r)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), r)
	}

	final := runToEnd(t, st, demo.Request("ident-demo"))
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, demo.Response, final.Outputs.Response)

	res := followApprovals(t, st, approvalScript(t, "ident-approve", 60, mailTurn, map[string]any{"content": "done"}),
		func(int, events.ApprovalRequest) *events.Decision {
			return &events.Decision{Decision: events.DecisionApprove, By: "ops"}
		})
	require.Equal(t, events.StatusCompleted, res.final.Status, res.final.Reason)
	require.Len(t, res.requests, 1)
	require.NotNil(t, res.requests[0].Preview)
	require.Empty(t, res.requests[0].Preview.Unavailable, "the executor answered the guard's preview request")
	require.Equal(t, []string{"all@acme.example"}, mail.sentTo())

	// Nobody gets in without a key.
	_, err = nats.Connect(st.URL)
	require.ErrorIs(t, err, nats.ErrAuthorization)

	stopped = true
	require.NoError(t, st.Stop(context.Background()))
	require.Empty(t, errs.all(), "no service hit a permission it lacks, from start to stop")
}

// TestTenantProducerRun: a producer limited to the demo's org hands in the
// demo run on its intake and the run completes (the operator follows it: the
// tenant's credentials read nothing); its request published directly, or
// another org's request, is refused by the server.
func TestTenantProducerRun(t *testing.T) {
	dir := t.TempDir()
	keys, err := identity.LoadOrCreate(stack.IdentitiesDir(dir))
	require.NoError(t, err)
	tenant := identity.Tenant{Org: "demo-org"}
	require.NoError(t, keys.AddTenant(tenant))
	errs := &natsErrors{}
	st := startStack(t, stack.Options{DataDir: dir, Identities: true, Logger: slog.New(errs)})
	require.Equal(t, []identity.Tenant{tenant}, st.Identities.Tenants(), "the dev server lets in the folder's tenants")

	opts, err := identity.TenantConnectOptions(keys.TenantSeedFile(tenant))
	require.NoError(t, err)
	producer, refused := connectClient(t, st.URL, opts)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req := demo.Request("tenant-demo")
	require.NoError(t, producer.SubmitToIntake(ctx, req))
	final, err := st.Client.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, demo.Response, final.Outputs.Response)

	denied := func(what string, err error) {
		t.Helper()
		require.Error(t, err, what)
		select {
		case err := <-refused:
			require.ErrorIs(t, err, nats.ErrPermissionViolation, what)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no refusal from the server", what)
		}
	}
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	denied("a direct request", producer.Submit(short(), demo.Request("tenant-direct")))
	other := demo.Request("tenant-other")
	other.Tenant.OrgID = "other-org"
	denied("another org's intake", producer.SubmitToIntake(short(), other))
	_, err = producer.Follow(short(), req.RunID, nil)
	denied("following a run", err)
	require.Empty(t, errs.all(), "no service hit a permission it lacks")
}

// TestIdentitiesKeptAcrossRestarts: a second start on the same data folder
// reuses the seeds, so that the CLI's operator key stays valid.
func TestIdentitiesKeptAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Identities: true})
	require.NoError(t, err)
	first := st.Identities.Public(identity.Operator)
	require.NoError(t, st.Stop(context.Background()))

	st = startStack(t, stack.Options{DataDir: dir, Identities: true})
	require.Equal(t, first, st.Identities.Public(identity.Operator))
}

// TestSandboxDurableIsKept: the name the role table keeps the executor
// from deleting is the sandbox service's durable consumer.
func TestSandboxDurableIsKept(t *testing.T) {
	require.Equal(t, sandbox.Durable, identity.SandboxDurable)
}

func TestIdentitiesNeedTheEmbeddedServer(t *testing.T) {
	_, err := stack.Start(t.Context(), stack.Options{NATSURL: "nats://127.0.0.1:1", Identities: true})
	require.ErrorContains(t, err, "Identities provisions the embedded server")
}

// TestSandboxWithIdentities: a code tool crosses the executor and the
// sandbox service on their own keys (the job, its durable consumer, the
// result and the executor's result consumer), and neither hits a
// permission it lacks.
func TestSandboxWithIdentities(t *testing.T) {
	needSandboxRuntimes(t)
	errs := &natsErrors{}
	st, err := stack.Start(t.Context(), stack.Options{
		DataDir: t.TempDir(), Identities: true, Logger: slog.New(errs),
		Sandbox: &sandbox.Config{StateDir: t.TempDir(), Concurrency: 1},
	})
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = st.Stop(context.Background())
		}
	})
	sum := map[string]any{"code": "import json, sys\nprint(sum(json.load(sys.stdin)))", "input": []int{1, 2, 3, 36}}
	final := runToEnd(t, st, scripted(t, "ident-sandbox", []string{"python_exec@1.0.0"},
		map[string]any{"tool_calls": []any{call("python_exec", sum)}},
		map[string]any{"content": "the sum is 42"}))
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	py := final.Outputs.ToolsByID[final.Outputs.ToolOrder[0]]
	require.Nil(t, py.Error)
	require.JSONEq(t, `{"stdout":"42\n","stderr":""}`, string(py.Output))

	stopped = true
	require.NoError(t, st.Stop(context.Background()))
	require.Empty(t, errs.all(), "no service hit a permission it lacks, from start to stop")
}

// TestProducerFollowsItsRun: a producer (the role of an upstream system
// trusted with every tenant) submits the demo run and follows it with a
// callback: it sees the run's turns and every call's envelope within its
// permissions (batched direct gets in its own account: it may create no
// consumer), and the server refuses none of its requests.
func TestProducerFollowsItsRun(t *testing.T) {
	dir := t.TempDir()
	st := startStack(t, stack.Options{DataDir: dir, Identities: true})
	opts, err := identity.ConnectOptions(identity.Producer, st.Identities.SeedFile(identity.Producer))
	require.NoError(t, err)
	producer, refused := connectClient(t, st.URL, opts)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req := demo.Request("producer-follows")
	require.NoError(t, producer.Submit(ctx, req))
	var turns, envelopes int
	final, err := producer.Follow(ctx, req.RunID, func(e client.Event) bool {
		switch e.Event.Type() {
		case events.TypeTurnCompleted:
			turns++
		case events.TypeCallCompleted:
			envelopes++
		}
		return true
	})
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Positive(t, turns)
	require.Equal(t, len(final.Outputs.ToolOrder), envelopes, "every call's envelope reached the callback")
	select {
	case err := <-refused:
		t.Fatalf("the server refused a request of the producer: %v", err)
	default:
	}
}

// connectClient connects to url with opts as an upstream system's client; the
// channel receives each request the server refused.
func connectClient(t *testing.T, url string, opts []nats.Option) (*client.Client, chan error) {
	t.Helper()
	refused := make(chan error, 8)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err }))
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := direct.JetStream(t.Context(), nc)
	require.NoError(t, err)
	return client.New(js, "/acme/upstream"), refused
}

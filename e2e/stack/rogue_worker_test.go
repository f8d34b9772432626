package stack_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/stack"
	"github.com/toolwire/toolwire/worker"
)

// TestRogueWorker: a process holding a worker's real credentials (queue
// "billing") tries what a worker could do when it held the executor's
// identity, and is refused each time, by the server or by the executor:
// rewriting a registered version in the registry's KV, registering a tool on
// another queue, of another kind, or a changed version through the
// executor; consuming the default queue's calls or the executor's durable
// consumer; reading call inputs, sealed secrets or blobs; publishing a
// completion; purging the blob store; answering another queue's calls. The
// calls of its own queue still reach it, with its tool's secrets only.
func TestRogueWorker(t *testing.T) {
	dir := t.TempDir()
	keys, err := identity.LoadOrCreate(stack.IdentitiesDir(dir))
	require.NoError(t, err)
	billing := identity.Worker{Queues: []string{"billing"}}
	require.NoError(t, keys.AddWorker(billing))
	errs := &natsErrors{}
	st := startStack(t, stack.Options{DataDir: dir, Identities: true, Logger: slog.New(errs)})

	opts, err := identity.WorkerConnectOptions(st.Identities.WorkerSeedFile(billing))
	require.NoError(t, err)
	refused := make(chan error, 64)
	nc, err := nats.Connect(st.URL, append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err }))...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	ctx := t.Context()

	// A legitimate worker of the same identity serves billing's tool.
	invoice := worker.Func(worker.Def{Name: "invoice", Version: "1.0.0", Description: "Sends an invoice.",
		SideEffects: worker.SideEffectsNone, Queue: "billing"},
		func(ctx context.Context, in struct {
			N int `json:"n"`
		}) (struct {
			Sent bool `json:"sent"`
		}, error) {
			return struct {
				Sent bool `json:"sent"`
			}{true}, nil
		})
	w := worker.New(worker.Config{}, invoice)
	require.NoError(t, w.Start(ctx, jsOf(t, nc)))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	// Refused by the server: every JetStream subject, every event.
	api := []string{
		"$KV.toolwire_tools.echo.1.0.0",
		"$KV.toolwire_workers.default.x",
		"$JS.API.CONSUMER.MSG.NEXT." + events.StreamCalls + ".executor",
		"$JS.API.CONSUMER.MSG.NEXT." + events.StreamCalls + ".executor-billing",
		"$JS.API.CONSUMER.CREATE." + events.StreamCalls,
		"$JS.API.DIRECT.GET." + events.StreamCalls,
		"$JS.API.DIRECT.GET.KV_toolwire_secrets.$KV.toolwire_secrets.x",
		"$JS.API.STREAM.PURGE.OBJ_toolwire_blobs",
		"$JS.API.DIRECT.GET.OBJ_toolwire_blobs",
		"toolwire.call.r1.0123456789abcdef.completed",
		"toolwire.call.r1.0123456789abcdef.decided",
		"toolwire.run.r1.requested",
		"toolwire.rpc.worker.default.register",
		"toolwire.rpc.worker.other.register",
	}
	for _, subj := range api {
		require.NoError(t, nc.PublishRequest(subj, nc.NewRespInbox(), []byte(`{}`)))
		select {
		case err := <-refused:
			require.ErrorIs(t, err, nats.ErrPermissionViolation, subj)
			require.Contains(t, err.Error(), subj)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no refusal from the server", subj)
		}
	}
	for _, subj := range []string{"toolwire.worker.default.call", "toolwire.worker.*.call", "toolwire.call.>"} {
		_, err := nc.SubscribeSync(subj)
		require.NoError(t, err) // the refusal comes asynchronously
		select {
		case err := <-refused:
			require.ErrorIs(t, err, nats.ErrPermissionViolation, subj)
		case <-time.After(5 * time.Second):
			t.Fatalf("subscribe %s: no refusal from the server", subj)
		}
	}

	// Refused by the executor: tools it may not register, a changed version.
	ask := func(body any) events.WorkerReply {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		m, err := nc.Request("toolwire.rpc.worker.billing.register", b, 10*time.Second)
		require.NoError(t, err)
		var r events.WorkerReply
		require.NoError(t, json.Unmarshal(m.Data, &r))
		return r
	}
	def, err := invoice.Definition()
	require.NoError(t, err)
	other := def
	other.Name, other.Queue = "elsewhere", "payments"
	r := ask(events.WorkerRegistration{Tools: []envelope.ToolDefinition{other}})
	require.Equal(t, events.WorkerForbidden, r.Code, r.Error)
	web := def
	web.Name, web.Implementation = "fetcher", envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(`{"url":"https://example.com/x","method":"POST"}`)}
	r = ask(events.WorkerRegistration{Tools: []envelope.ToolDefinition{web}})
	require.Equal(t, events.WorkerForbidden, r.Code, r.Error)
	changed := def
	changed.Description = "Sends an invoice to the attacker."
	r = ask(events.WorkerRegistration{Tools: []envelope.ToolDefinition{changed}})
	require.Equal(t, events.WorkerConflict, r.Code, r.Error)
	reg, err := registry.Open(ctx, st.JS)
	require.NoError(t, err)
	e, err := reg.Get(ctx, def.Ref())
	require.NoError(t, err)
	require.Equal(t, "Sends an invoice.", e.Definition.Description, "the registered version is unchanged")
	_, err = reg.Get(ctx, envelope.ToolRef{Name: "elsewhere", Version: "1.0.0"})
	require.ErrorIs(t, err, registry.ErrNotFound)

	// Its own queue's calls still reach it, through the pipeline.
	req := orchestratortest.Scripted(t, "rogue-billing", []string{"invoice@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("invoice", map[string]any{"n": 1})}},
		map[string]any{"content": "done"})
	final := runToEnd(t, st, req)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	got := final.Outputs.ToolsByID[final.Outputs.ToolOrder[0]]
	require.Nil(t, got.Error, "%+v", got.Error)
	require.JSONEq(t, `{"sent":true}`, string(got.Output))
	require.Empty(t, errs.all(), "no service hit a permission it lacks")
}

// TestAdminAPIWithIdentities: with every service on its own identity, the
// recorder's admin API registers a tool (its NATS user writes the registry
// through registry.Registry, which refuses a changed version).
func TestAdminAPIWithIdentities(t *testing.T) {
	const token = "admin-token-0123456789abcdef0123456789"
	st := startStack(t, stack.Options{Identities: true, Recorder: recorder.ForStack(pgtest.Schema(t)),
		Getenv: func(k string) string {
			if k == recorder.EnvAdminToken {
				return token
			}
			return ""
		}})
	body := `{"name":"lookup","version":"1.0.0","description":"Looks a word up.","input_schema":{"type":"object"},` +
		`"output_schema":{"type":"object"},"metadata":{"category":"utility","side_effects":"none","cache":"none"},` +
		`"implementation":{"kind":"http","config":{"url":"https://example.com/lookup","method":"POST"}}}`
	post := func(b string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, st.HTTPURL+"/v1/admin/tools", strings.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	status, out := post(body)
	require.Equal(t, http.StatusCreated, status, out)
	status, out = post(strings.Replace(body, "Looks a word up.", "Looks a word up elsewhere.", 1))
	require.Equal(t, http.StatusConflict, status, out)
}

// jsOf is a JetStream handle on nc for its account (direct.JetStream).
func jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := direct.JetStream(t.Context(), nc)
	require.NoError(t, err)
	return js
}

package executor

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/builtin"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
)

// waitLimit bounds every wait of the tests; it is a safety net for a broken
// build, not a timing assertion.
const waitLimit = 30 * time.Second

const testSource = "/toolwire/test"

// testDeps returns the dependencies of an executor on its own connection.
func testDeps(t testing.TB, env *eventstest.Env, tp trace.TracerProvider) service.Deps {
	return service.Deps{
		JS:      env.JetStream(t),
		Log:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Tracer:  tp,
		Metrics: prometheus.NewRegistry(),
		Getenv:  func(string) string { return "" },
	}
}

// startExecutor starts an executor and stops it (draining) at cleanup.
func startExecutor(t testing.TB, env *eventstest.Env, cfg Config, opts ...Option) *Service {
	t.Helper()
	return startExecutorWith(t, testDeps(t, env, nil), cfg, opts...)
}

// startExecutorWith starts an executor of cfg with the standard families,
// the test tools (failing, sleep) and opts, on a start context that ends right after Start: every
// test shows that nothing the executor runs (the registry watch, the MCP
// sessions, the preview server, the consumer) hangs off its start-up
// context.
func startExecutorWith(t testing.TB, d service.Deps, cfg Config, opts ...Option) *Service {
	t.Helper()
	s := newExecutor(t, d, cfg, opts...)
	startStopping(t, s)
	return s
}

// startStopping starts s and stops it (draining) at cleanup.
func startStopping(t testing.TB, s *Service) {
	t.Helper()
	start(t, s)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, s.Stop(ctx))
	})
}

// start starts s on a start context that ends right after Start.
func start(t testing.TB, s *Service) {
	t.Helper()
	startCtx, endStart := context.WithCancel(t.Context())
	require.NoError(t, s.Start(startCtx))
	endStart()
}

// newExecutor builds an executor of cfg with the standard families, the
// test tools (failing, sleep) and opts.
func newExecutor(t testing.TB, d service.Deps, cfg Config, opts ...Option) *Service {
	t.Helper()
	s, err := New(d, cfg.With(append([]Option{withStandard(), WithTools(testtools.Tools()...)}, opts...)...))
	require.NoError(t, err)
	return s
}

// builtinDef is the definition of the built-in tool name.
func builtinDef(t testing.TB, name string) envelope.ToolDefinition {
	t.Helper()
	for _, tl := range builtin.Tools() {
		if def := tl.Definition(); def.Name == name {
			return def
		}
	}
	t.Fatalf("no built-in %s", name)
	return envelope.ToolDefinition{}
}

// callRequest builds an approved call of the default queue with its
// deterministic call id.
func callRequest(t testing.TB, runID string, seq int, name, version, input string) events.CallRequest {
	t.Helper()
	id, err := envelope.CallID(name, version, []byte(input), seq)
	require.NoError(t, err)
	return events.CallRequest{
		RunID: runID, CallID: id, Seq: seq, Iteration: 1,
		Name: name, Version: version, Input: json.RawMessage(input),
		Tenant: envelope.Tenant{OrgID: "acme", WorkspaceID: "ws"}, Agent: "tester",
		Queue: envelope.DefaultQueue,
	}
}

// approved is the approved event of req, routed to req.Queue as the Policy
// Guard routes it.
func approved(t testing.TB, req events.CallRequest, rt events.RunTrace) events.Outgoing {
	t.Helper()
	out, err := events.NewCallApproved(testSource, req, rt)
	require.NoError(t, err)
	return out
}

func publishApproved(t testing.TB, pub *publish.Publisher, req events.CallRequest) {
	t.Helper()
	require.NoError(t, pub.Publish(t.Context(), approved(t, req, events.RunTrace{})))
}

// publishAllApproved publishes the approved events of reqs together.
func publishAllApproved(t testing.TB, js jetstream.JetStream, reqs []events.CallRequest) {
	t.Helper()
	outs := make([]events.Outgoing, len(reqs))
	for i, req := range reqs {
		outs[i] = approved(t, req, events.RunTrace{})
	}
	require.NoError(t, publish.NewPublisher(js).PublishAll(t.Context(), outs))
}

// durableFilters maps each durable consumer of the calls stream to its
// filter subject.
func durableFilters(t testing.TB, js jetstream.JetStream) map[string]string {
	t.Helper()
	st, err := js.Stream(t.Context(), events.StreamCalls)
	require.NoError(t, err)
	filters := map[string]string{}
	infos := st.ListConsumers(t.Context())
	for ci := range infos.Info() {
		if ci.Config.Durable != "" {
			filters[ci.Config.Durable] = ci.Config.FilterSubject
		}
	}
	require.NoError(t, infos.Err())
	return filters
}

func completedSubject(t testing.TB, req events.CallRequest) string {
	t.Helper()
	s, err := events.CallSubject(req.RunID, req.CallID, "completed")
	require.NoError(t, err)
	return s
}

// watcher collects the call events of one run from the stream through an
// ordered consumer, keyed by subject.
type watcher struct {
	mu      sync.Mutex
	events  map[string][]*event.Event
	arrived chan struct{} // closed and replaced at each arrival
	errs    []error
}

func watchRun(t testing.TB, js jetstream.JetStream, runID string) *watcher {
	t.Helper()
	filter, err := events.CallEvents(runID)
	require.NoError(t, err)
	cons, err := js.OrderedConsumer(t.Context(), events.StreamCalls, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	require.NoError(t, err)
	w := &watcher{events: map[string][]*event.Event{}, arrived: make(chan struct{})}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		w.mu.Lock()
		defer w.mu.Unlock()
		if err != nil {
			w.errs = append(w.errs, err)
		} else {
			w.events[m.Subject()] = append(w.events[m.Subject()], ev)
		}
		close(w.arrived)
		w.arrived = make(chan struct{})
	})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	return w
}

// wait returns the first event on subject, waiting for it.
func (w *watcher) wait(t testing.TB, subject string) *event.Event {
	t.Helper()
	limit := time.NewTimer(waitLimit)
	defer limit.Stop()
	for {
		w.mu.Lock()
		require.Empty(t, w.errs, "undecodable events")
		if evs := w.events[subject]; len(evs) > 0 {
			w.mu.Unlock()
			return evs[0]
		}
		arrived := w.arrived
		w.mu.Unlock()
		select {
		case <-arrived:
		case <-limit.C:
			t.Fatalf("no event on %s within %s", subject, waitLimit)
		case <-t.Context().Done():
			t.Fatalf("test ended waiting for %s", subject)
		}
	}
}

// envelopeOf waits for the call's completed event and returns its envelope,
// after checking the event against the contract schemas.
func (w *watcher) envelopeOf(t testing.TB, schemas *envelope.Schemas, req events.CallRequest) envelope.ToolEnvelope {
	t.Helper()
	ev := w.wait(t, completedSubject(t, req))
	require.Equal(t, events.TypeCallCompleted, ev.Type())
	require.Equal(t, envelope.SchemaURL(envelope.SchemaToolEnvelope), ev.DataSchema())
	require.NoError(t, schemas.Validate(envelope.SchemaToolEnvelope, ev.Data()), "completed data is a valid ToolEnvelope")
	var env envelope.ToolEnvelope
	require.NoError(t, events.DecodeData(ev, &env))
	return env
}

// count is the number of messages the stream holds on subject.
func count(t testing.TB, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	st, err := js.Stream(t.Context(), events.StreamCalls)
	require.NoError(t, err)
	info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	return info.State.Subjects[subject]
}

// streamSeq is the stream sequence of the last message on subject.
func streamSeq(t testing.TB, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	st, err := js.Stream(t.Context(), events.StreamCalls)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(t.Context(), subject)
	require.NoError(t, err)
	return m.Sequence
}

// testTool is an in-process tool for the tests, with a permissive input
// schema and an output schema requiring {"ok": boolean}.
type testTool struct {
	def envelope.ToolDefinition
	run func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)
}

func newTestTool(name string, run func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)) testTool {
	return testTool{
		def: envelope.ToolDefinition{
			Name: name, Version: "1.0.0", Description: "test tool " + name,
			InputSchema:    json.RawMessage(`{"type":"object"}`),
			OutputSchema:   json.RawMessage(`{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`),
			Metadata:       envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone},
			Implementation: toolapi.BuiltinImplementation("test_" + name),
		},
		run: run,
	}
}

func (tt testTool) Definition() envelope.ToolDefinition { return tt.def }

func (tt testTool) Execute(ctx context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	return tt.run(ctx, input)
}

// putEntry puts a registry entry: a copy of def under another version, with
// changes.
func putEntry(t testing.TB, reg *registry.Registry, def envelope.ToolDefinition, state registry.State, change func(*envelope.ToolDefinition)) envelope.ToolDefinition {
	t.Helper()
	if change != nil {
		change(&def)
	}
	require.NoError(t, reg.Put(t.Context(), registry.Entry{Definition: def, State: state}))
	return def
}

func problemsOf(t testing.TB, te *envelope.ToolError) string {
	t.Helper()
	require.NotNil(t, te.Details, "details")
	list, ok := te.Details.([]any)
	require.True(t, ok, "details is a list, got %T", te.Details)
	var b strings.Builder
	for _, p := range list {
		s, ok := p.(string)
		require.True(t, ok, "each problem is a string")
		b.WriteString(s + "\n")
	}
	return b.String()
}

// newEventSchemas compiles the contract and event data schemas.
func newEventSchemas(t testing.TB) *envelope.Schemas {
	t.Helper()
	s, err := events.NewSchemas()
	require.NoError(t, err)
	return s
}

// openRegistry opens the tool registry on js.
func openRegistry(t testing.TB, js jetstream.JetStream) *registry.Registry {
	t.Helper()
	reg, err := registry.Open(t.Context(), js)
	require.NoError(t, err)
	return reg
}

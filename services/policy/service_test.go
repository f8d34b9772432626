package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

const waitFor = 10 * time.Second

// A run trace as the orchestrator would carry it in every event of a run.
var runTrace = events.RunTrace{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

var tenant = envelope.Tenant{OrgID: "acme", WorkspaceID: "ws", UserID: "u1"}

type harness struct {
	t       *testing.T
	env     *eventstest.Env
	pub     *events.Publisher
	reg     *registry.Registry
	svc     *Service
	spans   *tracetest.SpanRecorder
	metrics *prometheus.Registry
	schemas *envelope.Schemas
}

// newHarness starts a JetStream, registers the test tools and starts the
// service on it.
func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessConfig(t, Config{Concurrency: 4})
}

// newHarnessConfig is newHarness with a service configuration.
func newHarnessConfig(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, env: eventstest.Start(t), spans: tracetest.NewSpanRecorder(), metrics: prometheus.NewRegistry()}
	ctx := t.Context()
	h.pub = events.NewPublisher(h.env.JetStream(t))
	var err error
	h.reg, err = registry.Open(ctx, h.env.JS)
	require.NoError(t, err)
	for _, e := range []registry.Entry{
		{Definition: toolDef("web_search", "1.0.0")},
		{Definition: toolDef("calc", "2.1.0")},
		{Definition: toolDef("old_search", "0.9.0"), State: registry.StateDeprecated},
		{Definition: toolDef("rm_rf", "1.0.0"), State: registry.StateBlocked},
	} {
		require.NoError(t, h.reg.Put(ctx, e))
	}
	h.schemas = testSchemas(t)

	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h.svc, err = New(service.Deps{
		JS:      h.env.JetStream(t),
		Log:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Tracer:  tp,
		Metrics: h.metrics,
	}, cfg)
	require.NoError(t, err)
	// Every test runs on a service whose start context ended right after
	// Start: the watches (registry, approvals), the sweep and the consumers
	// hang off the service's lifetime, never off the start-up context.
	startCtx, endStart := context.WithCancel(ctx)
	require.NoError(t, h.svc.Start(startCtx))
	endStart()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		require.NoError(t, h.svc.Stop(sctx))
	})
	return h
}

func toolDef(name, version string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: name, Version: version,
		InputSchema:    json.RawMessage(`{"type":"object"}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone},
		Implementation: envelope.Implementation{Kind: envelope.ImplBuiltin},
	}
}

// testSchemas compiles the contract and event data schemas.
func testSchemas(t *testing.T) *envelope.Schemas {
	t.Helper()
	s, err := events.NewSchemas()
	require.NoError(t, err)
	return s
}

// callRequest is a call of the run as the orchestrator would request it.
func callRequest(t *testing.T, runID, name, version string, seq int, enabled []string, p envelope.Policy) events.CallRequest {
	t.Helper()
	input := json.RawMessage(fmt.Sprintf(`{"query": "q%d", "limit": 3}`, seq))
	id, err := envelope.CallID(name, version, input, seq)
	require.NoError(t, err)
	return events.CallRequest{
		RunID: runID, CallID: id, Seq: seq, Iteration: 1, Name: name, Version: version, Input: input,
		ProviderCallID: fmt.Sprintf("toolu_%d", seq), Tenant: tenant, Agent: "researcher",
		EnabledTools: enabled, Policy: p,
	}
}

func (h *harness) publish(out events.Outgoing, err error) {
	h.t.Helper()
	require.NoError(h.t, err)
	require.NoError(h.t, h.pub.Publish(h.t.Context(), out))
}

func (h *harness) requestCall(req events.CallRequest) {
	h.t.Helper()
	h.publish(events.NewCallRequest("/toolwire/orchestrator", "requested", req, runTrace))
}

// watch returns an ordered consumer of the subjects matching the filters.
func (h *harness) watch(stream string, filters ...string) jetstream.Consumer {
	h.t.Helper()
	c, err := h.env.JS.OrderedConsumer(h.t.Context(), stream, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	require.NoError(h.t, err)
	return c
}

// next waits for the consumer's next message.
func (h *harness) next(c jetstream.Consumer) jetstream.Msg {
	h.t.Helper()
	m, err := c.Next(jetstream.FetchMaxWait(waitFor))
	require.NoError(h.t, err, "no event within %s", waitFor)
	return m
}

// nextEvent waits for the consumer's next event and decodes it.
func (h *harness) nextEvent(c jetstream.Consumer) *event.Event {
	h.t.Helper()
	m := h.next(c)
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	require.NoError(h.t, err)
	require.Equal(h.t, DefaultSource, ev.Source())
	require.Equal(h.t, runTrace, events.TraceOf(ev), "the run trace travels on")
	return ev
}

// count is how many messages of stream match filter.
func (h *harness) count(stream, filter string) uint64 {
	h.t.Helper()
	s, err := h.env.JS.Stream(h.t.Context(), stream)
	require.NoError(h.t, err)
	info, err := s.Info(h.t.Context(), jetstream.WithSubjectFilter(filter))
	require.NoError(h.t, err)
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

func decode[T any](t *testing.T, ev *event.Event) T {
	t.Helper()
	var v T
	require.NoError(t, events.DecodeData(ev, &v))
	return v
}

func TestServiceIterationVerdicts(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name      string
		runID     string
		iteration int
		policy    envelope.Policy
		want      events.Verdict
	}{
		{name: "approved", runID: "run-it-1", iteration: 1,
			want: events.Verdict{RunID: "run-it-1", Iteration: 1, Allowed: true}},
		{name: "last under the cap", runID: "run-it-2", iteration: 10,
			want: events.Verdict{RunID: "run-it-2", Iteration: 10, Allowed: true}},
		{name: "past the default cap", runID: "run-it-3", iteration: 11,
			want: events.Verdict{RunID: "run-it-3", Iteration: 11, Code: envelope.CodePolicyDenied,
				Reason: "max_iterations (10) reached: iteration 11 not allowed"}},
		{name: "past a custom cap", runID: "run-it-4", iteration: 3, policy: envelope.Policy{MaxIterations: 2},
			want: events.Verdict{RunID: "run-it-4", Iteration: 3, Code: envelope.CodePolicyDenied,
				Reason: "max_iterations (2) reached: iteration 3 not allowed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "toolwire.run." + tt.runID + ".iteration.*."
			verdicts := h.watch(events.StreamRuns, prefix+"approved", prefix+"denied")
			check := events.IterationCheck{RunID: tt.runID, Iteration: tt.iteration, Tenant: tenant,
				Agent: "researcher", Policy: tt.policy, ToolCalls: 4}
			h.publish(events.NewIterationRequested("/toolwire/orchestrator", check, runTrace))

			ev := h.nextEvent(verdicts)
			verb, typ := "approved", events.TypeIterationApproved
			if !tt.want.Allowed {
				verb, typ = "denied", events.TypeIterationDenied
			}
			require.Equal(t, typ, ev.Type())
			require.Equal(t, fmt.Sprintf("%s/iteration/%d/verdict", tt.runID, tt.iteration), ev.ID())
			require.Equal(t, tenant.ID(), events.Ext(ev, events.ExtTenantID))
			require.Equal(t, uint64(1), h.count(events.StreamRuns, fmt.Sprintf("toolwire.run.%s.iteration.%d.%s", tt.runID, tt.iteration, verb)))
			require.Equal(t, tt.want, decode[events.Verdict](t, ev))
			require.NoError(t, h.schemas.Validate(events.SchemaVerdict, ev.Data()))
		})
	}

	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindIteration, "approved")) == 2 &&
			testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindIteration, "denied")) == 2
	}, waitFor, 10*time.Millisecond)
	require.Equal(t, 2.0, testutil.ToFloat64(h.svc.metrics.denials.WithLabelValues(kindIteration, RuleMaxIterations)))

	span := h.waitSpan(SpanCheckIteration, "run-it-3")
	require.Equal(t, runTrace.TraceID(), span.SpanContext().TraceID().String(), "the check joins the run's trace")
	requireAttrs(t, span, map[attribute.Key]attribute.Value{
		AttrIteration: attribute.IntValue(11),
		AttrAllowed:   attribute.BoolValue(false),
		AttrReason:    attribute.StringValue("max_iterations (10) reached: iteration 11 not allowed"),
		AttrRule:      attribute.StringValue(RuleMaxIterations),
	})
}

func TestServiceCallVerdicts(t *testing.T) {
	h := newHarness(t)
	enabled := []string{"web_search@1.0.0", "calc@2.1.0", "old_search@0.9.0", "rm_rf@1.0.0", "ghost@1.0.0"}
	tests := []struct {
		name    string
		tool    string
		version string
		seq     int
		policy  envelope.Policy
		reason  string // "" when approved
	}{
		{name: "enabled and active", tool: "web_search", version: "1.0.0", seq: 1},
		{name: "deprecated runs", tool: "old_search", version: "0.9.0", seq: 2},
		{name: "not enabled", tool: "send_email", seq: 3,
			reason: "tool send_email is not enabled for this agent (enabled: web_search@1.0.0, calc@2.1.0, old_search@0.9.0, rm_rf@1.0.0, ghost@1.0.0)"},
		{name: "blocked", tool: "rm_rf", version: "1.0.0", seq: 4, reason: "tool rm_rf@1.0.0 is blocked"},
		{name: "unknown version", tool: "ghost", version: "1.0.0", seq: 5,
			reason: "unknown tool ghost@1.0.0: it is not in the tool registry"},
		{name: "past the cap", tool: "calc", version: "2.1.0", seq: 6, policy: envelope.Policy{MaxToolCalls: 5},
			reason: "max_tool_calls (5) reached: call #6 not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runID := fmt.Sprintf("run-call-%d", tt.seq)
			req := callRequest(t, runID, tt.tool, tt.version, tt.seq, enabled, tt.policy)
			verdicts := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved")
			completions := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
			before := time.Now().UTC()
			h.requestCall(req)

			if tt.reason == "" {
				ev := h.nextEvent(verdicts)
				require.Equal(t, events.TypeCallApproved, ev.Type())
				require.Equal(t, runID+"/"+req.CallID+"/approved", ev.ID())
				require.Equal(t, req.CallID, events.Ext(ev, events.ExtCallID))
				var sent events.CallRequest // the request as it was on the wire
				require.NoError(t, json.Unmarshal(mustJSON(t, req), &sent))
				require.Equal(t, sent, decode[events.CallRequest](t, ev), "the approved request is the request")
				require.NoError(t, h.schemas.Validate(events.SchemaCallRequest, ev.Data()))
				require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.completed"))
				return
			}
			ev := h.nextEvent(completions)
			require.Equal(t, events.TypeCallCompleted, ev.Type())
			require.Equal(t, runID+"/"+req.CallID+"/completed", ev.ID())
			require.Equal(t, tenant.ID(), events.Ext(ev, events.ExtTenantID))
			require.NoError(t, h.schemas.Validate(envelope.SchemaToolEnvelope, ev.Data()))
			env := decode[envelope.ToolEnvelope](t, ev)
			require.Equal(t, req.CallID, env.CallID)
			require.Equal(t, tt.tool, env.Name)
			require.Equal(t, tt.version, env.Version)
			require.JSONEq(t, string(req.Input), string(env.Input))
			require.Nil(t, env.Output)
			require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: tt.reason}, env.Error)
			require.Equal(t, env.TStart, env.TEnd)
			require.WithinRange(t, env.TStart, before.Add(-time.Second), time.Now().Add(time.Second))
			require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved"))
		})
	}

	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindCall, "approved")) == 2 &&
			testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindCall, "denied")) == 4
	}, waitFor, 10*time.Millisecond)
	for rule, n := range map[string]float64{RuleEnabledTools: 1, RuleLifecycle: 1, RuleRegistered: 1, RuleMaxToolCalls: 1} {
		require.Equal(t, n, testutil.ToFloat64(h.svc.metrics.denials.WithLabelValues(kindCall, rule)), rule)
	}
	n, err := testutil.GatherAndCount(h.metrics, "toolwire_policy_verdicts_total")
	require.NoError(t, err)
	require.Equal(t, 4, n, "kind x outcome series are exported")

	span := h.waitSpan(SpanCheckToolCall, "run-call-4")
	require.Equal(t, runTrace.TraceID(), span.SpanContext().TraceID().String())
	requireAttrs(t, span, map[attribute.Key]attribute.Value{
		AttrToolName:    attribute.StringValue("rm_rf"),
		AttrToolVersion: attribute.StringValue("1.0.0"),
		AttrCallSeq:     attribute.IntValue(4),
		AttrAllowed:     attribute.BoolValue(false),
		AttrReason:      attribute.StringValue("tool rm_rf@1.0.0 is blocked"),
		AttrRule:        attribute.StringValue(RuleLifecycle),
	})
	span = h.waitSpan(SpanCheckToolCall, "run-call-2")
	requireAttrs(t, span, map[attribute.Key]attribute.Value{AttrAllowed: attribute.BoolValue(true)})
	require.Len(t, span.Events(), 1, "the deprecation warning is on the span")
}

// A turn of 10 parallel calls with 3 left under the cap of 25: calls #23 to
// #25 are approved, #26 to #32 are refused, whatever order they arrive in.
func TestServiceFanOutCrossingTheCap(t *testing.T) {
	h := newHarness(t)
	const runID = "run-fanout"
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")

	outs := make([]events.Outgoing, 0, 10)
	bySeq := map[string]int{}
	for seq := 23; seq <= 32; seq++ {
		req := callRequest(t, runID, "web_search", "1.0.0", seq, []string{"web_search@1.0.0"}, envelope.Policy{MaxToolCalls: 25})
		out, err := events.NewCallRequest("/toolwire/orchestrator", "requested", req, runTrace)
		require.NoError(t, err)
		outs = append(outs, out)
		bySeq[req.CallID] = seq
	}
	require.NoError(t, h.pub.PublishAll(t.Context(), outs))

	var gotApproved, gotDenied []int
	for range 3 {
		req := decode[events.CallRequest](t, h.nextEvent(approved))
		gotApproved = append(gotApproved, req.Seq)
	}
	for range 7 {
		env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
		seq := bySeq[env.CallID]
		require.Equal(t, fmt.Sprintf("max_tool_calls (25) reached: call #%d not allowed", seq), env.Error.Message)
		require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
		gotDenied = append(gotDenied, seq)
	}
	require.ElementsMatch(t, []int{23, 24, 25}, gotApproved)
	require.ElementsMatch(t, []int{26, 27, 28, 29, 30, 31, 32}, gotDenied)
	// One verdict per call, none twice.
	require.Equal(t, uint64(3), h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved"))
	require.Equal(t, uint64(7), h.count(events.StreamCalls, "toolwire.call."+runID+".*.completed"))
}

// Blocking a version in the registry takes effect on the running service: it
// watches the registry.
func TestServiceSeesRegistryChanges(t *testing.T) {
	h := newHarness(t)
	const runID = "run-block"
	enabled := []string{"calc@2.1.0"}
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")

	h.requestCall(callRequest(t, runID, "calc", "2.1.0", 1, enabled, envelope.Policy{}))
	require.Equal(t, 1, decode[events.CallRequest](t, h.nextEvent(approved)).Seq)

	ref := envelope.ToolRef{Name: "calc", Version: "2.1.0"}
	require.NoError(t, h.reg.SetState(t.Context(), ref, registry.StateBlocked))
	require.Eventually(t, func() bool {
		e, ok := h.svc.catalog.Lookup(ref)
		return ok && e.State == registry.StateBlocked
	}, waitFor, 5*time.Millisecond)

	h.requestCall(callRequest(t, runID, "calc", "2.1.0", 2, enabled, envelope.Policy{}))
	env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
	require.Equal(t, "tool calc@2.1.0 is blocked", env.Error.Message)
}

// Requests that cannot be read are dead-lettered at once, with the reason, and
// the service goes on.
func TestServiceDeadLettersMalformedRequests(t *testing.T) {
	h := newHarness(t)
	const runID = "run-dlq"
	dlq := h.watch(events.StreamDLQ, events.DLQSubject(events.StreamCalls, DurableCalls))

	good := callRequest(t, runID, "web_search", "1.0.0", 1, []string{"web_search@1.0.0"}, envelope.Policy{})
	mismatched := good
	mismatched.RunID = "another-run"

	tests := []struct {
		name   string
		callID string
		data   []byte
		err    string
	}{
		{name: "unknown field", callID: "aa01",
			data: []byte(`{"run_id": "run-dlq", "call_id": "aa01", "tool": "web_search"}`),
			err:  `call request: invalid event: dev.toolwire.call.requested.v1 data: json: unknown field "tool"`},
		{name: "not JSON", callID: "aa02", data: []byte(`{"run_id": `),
			err: "call request: invalid event: dev.toolwire.call.requested.v1 data: unexpected EOF"},
		{name: "data names another run", callID: good.CallID, data: mustJSON(t, mismatched),
			err: fmt.Sprintf(`call request: subject toolwire.call.run-dlq.%s.requested does not match the data (run_id "another-run", call_id %q, iteration 0)`, good.CallID, good.CallID)},
	}
	want := map[string]string{}
	for _, tt := range tests {
		subj, err := events.CallSubject(runID, tt.callID, "requested")
		require.NoError(t, err)
		out, err := events.Build(events.TypeCallRequested, runID+"/"+tt.callID+"/requested/"+tt.name, subj,
			events.Attrs{Source: "/test", RunID: runID, CallID: tt.callID}, map[string]any{})
		require.NoError(t, err)
		require.NoError(t, out.Event.SetData(event.ApplicationJSON, tt.data))
		require.NoError(t, h.pub.Publish(t.Context(), out))
		want[subj] = tt.err
	}

	got := map[string]string{}
	for range tests {
		m := h.next(dlq)
		require.Equal(t, "1", m.Headers().Get(events.HeaderDLQDeliveries), "a permanent failure is not retried")
		require.Equal(t, events.StreamCalls, m.Headers().Get(events.HeaderDLQStream))
		require.Equal(t, DurableCalls, m.Headers().Get(events.HeaderDLQConsumer))
		got[m.Headers().Get(events.HeaderDLQSubject)] = m.Headers().Get(events.HeaderDLQError)
	}
	require.Equal(t, want, got)

	// The consumer goes on.
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved")
	good.Seq, good.CallID = 2, "bb02"
	h.requestCall(good)
	require.Equal(t, "bb02", decode[events.CallRequest](t, h.nextEvent(approved)).CallID)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestServiceLifecycle(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	newSvc := func() *Service {
		s, err := New(service.Deps{JS: env.JS}, Config{})
		require.NoError(t, err)
		return s
	}

	s := newSvc()
	require.NoError(t, s.Start(ctx))
	require.ErrorIs(t, s.Start(ctx), service.ErrAlreadyStarted)
	require.NoError(t, s.Stop(ctx))
	require.NoError(t, s.Stop(ctx), "Stop is idempotent")
	require.ErrorIs(t, s.Start(ctx), service.ErrStopped)

	s = newSvc()
	require.NoError(t, s.Stop(ctx), "Stop before Start")
	require.ErrorIs(t, s.Start(ctx), service.ErrStopped)

	// Two replicas share the durable consumers.
	a, b := newSvc(), newSvc()
	require.NoError(t, a.Start(ctx))
	require.NoError(t, b.Start(ctx))
	require.NoError(t, a.Stop(ctx))
	require.NoError(t, b.Stop(ctx))
}

func TestNew(t *testing.T) {
	env := eventstest.Start(t)
	_, err := New(service.Deps{}, Config{})
	require.EqualError(t, err, "policy: Deps.JS is required")
	_, err = New(service.Deps{JS: env.JS}, Config{Concurrency: -1})
	require.EqualError(t, err, "policy: concurrency -1: want 1 to 4096")

	// Replicas on one registry share their collectors; a different
	// collector under one of the guard's names is refused.
	reg := prometheus.NewRegistry()
	_, err = New(service.Deps{JS: env.JS, Metrics: reg}, Config{})
	require.NoError(t, err)
	_, err = New(service.Deps{JS: env.JS, Metrics: reg}, Config{})
	require.NoError(t, err)
	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "toolwire_policy_verdicts_total", Help: "not the guard's"}))
	_, err = New(service.Deps{JS: env.JS, Metrics: clash}, Config{})
	require.ErrorContains(t, err, "policy: register metric")

	s, err := Build(service.Deps{JS: env.JS, Getenv: env2(EnvConcurrency, "3")})
	require.NoError(t, err)
	require.Equal(t, 3, s.Config().Concurrency)
	s, err = Build(service.Deps{JS: env.JS}, func(c *Config) { c.Concurrency = 5 })
	require.NoError(t, err)
	require.Equal(t, 5, s.Config().Concurrency, "an option overrides the environment")
	_, err = Build(service.Deps{JS: env.JS, Getenv: env2(EnvConcurrency, "x")})
	require.ErrorContains(t, err, "policy configuration: TOOLWIRE_POLICY_CONCURRENCY")
}

func env2(k, v string) func(string) string {
	return func(key string) string {
		if key == k {
			return v
		}
		return ""
	}
}

// waitSpan waits until the span named name of the run has ended.
func (h *harness) waitSpan(name, runID string) sdktrace.ReadOnlySpan {
	h.t.Helper()
	var found sdktrace.ReadOnlySpan
	require.Eventually(h.t, func() bool {
		for _, s := range h.spans.Ended() {
			if s.Name() != name {
				continue
			}
			for _, a := range s.Attributes() {
				if a.Key == AttrRunID && a.Value.AsString() == runID {
					found = s
					return true
				}
			}
		}
		return false
	}, waitFor, 5*time.Millisecond, "span %s of %s", name, runID)
	return found
}

func requireAttrs(t *testing.T, span sdktrace.ReadOnlySpan, want map[attribute.Key]attribute.Value) {
	t.Helper()
	got := map[attribute.Key]attribute.Value{}
	for _, a := range span.Attributes() {
		got[a.Key] = a.Value
	}
	for k, v := range want {
		require.Equal(t, v, got[k], "attribute %s", k)
	}
}

// The binary's wiring: service.Run with Build provisions, starts both
// consumers, reports ready and shuts down cleanly when its context ends.
func TestRunBinary(t *testing.T) {
	env := eventstest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	getenv := func(k string) string {
		return map[string]string{
			service.EnvNATSURL: env.URL, service.EnvHTTPAddr: addr, EnvConcurrency: "2",
			service.EnvLogLevel: "warn",
		}[k]
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, "policy", ":8082", getenv, service.Builder(Build)) }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	require.Eventually(t, func() bool {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/readyz", nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, waitFor, 10*time.Millisecond, "policy never became ready")
	for _, c := range []struct{ stream, durable string }{
		{events.StreamRuns, DurableIterations}, {events.StreamCalls, DurableCalls},
	} {
		_, err := env.JS.Consumer(t.Context(), c.stream, c.durable)
		require.NoError(t, err, "consumer %s", c.durable)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("service.Run did not return after its context ended")
	}
}

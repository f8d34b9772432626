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

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
)

const waitFor = 10 * time.Second

// A run trace as the orchestrator would carry it in every event of a run.
var runTrace = events.RunTrace{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

var tenant = envelope.Tenant{OrgID: "acme", WorkspaceID: "ws", UserID: "u1"}

type harness struct {
	t       *testing.T
	env     *eventstest.Env
	pub     *publish.Publisher
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
	h.pub = publish.NewPublisher(h.env.JetStream(t))
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
	// The queues the tests route to have a live worker (queues_test.go
	// covers those that have none).
	for _, q := range servedQueues {
		h.serve(q)
	}

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

// turnCall is call #seq of a turn, as the orchestrator would record it.
func turnCall(t *testing.T, name, version string, seq int) events.TurnCall {
	t.Helper()
	input := json.RawMessage(fmt.Sprintf(`{"query": "q%d", "limit": 3}`, seq))
	id, err := envelope.CallID(name, version, input, seq)
	require.NoError(t, err)
	return events.TurnCall{CallID: id, Seq: seq, Name: name, Version: version, Input: input,
		ProviderCallID: fmt.Sprintf("toolu_%d", seq)}
}

// newTurn is turn n of a run whose loop rules allowed the model call, with
// the calls the model made.
func newTurn(runID string, n int, p envelope.Policy, enabled []string, calls ...events.TurnCall) events.Turn {
	now := time.Now().UTC()
	return events.Turn{
		RunID: runID, Iteration: n, Tenant: tenant, Agent: "researcher",
		Verdict: events.LoopVerdict{Allowed: true},
		Model:   events.ModelRef{Provider: "scripted", Name: "test"},
		Tools:   enabled, TStart: now, TEnd: now,
		Response: &envelope.ModelResponse{StopReason: "tool_use"},
		Policy:   p, EnabledTools: enabled, Calls: calls,
	}
}

// wantApproved is what the workers of queue receive for call c of turn t:
// written out here, not by the service's code.
func wantApproved(t *testing.T, turn events.Turn, c events.TurnCall, queue string) events.CallRequest {
	t.Helper()
	want := events.CallRequest{
		RunID: turn.RunID, CallID: c.CallID, Seq: c.Seq, Iteration: turn.Iteration,
		Name: c.Name, Version: c.Version, Input: c.Input, ProviderCallID: c.ProviderCallID,
		Tenant: tenant, Agent: "researcher", Queue: queue,
		// The test tools (toolDef) change nothing: low risk, auto under
		// the default autonomy.
		Gate: &envelope.GateVerdict{Gate: envelope.GateAuto, Autonomy: envelope.AutonomyAutonomous, Risk: envelope.RiskLow, Source: "default"},
	}
	var onWire events.CallRequest // the input as the wire carries it
	require.NoError(t, json.Unmarshal(mustJSON(t, want), &onWire))
	return onWire
}

func (h *harness) publish(out events.Outgoing, err error) {
	h.t.Helper()
	require.NoError(h.t, err)
	require.NoError(h.t, h.pub.Publish(h.t.Context(), out))
}

// turnEvent is turn's event as the orchestrator publishes it.
func (h *harness) turnEvent(turn events.Turn) events.Outgoing {
	h.t.Helper()
	out, err := events.NewTurnCompleted("/toolwire/orchestrator", turn, runTrace)
	require.NoError(h.t, err)
	return out
}

// publishTurn publishes turn as the orchestrator does.
func (h *harness) publishTurn(turn events.Turn) {
	h.t.Helper()
	h.publish(h.turnEvent(turn), nil)
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
	ev, _ := h.nextEventOn(c)
	return ev
}

// nextEventOn is nextEvent, with the subject the event was stored on.
func (h *harness) nextEventOn(c jetstream.Consumer) (*event.Event, string) {
	h.t.Helper()
	m := h.next(c)
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	require.NoError(h.t, err)
	require.Equal(h.t, DefaultSource, ev.Source())
	require.Equal(h.t, runTrace, events.TraceOf(ev), "the run trace travels on")
	return ev, m.Subject()
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

// drained waits until the durable consumer has handled every event stored
// on its stream so far that it consumes (eventstest.Drained): what it
// publishes for them is stored by then.
func (h *harness) drained(stream, durable string) {
	h.t.Helper()
	eventstest.Drained(h.t, h.env.JS, stream, durable, waitFor)
}

// handledThrough waits until durable has acknowledged the last event
// stored on subject (and everything before it): a handler's outcomes are
// stored before its event is acknowledged. Unlike drained, it names the
// event it waits for, so it cannot pass before that event is delivered.
func (h *harness) handledThrough(stream, durable, subject string) {
	h.t.Helper()
	s, err := h.env.JS.Stream(h.t.Context(), stream)
	require.NoError(h.t, err)
	m, err := s.GetLastMsgForSubject(h.t.Context(), subject)
	require.NoError(h.t, err)
	servicetest.PollUntil(h.t, waitFor, fmt.Sprintf("%s has handled %s seq %d", durable, subject, m.Sequence), func() bool {
		c, err := h.env.JS.Consumer(h.t.Context(), stream, durable)
		require.NoError(h.t, err)
		info, err := c.Info(h.t.Context())
		require.NoError(h.t, err)
		return info.AckFloor.Stream >= m.Sequence && info.NumAckPending == 0
	})
}

// denials waits for n denials on c and returns their messages by call id.
func (h *harness) denials(c jetstream.Consumer, n int) map[string]string {
	h.t.Helper()
	got := map[string]string{}
	for range n {
		env := decode[envelope.ToolEnvelope](h.t, h.nextEvent(c))
		require.Equal(h.t, envelope.CodePolicyDenied, env.Error.Code)
		got[env.CallID] = env.Error.Message
	}
	return got
}

// setState sets a version's registry state and waits until the service's
// catalog has it.
func (h *harness) setState(ref envelope.ToolRef, state registry.State) {
	h.t.Helper()
	require.NoError(h.t, h.reg.SetState(h.t.Context(), ref, state))
	require.Eventually(h.t, func() bool {
		e, ok := h.svc.catalog.Lookup(ref)
		return ok && e.State == state
	}, waitFor, 5*time.Millisecond)
}

func decode[T any](t *testing.T, ev *event.Event) T {
	t.Helper()
	var v T
	require.NoError(t, events.DecodeData(ev, &v))
	return v
}

// Each call of a turn is approved to its queue or completed with a
// POLICY_DENIED envelope that says why; metrics, spans and logs say the
// same.
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
			c := turnCall(t, tt.tool, tt.version, tt.seq)
			turn := newTurn(runID, 1, tt.policy, enabled, c)
			verdicts := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
			completions := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
			before := time.Now().UTC()
			h.publishTurn(turn)

			if tt.reason == "" {
				ev, subj := h.nextEventOn(verdicts)
				require.Equal(t, "toolwire.call."+runID+"."+c.CallID+".approved.default", subj, "a tool that names no queue is the default queue's")
				require.Equal(t, events.TypeCallApproved, ev.Type())
				require.Equal(t, runID+"/"+c.CallID+"/approved", ev.ID())
				require.Equal(t, c.CallID, events.Ext(ev, events.ExtCallID))
				require.Equal(t, tenant.ID(), events.Ext(ev, events.ExtTenantID))
				require.Equal(t, wantApproved(t, turn, c, "default"), decode[events.CallRequest](t, ev),
					"the approved call is the turn's call, with what its workers need")
				require.NoError(t, h.schemas.Validate(events.SchemaCallRequest, ev.Data()))
				require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.completed"))
				return
			}
			ev := h.nextEvent(completions)
			require.Equal(t, events.TypeCallCompleted, ev.Type())
			require.Equal(t, runID+"/"+c.CallID+"/completed", ev.ID())
			require.Equal(t, tenant.ID(), events.Ext(ev, events.ExtTenantID))
			require.NoError(t, h.schemas.Validate(envelope.SchemaToolEnvelope, ev.Data()))
			env := decode[envelope.ToolEnvelope](t, ev)
			require.Equal(t, c.CallID, env.CallID)
			require.Equal(t, tt.tool, env.Name)
			require.Equal(t, tt.version, env.Version)
			require.JSONEq(t, string(c.Input), string(env.Input))
			out := h.turnEvent(turn)
			onWire := decode[events.Turn](t, &out.Event)
			require.Equal(t, string(onWire.Calls[0].Input), string(env.Input), "the input is the turn's, byte for byte")
			require.Nil(t, env.Output)
			require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: tt.reason}, env.Error)
			require.Equal(t, env.TStart, env.TEnd)
			require.WithinRange(t, env.TStart, before.Add(-time.Second), time.Now().Add(time.Second))
			require.Zero(t, env.Cost, "a refused call costs nothing")
			require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.*"))
		})
	}

	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindCall, "approved")) == 2 &&
			testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindCall, "denied")) == 4
	}, waitFor, 10*time.Millisecond)
	for rule, n := range map[string]float64{rules.RuleEnabledTools: 1, rules.RuleLifecycle: 1, rules.RuleRegistered: 1, rules.RuleMaxToolCalls: 1} {
		require.Equal(t, n, testutil.ToFloat64(h.svc.metrics.denials.WithLabelValues(kindCall, rule)), rule)
	}
	n, err := testutil.GatherAndCount(h.metrics, "toolwire_policy_verdicts_total")
	require.NoError(t, err)
	require.Equal(t, 2, n, "the call x outcome series are exported, and no iteration series: the loop verdicts are the orchestrator's")

	turnSpan := h.waitSpan(SpanCheckTurn, "run-call-4")
	require.Equal(t, runTrace.TraceID(), turnSpan.SpanContext().TraceID().String(), "the check joins the run's trace")
	requireAttrs(t, turnSpan, map[attribute.Key]attribute.Value{
		AttrIteration: attribute.IntValue(1),
		AttrTurnCalls: attribute.IntValue(1),
	})
	span := h.waitSpan(SpanCheckToolCall, "run-call-4")
	require.Equal(t, runTrace.TraceID(), span.SpanContext().TraceID().String())
	require.Equal(t, turnSpan.SpanContext().SpanID(), span.Parent().SpanID(), "each call's check is a child of its turn's")
	requireAttrs(t, span, map[attribute.Key]attribute.Value{
		AttrToolName:    attribute.StringValue("rm_rf"),
		AttrToolVersion: attribute.StringValue("1.0.0"),
		AttrToolCallID:  attribute.StringValue(turnCall(t, "rm_rf", "1.0.0", 4).CallID),
		AttrCallSeq:     attribute.IntValue(4),
		AttrIteration:   attribute.IntValue(1),
		AttrQueue:       attribute.StringValue("default"),
		AttrAllowed:     attribute.BoolValue(false),
		AttrReason:      attribute.StringValue("tool rm_rf@1.0.0 is blocked"),
		AttrRule:        attribute.StringValue(rules.RuleLifecycle),
	})
	span = h.waitSpan(SpanCheckToolCall, "run-call-2")
	requireAttrs(t, span, map[attribute.Key]attribute.Value{AttrAllowed: attribute.BoolValue(true)})
	require.Len(t, span.Events(), 1, "the deprecation warning is on the span")
}

// One turn's calls are judged together, each on its own: approved to its
// tool's queue, refused with its own reason, or left alone when the
// orchestrator answered it; the outcomes of the turn are all published.
func TestServiceJudgesEveryCallOfATurn(t *testing.T) {
	h := newHarness(t)
	const runID = "run-turn"
	enabled := []string{"web_search@1.0.0", "calc@2.1.0", "rm_rf@1.0.0"}
	search := turnCall(t, "web_search", "1.0.0", 1)
	blocked := turnCall(t, "rm_rf", "1.0.0", 2)
	answered := turnCall(t, "nonexistent", "", 3)
	answered.Answered = true
	gpu := turnCall(t, "calc", "2.1.0", 4)
	gpu.Queue = "gpu"
	stranger := turnCall(t, "send_email", "", 5)
	turn := newTurn(runID, 3, envelope.Policy{}, enabled, search, blocked, answered, gpu, stranger)
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
	h.publishTurn(turn)

	got := map[string]events.CallRequest{}
	for range 2 {
		ev, subj := h.nextEventOn(approved)
		got[subj] = decode[events.CallRequest](t, ev)
	}
	require.Equal(t, map[string]events.CallRequest{
		"toolwire.call." + runID + "." + search.CallID + ".approved.default": wantApproved(t, turn, search, "default"),
		"toolwire.call." + runID + "." + gpu.CallID + ".approved.gpu":        wantApproved(t, turn, gpu, "gpu"),
	}, got, "each approved call goes to its tool's queue")
	require.Equal(t, map[string]string{
		blocked.CallID:  "tool rm_rf@1.0.0 is blocked",
		stranger.CallID: "tool send_email is not enabled for this agent (enabled: web_search@1.0.0, calc@2.1.0, rm_rf@1.0.0)",
	}, h.denials(completed, 2))

	h.drained(events.StreamRuns, DurableTurns)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+"."+answered.CallID+".>"),
		"the orchestrator answered that call: the guard leaves it alone")
	require.Equal(t, uint64(4), h.count(events.StreamCalls, "toolwire.call."+runID+".>"), "one outcome per judged call")
	turnSpan := h.waitSpan(SpanCheckTurn, runID)
	requireAttrs(t, turnSpan, map[attribute.Key]attribute.Value{AttrIteration: attribute.IntValue(3), AttrTurnCalls: attribute.IntValue(4)})
}

// A denied turn (the loop rules stopped the run before the model call) and
// a turn without calls (the model's final answer) need nothing of the
// guard.
func TestServiceLeavesTurnsWithoutCallsAlone(t *testing.T) {
	h := newHarness(t)
	enabled := []string{"web_search@1.0.0"}
	denied := newTurn("run-denied", 11, envelope.Policy{}, enabled, turnCall(t, "web_search", "1.0.0", 1))
	denied.Verdict = events.LoopVerdict{Code: envelope.CodePolicyDenied, Reason: "max_iterations (10) reached: iteration 11 not allowed", Rule: rules.RuleMaxIterations}
	denied.Response = nil
	final := newTurn("run-final", 2, envelope.Policy{}, enabled)
	final.Response = &envelope.ModelResponse{StopReason: "end_turn"}
	h.publishTurn(denied)
	h.publishTurn(final)

	h.drained(events.StreamRuns, DurableTurns)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call.run-denied.>"))
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call.run-final.>"))
	require.Zero(t, testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindCall, "approved"))+
		testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindCall, "denied")))
	failures, err := testutil.GatherAndCount(h.metrics, "toolwire_policy_handler_failures_total")
	require.NoError(t, err)
	require.Zero(t, failures, "neither turn failed its handler")
}

// A turn of 10 parallel calls with 3 left under the cap of 25: calls #23 to
// #25 are approved, #26 to #32 are refused, whatever order the turn lists
// them in.
func TestServiceFanOutCrossingTheCap(t *testing.T) {
	h := newHarness(t)
	const runID = "run-fanout"
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")

	var calls []events.TurnCall
	bySeq := map[string]int{}
	for _, seq := range []int{32, 23, 27, 25, 31, 24, 26, 30, 28, 29} {
		c := turnCall(t, "web_search", "1.0.0", seq)
		calls = append(calls, c)
		bySeq[c.CallID] = seq
	}
	h.publishTurn(newTurn(runID, 4, envelope.Policy{MaxToolCalls: 25}, []string{"web_search@1.0.0"}, calls...))

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
	h.drained(events.StreamRuns, DurableTurns)
	require.Equal(t, uint64(3), h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.*"))
	require.Equal(t, uint64(7), h.count(events.StreamCalls, "toolwire.call."+runID+".*.completed"))
	require.Equal(t, 7.0, testutil.ToFloat64(h.svc.metrics.denials.WithLabelValues(kindCall, rules.RuleMaxToolCalls)))
}

// A turn that would cross max_budget runs its first calls, in seq order,
// and is refused the rest, each refusal saying what the calls up to it
// cost; the calls the orchestrator answered cost the turn nothing.
func TestServiceBudgetAcrossATurn(t *testing.T) {
	h := newHarness(t)
	const runID = "run-budget"
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")

	answered := turnCall(t, "nonexistent", "", 1)
	answered.Answered, answered.Cost = true, 1
	calls := []events.TurnCall{answered}
	bySeq := map[string]int{}
	for _, seq := range []int{4, 2, 6, 3, 5} { // listed out of order: the budget is spent in seq order
		c := turnCall(t, "web_search", "1.0.0", seq)
		c.Cost = 0.02
		calls = append(calls, c)
		bySeq[c.CallID] = seq
	}
	turn := newTurn(runID, 2, envelope.Policy{MaxBudget: 0.1}, []string{"web_search@1.0.0"}, calls...)
	turn.Spend = 0.05
	h.publishTurn(turn)

	var gotApproved []int
	for range 2 {
		gotApproved = append(gotApproved, decode[events.CallRequest](t, h.nextEvent(approved)).Seq)
	}
	reasons := map[int]string{}
	for range 3 {
		env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
		require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
		reasons[bySeq[env.CallID]] = env.Error.Message
	}
	require.ElementsMatch(t, []int{2, 3}, gotApproved)
	require.Equal(t, map[int]string{
		4: "max_budget (0.1) would be exceeded by call #4 (web_search@1.0.0, cost 0.02): the run has spent 0.05 and this turn's calls up to it cost 0.06",
		5: "max_budget (0.1) would be exceeded by call #5 (web_search@1.0.0, cost 0.02): the run has spent 0.05 and this turn's calls up to it cost 0.08",
		6: "max_budget (0.1) would be exceeded by call #6 (web_search@1.0.0, cost 0.02): the run has spent 0.05 and this turn's calls up to it cost 0.1",
	}, reasons)
	// Counted once the outcomes are published: the test can read them first.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.denials.WithLabelValues(kindCall, rules.RuleMaxBudget)) == 3
	}, waitFor, 5*time.Millisecond)
}

// Blocking a version in the registry takes effect on the running service: it
// watches the registry.
func TestServiceSeesRegistryChanges(t *testing.T) {
	h := newHarness(t)
	const runID = "run-block"
	enabled := []string{"calc@2.1.0"}
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")

	h.publishTurn(newTurn(runID, 1, envelope.Policy{}, enabled, turnCall(t, "calc", "2.1.0", 1)))
	require.Equal(t, 1, decode[events.CallRequest](t, h.nextEvent(approved)).Seq)

	h.setState(envelope.ToolRef{Name: "calc", Version: "2.1.0"}, registry.StateBlocked)

	h.publishTurn(newTurn(runID, 2, envelope.Policy{}, enabled, turnCall(t, "calc", "2.1.0", 2)))
	env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
	require.Equal(t, "tool calc@2.1.0 is blocked", env.Error.Message)
}

// Turns that cannot be read, or judged safely, are dead-lettered at once,
// with the reason, before anything of them is published; the service goes
// on.
func TestServiceDeadLettersMalformedTurns(t *testing.T) {
	h := newHarness(t)
	const runID = "run-dlq"
	dlq := h.watch(events.StreamDLQ, consume.DLQSubject(events.StreamRuns, DurableTurns))
	enabled := []string{"web_search@1.0.0"}
	good := turnCall(t, "web_search", "1.0.0", 1)
	other := turnCall(t, "web_search", "1.0.0", 2)
	turnOf := func(n int, calls ...events.TurnCall) events.Turn {
		return newTurn(runID, n, envelope.Policy{}, enabled, calls...)
	}
	with := func(n int, change func(*events.Turn)) []byte {
		turn := turnOf(n, good, other)
		change(&turn)
		return mustJSON(t, turn)
	}
	const typ = "dev.toolwire.run.turn.completed.v1"

	tests := []struct {
		name    string
		subject string // "" for the turn's own subject
		data    []byte
		err     string
	}{
		{name: "unknown field",
			data: []byte(`{"run_id": "run-dlq", "iteration": 1, "tool": "web_search"}`),
			err:  `turn: invalid event: ` + typ + ` data: json: unknown field "tool"`},
		{name: "not JSON", data: []byte(`{"run_id": `),
			err: "turn: invalid event: " + typ + " data: unexpected EOF"},
		{name: "data names another run", data: with(3, func(t *events.Turn) { t.RunID = "another-run" }),
			err: `turn: subject toolwire.run.run-dlq.turn.3.completed does not match the data (run_id "another-run", call_id "", iteration 3)`},
		{name: "data names an unsafe run id", data: with(4, func(t *events.Turn) { t.RunID = "run-dlq.>" }),
			err: `turn: subject toolwire.run.run-dlq.turn.4.completed does not match the data (run_id "run-dlq.>", call_id "", iteration 4)`},
		{name: "subject names an unsafe run id", subject: "toolwire.run.run$dlq.turn.5.completed", data: with(5, func(*events.Turn) {}),
			err: `turn: unsafe subject token: invalid run request: run_id "run$dlq" must be 1-64 letters, digits, '-' or '_'`},
		{name: "data names another turn", data: with(6, func(t *events.Turn) { t.Iteration = 7 }),
			err: `turn: subject toolwire.run.run-dlq.turn.6.completed does not match the data (run_id "run-dlq", call_id "", iteration 7)`},
		{name: "a call id that is not a subject token", data: with(7, func(t *events.Turn) { t.Calls[1].CallID = "abc.>" }),
			err: `turn: call 2: unsafe subject token: call_id "abc.>" must be lowercase hex, at most 64 digits`},
		{name: "two calls with one id", data: with(8, func(t *events.Turn) { t.Calls[1].CallID = good.CallID }),
			err: fmt.Sprintf("turn: call 2: call_id %s is also an earlier call's", good.CallID)},
		{name: "two calls with one number", data: with(9, func(t *events.Turn) { t.Calls[1].Seq = 1 }),
			err: "turn: call 2: seq 1 is also an earlier call's"},
		{name: "a call numbered 0", data: with(10, func(t *events.Turn) { t.Calls[0].Seq = 0 }),
			err: "turn: call 1: seq 0: want at least 1"},
		{name: "a queue that is not a subject token", data: with(11, func(t *events.Turn) { t.Calls[0].Queue = "gpu.>" }),
			err: `turn: call 1: queue "gpu.>" must be 1-64 lowercase letters, digits, '-' or '_'`},
		{name: "a negative cost would lend the turn budget", data: with(12, func(t *events.Turn) { t.Calls[0].Cost = -1 }),
			err: "turn: call 1: cost -1: want at least 0"},
		{name: "a negative spend", data: with(13, func(t *events.Turn) { t.Spend = -0.5 }),
			err: "turn: spend -0.5: want at least 0"},
		{name: "an answered call is checked too", data: with(14, func(t *events.Turn) {
			t.Calls[1].Answered, t.Calls[1].CallID = true, "nothex"
		}),
			err: `turn: call 2: unsafe subject token: call_id "nothex" must be lowercase hex, at most 64 digits`},
	}
	want := map[string]string{}
	for i, tt := range tests {
		subj := tt.subject
		if subj == "" {
			var err error
			subj, err = events.TurnSubject(runID, i+1)
			require.NoError(t, err)
		}
		out, err := events.Build(events.TypeTurnCompleted, fmt.Sprintf("%s/turn/%d/%s", runID, i+1, tt.name), subj,
			events.Attrs{Source: "/test", RunID: runID}, map[string]any{})
		require.NoError(t, err)
		require.NoError(t, out.Event.SetData(event.ApplicationJSON, tt.data))
		require.NoError(t, h.pub.Publish(t.Context(), out))
		want[subj] = tt.err
	}

	got := map[string]string{}
	for range tests {
		m := h.next(dlq)
		require.Equal(t, "1", m.Headers().Get(consume.HeaderDLQDeliveries), "a permanent failure is not retried")
		require.Equal(t, events.StreamRuns, m.Headers().Get(consume.HeaderDLQStream))
		require.Equal(t, DurableTurns, m.Headers().Get(consume.HeaderDLQConsumer))
		got[m.Headers().Get(consume.HeaderDLQSubject)] = m.Headers().Get(consume.HeaderDLQError)
	}
	require.Equal(t, want, got)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call.>"), "nothing of a malformed turn is published")

	// The consumer goes on.
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	h.publishTurn(turnOf(20, good))
	require.Equal(t, good.CallID, decode[events.CallRequest](t, h.nextEvent(approved)).CallID)
}

// A turn handled again (the orchestrator published it once more, or the
// stream delivered it again) publishes nothing new: every outcome has a
// deterministic event id.
func TestServiceTurnAgainPublishesNothingNew(t *testing.T) {
	h := newHarness(t)
	const runID = "run-again"
	enabled := []string{"web_search@1.0.0", "rm_rf@1.0.0"}
	turn := newTurn(runID, 1, envelope.Policy{}, enabled,
		turnCall(t, "web_search", "1.0.0", 1), turnCall(t, "rm_rf", "1.0.0", 2), turnCall(t, "web_search", "1.0.0", 3))
	h.publishTurn(turn)
	turnSubject := "toolwire.run." + runID + ".turn.1.completed"
	h.handledThrough(events.StreamRuns, DurableTurns, turnSubject)
	all := "toolwire.call." + runID + ".>"
	require.Equal(t, uint64(3), h.count(events.StreamCalls, all))

	// The same turn under another event id, as one published again after
	// the stream's duplicate window would be.
	out, err := events.NewTurnCompleted("/toolwire/orchestrator", turn, runTrace)
	require.NoError(t, err)
	out.Event.SetID(out.Event.ID() + "/again")
	require.NoError(t, h.pub.Publish(t.Context(), out))
	h.handledThrough(events.StreamRuns, DurableTurns, turnSubject)
	require.Equal(t, uint64(3), h.count(events.StreamCalls, all))
	require.Equal(t, uint64(2), h.count(events.StreamRuns, turnSubject), "the turn was handled twice")
}

// A redelivered turn (its first delivery stored part of its outcomes, then
// failed) publishes what is missing and nothing else: a call whose outcome
// is stored keeps it, even when the registry changed since.
func TestServiceRedeliveredTurnPublishesWhatIsMissing(t *testing.T) {
	h := newHarness(t)
	const runID = "run-redelivered"
	enabled := []string{"calc@2.1.0", "rm_rf@1.0.0"}
	first, second, third := turnCall(t, "calc", "2.1.0", 1), turnCall(t, "calc", "2.1.0", 2), turnCall(t, "rm_rf", "1.0.0", 3)
	turn := newTurn(runID, 1, envelope.Policy{}, enabled, first, second, third)
	out, err := events.NewTurnCompleted("/toolwire/orchestrator", turn, runTrace)
	require.NoError(t, err)
	// The first delivery stored the first call's approval and no more.
	h.publish(events.NewCallApproved(DefaultSource, wantApproved(t, turn, first, "default"), runTrace))
	// Since then, calc was blocked.
	h.setState(envelope.ToolRef{Name: "calc", Version: "2.1.0"}, registry.StateBlocked)

	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
	redeliver := func(attempt uint64) {
		require.NoError(t, h.svc.handleTurn(t.Context(), &consume.Delivery{Event: &out.Event, Subject: out.Subject, Attempt: attempt}))
	}
	redeliver(2)
	require.Equal(t, map[string]string{
		second.CallID: "tool calc@2.1.0 is blocked",
		third.CallID:  "tool rm_rf@1.0.0 is blocked",
	}, h.denials(completed, 2), "the calls without an outcome are judged now")
	all := "toolwire.call." + runID + ".>"
	require.Equal(t, uint64(1), h.count(events.StreamCalls, "toolwire.call."+runID+"."+first.CallID+".>"),
		"the first call keeps its approval: no denial follows it")
	require.Equal(t, uint64(3), h.count(events.StreamCalls, all))

	redeliver(3)
	require.Equal(t, uint64(3), h.count(events.StreamCalls, all), "nothing is missing any more")
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
	require.EqualError(t, err, "policy config: concurrency -1: want 1 to 4096")

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
// consumers (turns and decisions), reports ready and shuts down cleanly when its context ends.
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
		{events.StreamRuns, DurableTurns}, {events.StreamCalls, DurableDecisions},
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

func TestDeniedEnvelopeMatchesSchema(t *testing.T) {
	schemas := testSchemas(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	tests := []struct {
		name, tool, version string
	}{
		{name: "tool not enabled: no version", tool: "send_email"},
		{name: "blocked version", tool: "rm_rf", version: "1.0.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := json.RawMessage(`{"to": "a@example.com", "n": 1.0}`)
			callID, err := envelope.CallID(tt.tool, tt.version, input, 7)
			require.NoError(t, err)
			req := events.CallRequest{RunID: "run-1", CallID: callID, Seq: 7, Iteration: 2, Name: tt.tool, Version: tt.version, Input: input,
				Queue: envelope.DefaultQueue}
			env := DeniedEnvelope(&req, rules.Deny("no"), now)

			require.Equal(t, callID, env.CallID)
			require.Equal(t, tt.tool, env.Name)
			require.Equal(t, tt.version, env.Version)
			require.Equal(t, string(input), string(env.Input), "input is kept byte for byte")
			require.Nil(t, env.Output)
			require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "no"}, env.Error)
			require.Equal(t, now.UTC(), env.TStart)
			require.Equal(t, time.UTC, env.TStart.Location())
			require.Equal(t, env.TStart, env.TEnd)
			require.Zero(t, env.Cost, "a refused call costs nothing")
			require.False(t, env.Billable())
			require.NoError(t, schemas.ValidateValue(envelope.SchemaToolEnvelope, env))
		})
	}
}

// TestServiceFindsAToolItsWatchHasNotSeen: a tool registered a moment ago
// (a worker's, just started) is judged by its registry entry when the
// catalog's watch has not delivered it yet: here the watch is stopped, so it
// never will, and the call is approved, not refused as unknown.
func TestServiceFindsAToolItsWatchHasNotSeen(t *testing.T) {
	h := newHarness(t)
	h.svc.catalog.Stop()
	_, err := h.reg.Register(t.Context(), toolDef("fresh", "1.0.0"))
	require.NoError(t, err)
	_, ok := h.svc.catalog.Lookup(envelope.ToolRef{Name: "fresh", Version: "1.0.0"})
	require.False(t, ok, "the stopped watch does not know it")

	const runID = "run-fresh"
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	h.publishTurn(newTurn(runID, 1, envelope.Policy{}, []string{"fresh@1.0.0"}, turnCall(t, "fresh", "1.0.0", 1)))
	got := decode[events.CallRequest](t, h.nextEvent(approved))
	require.Equal(t, "fresh", got.Name)
}

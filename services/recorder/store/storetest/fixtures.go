package storetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Source is the CloudEvents source of the fixtures' events.
const Source = "/toolwire/storetest"

// Run is a realistic run as its events tell it, and what the recorder should
// make of them.
type Run struct {
	RunID   string
	Tenant  envelope.Tenant
	Agent   string
	Trace   events.RunTrace
	Request envelope.RunRequest
	// Envelopes are the run's tool call receipts in call order, and Queues
	// the queues their calls were routed to.
	Envelopes []envelope.ToolEnvelope
	Queues    []string
	// Outputs is what the completed event carries (nil for a failed run).
	Outputs *envelope.AgentOutputs
	Reason  string // a failed run's reason
	// Iterations is the number of model iterations the run reached.
	Iterations int
	// Spend is the run's final spend, as its events report it.
	Spend float64
	// Events are the run's events in the order they happened; their times
	// step by a millisecond from the fixture's base time.
	Events []events.Outgoing
}

// Turn returns the run's turn n as its events sent it: the data of its turn
// event, or the turn its end event carries (the turn that ended the run), or
// fails t.
func (r *Run) Turn(t testing.TB, n int) (events.Turn, json.RawMessage) {
	t.Helper()
	for _, o := range r.Events {
		var raw json.RawMessage
		switch o.Event.Type() {
		case events.TypeTurnCompleted:
			raw = o.Event.Data()
		case events.TypeRunCompleted, events.TypeRunFailed:
			var end struct {
				Turn json.RawMessage `json:"turn"`
			}
			if err := json.Unmarshal(o.Event.Data(), &end); err != nil {
				t.Fatal(err)
			}
			raw = end.Turn
		}
		if len(raw) == 0 {
			continue
		}
		var turn events.Turn
		if err := json.Unmarshal(raw, &turn); err != nil {
			t.Fatal(err)
		}
		if turn.Iteration == n {
			return turn, raw
		}
	}
	t.Fatalf("storetest: run %s has no turn %d", r.RunID, n)
	return events.Turn{}, nil
}

// Status is the run's final status.
func (r *Run) Status() string {
	if r.Outputs != nil {
		return events.StatusCompleted
	}
	return events.StatusFailed
}

// Event returns the run's event of the given type (and call, for call
// events), or fails t.
func (r *Run) Event(t testing.TB, typ, callID string) events.Outgoing {
	t.Helper()
	for _, o := range r.Events {
		if o.Event.Type() == typ && (callID == "" || events.Ext(&o.Event, events.ExtCallID) == callID) {
			return o
		}
	}
	t.Fatalf("storetest: run %s has no %s event for call %q", r.RunID, typ, callID)
	return events.Outgoing{}
}

// Records returns the records of the run's events, in order.
func (r *Run) Records(t testing.TB) []store.Record {
	t.Helper()
	return Records(t, r.Events...)
}

// Records decodes events with store.RecordOf, or fails t.
func Records(t testing.TB, outs ...events.Outgoing) []store.Record {
	t.Helper()
	recs := make([]store.Record, 0, len(outs))
	for i := range outs {
		rec, err := store.RecordOf(&outs[i].Event, outs[i].Subject)
		if err != nil {
			t.Fatalf("storetest: RecordOf %s: %v", outs[i].Event.ID(), err)
		}
		recs = append(recs, rec)
	}
	return recs
}

// TraceFor returns a fixed, valid run trace derived from the run id.
func TraceFor(runID string) events.RunTrace {
	h := fmt.Sprintf("%032x", []byte(runID+"0123456789abcdef"))[:32]
	return events.RunTrace{TraceParent: "00-" + h + "-00f067aa0ba902b7-01"}
}

// CompletedRun builds a run of two iterations, as contract v2 records it:
// its first model call is slow (so the run is announced started); the model
// asks for two tool calls at once (web_search, on the default queue, succeeds
// from the cache; fetch_page, on the "fetchers" queue, is slow, announced
// started, and times out), then answers: that last turn rides on the
// completed event. Its events start at base.
func CompletedRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run

	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	inputA := json.RawMessage(`{"query": "weather in Paris", "max_results": 3}`)
	inputB := json.RawMessage(`{"url":"https://example.com/forecast"}`)
	callA := b.turnCall(1, "web_search", "1.2.0", inputA, 0.01, "")
	callB := b.turnCall(2, "fetch_page", "2.0.0", inputB, 0.002, "fetchers")
	b.turn(1, &envelope.ModelResponse{
		ToolCalls: []envelope.ToolCall{
			{ID: "tc_1", Name: "web_search", Arguments: inputA},
			{ID: "tc_2", Name: "fetch_page", Arguments: inputB},
		},
		StopReason: "tool_use",
		Usage:      envelope.Usage{InputTokens: 120, OutputTokens: 30},
	}, 0.004, nil, callA, callB)
	reqA, reqB := b.approved(1, callA), b.approved(1, callB)
	b.add(events.NewCallApproved(Source, reqA, r.Trace))
	b.add(events.NewCallApproved(Source, reqB, r.Trace))
	tA, tB := b.next(), b.next()
	// Only the slow call is announced as started: the quick one's t_start is
	// in its envelope.
	b.add(events.NewCallStarted(Source, events.CallStarted{RunID: runID, CallID: reqB.CallID, Name: reqB.Name,
		Version: reqB.Version, TStart: tB, Executor: "executor-1"}, tenant, r.Trace))
	envA := envelope.ToolEnvelope{CallID: reqA.CallID, Name: reqA.Name, Version: reqA.Version, Input: inputA,
		Output: json.RawMessage(`{"results":[{"title":"Paris: sunny, 21°C","url":"https://example.com/paris"}]}`),
		TStart: tA, TEnd: tA.Add(42 * time.Millisecond), Cached: true}
	envB := envelope.ToolEnvelope{CallID: reqB.CallID, Name: reqB.Name, Version: reqB.Version, Input: inputB,
		Error:  &envelope.ToolError{Code: envelope.CodeTimeout, Message: "fetch_page did not answer within 5s", RetryAfterS: 2},
		TStart: tB, TEnd: tB.Add(5 * time.Second), Cost: callB.Cost}
	b.add(events.NewCallCompleted(Source, runID, envA, tenant, r.Trace))
	b.add(events.NewCallCompleted(Source, runID, envB, tenant, r.Trace))
	r.Envelopes = []envelope.ToolEnvelope{envA, envB}
	r.Queues = []string{reqA.Queue, reqB.Queue}
	final := b.turnOf(2, events.LoopVerdict{Allowed: true}, &envelope.ModelResponse{Content: "It is sunny in Paris, 21°C.",
		StopReason: "end_turn", Usage: envelope.Usage{InputTokens: 300, OutputTokens: 12}}, 0.0063,
		[]events.TurnResult{{CallID: envA.CallID, ProviderCallID: "tc_1"}, {CallID: envB.CallID, ProviderCallID: "tc_2", IsError: true}})
	out := envelope.NewAgentOutputs("It is sunny in Paris, 21°C.", r.Envelopes, "http://jaeger:16686/trace/"+r.Trace.TraceID())
	r.Outputs = &out
	r.Iterations = 2
	done := b.status(events.StatusCompleted)
	done.Outputs, done.Turn = &out, &final
	done.Iteration, done.ToolCalls = 2, 2
	done.Spend, r.Spend = b.spend, b.spend
	done.Pinned = map[string]*envelope.ToolEnvelope{"search": &envA, "page": nil}
	b.add(events.NewRunStatus(Source, done, "", r.Trace))
	return r
}

// CompletedRunPinned is CompletedRun with pinned handles on its agent node:
// its request carries them and its completed event their resolution.
func CompletedRunPinned(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time, pins []envelope.PinnedHandle) *Run {
	t.Helper()
	r := CompletedRun(t, runID, agent, tenant, base)
	return r.WithPins(t, pins)
}

// AnsweredRun builds a run whose model answers at once, without calling a
// tool (its one turn rides on the completed event), with pinned handles on
// its agent node (none of which can select anything).
func AnsweredRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time, pins []envelope.PinnedHandle) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run
	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	final := b.turnOf(1, events.LoopVerdict{Allowed: true}, &envelope.ModelResponse{Content: "No search needed.",
		StopReason: "end_turn", Usage: envelope.Usage{InputTokens: 50, OutputTokens: 5}}, 0.001, nil)
	out := envelope.NewAgentOutputs("No search needed.", nil, "")
	r.Outputs = &out
	r.Iterations = 1
	done := b.status(events.StatusCompleted)
	done.Outputs, done.Turn = &out, &final
	done.Iteration = 1
	done.Spend, r.Spend = b.spend, b.spend
	b.add(events.NewRunStatus(Source, done, "", r.Trace))
	return r.WithPins(t, pins)
}

// WithPins puts pins on the run's request and their resolution on its
// completed event, rebuilding both events in place (same ids and times).
func (r *Run) WithPins(t testing.TB, pins []envelope.PinnedHandle) *Run {
	t.Helper()
	r.Request.Agent.PinnedHandles = pins
	for i, o := range r.Events {
		var (
			rebuilt events.Outgoing
			err     error
		)
		switch o.Event.Type() {
		case events.TypeRunRequested:
			rebuilt, err = events.NewRunRequested(Source, r.Request, r.Trace)
		case events.TypeRunCompleted:
			var s events.RunStatus
			if err := json.Unmarshal(o.Event.Data(), &s); err != nil {
				t.Fatal(err)
			}
			resolved, perr := envelope.ResolvePins(*r.Outputs, pins)
			if perr != nil {
				t.Fatalf("storetest: pins: %v", perr)
			}
			s.Pinned = resolved
			rebuilt, err = events.NewRunStatus(Source, s, "", r.Trace)
		default:
			continue
		}
		if err != nil {
			t.Fatalf("storetest: rebuild %s: %v", o.Event.Type(), err)
		}
		rebuilt.Event.SetTime(o.Event.Time())
		r.Events[i] = rebuilt
	}
	return r
}

// WithOutputsBlob makes the run's completed event name blob, the blob of its
// outputs and pinned handles, instead of carrying them (same id and time), as
// the orchestrator does when they are too large for an event.
func (r *Run) WithOutputsBlob(t testing.TB, blob envelope.Attachment) *Run {
	t.Helper()
	for i, o := range r.Events {
		if o.Event.Type() != events.TypeRunCompleted {
			continue
		}
		var s events.RunStatus
		if err := json.Unmarshal(o.Event.Data(), &s); err != nil {
			t.Fatal(err)
		}
		s.Outputs, s.Pinned, s.OutputsBlob = nil, nil, &blob
		rebuilt, err := events.NewRunStatus(Source, s, "", r.Trace)
		if err != nil {
			t.Fatalf("storetest: rebuild %s: %v", o.Event.Type(), err)
		}
		rebuilt.Event.SetTime(o.Event.Time())
		r.Events[i] = rebuilt
	}
	return r
}

// FailedRun builds a run that starts and fails with reason before its first
// model call: the loop rules deny turn 1 (a turn with a verdict and no
// response, which rides on the failed event), and the run fails
// POLICY_DENIED.
func FailedRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time, reason string) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run
	r.Reason = reason
	r.Iterations = 1
	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	denied := b.turnOf(1, events.LoopVerdict{Code: envelope.CodePolicyDenied, Reason: reason, Rule: "max_budget"}, nil, 0, nil)
	failed := b.status(events.StatusFailed)
	failed.Reason, failed.Code, failed.Turn = reason, envelope.CodePolicyDenied, &denied
	failed.Iteration = 1
	b.add(events.NewRunStatus(Source, failed, "", r.Trace))
	return r
}

// CancelledRun builds a run that is requested, started and cancelled.
func CancelledRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time, reason string) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run
	r.Reason = reason
	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	end := b.status(events.StatusCancelled)
	end.Reason = reason
	r.Outputs = &envelope.AgentOutputs{ToolsByID: map[string]envelope.ToolEnvelope{}, ToolOrder: []string{}}
	end.Outputs = r.Outputs
	b.add(events.NewRunStatus(Source, end, "", r.Trace))
	return r
}

// StartedRun builds a run that is requested and started, nothing more.
func StartedRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run
	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	return r
}

type builder struct {
	t   testing.TB
	run *Run
	at  time.Time
	// spend is what the run has cost so far: its turns' model calls and its
	// billable tool calls.
	spend float64
}

func newBuilder(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time) *builder {
	temp := 0.2
	r := &Run{
		RunID:  runID,
		Tenant: tenant,
		Agent:  agent,
		Trace:  TraceFor(runID),
		Request: envelope.RunRequest{
			RunID:  runID,
			Tenant: tenant,
			Agent: envelope.Agent{
				Name:         agent,
				Model:        envelope.Model{Provider: "scripted", Name: "script-1", Temperature: &temp},
				SystemPrompt: "You answer weather questions.",
				EnabledTools: []string{"web_search@1.2.0", "fetch_page@2.0.0"},
				Policy:       envelope.Policy{MaxIterations: 4, MaxToolCalls: 8},
			},
			Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "What's the weather in Paris?"}},
			Metadata: map[string]string{"workflow": "wf-1"},
		},
	}
	return &builder{t: t, run: r, at: base.UTC().Truncate(time.Millisecond)}
}

// next is the next event time: a millisecond after the previous one.
func (b *builder) next() time.Time {
	b.at = b.at.Add(time.Millisecond)
	return b.at
}

func (b *builder) add(o events.Outgoing, err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatalf("storetest: build event: %v", err)
	}
	o.Event.SetTime(b.next())
	b.run.Events = append(b.run.Events, o)
	if o.Event.Type() == events.TypeCallCompleted {
		var env envelope.ToolEnvelope
		if err := json.Unmarshal(o.Event.Data(), &env); err != nil {
			b.t.Fatal(err)
		}
		b.spend += env.Cost
	}
}

func (b *builder) status(s string) events.RunStatus {
	return events.RunStatus{RunID: b.run.RunID, Status: s, Agent: b.run.Agent, Tenant: b.run.Tenant,
		TraceID: b.run.Trace.TraceID()}
}

// turnOf is model turn n: its model call took a millisecond from the last
// event and cost cost, which adds to the run's spend.
func (b *builder) turnOf(n int, v events.LoopVerdict, resp *envelope.ModelResponse, cost float64,
	results []events.TurnResult, calls ...events.TurnCall) events.Turn {
	r := b.run
	b.spend += cost
	t := events.Turn{RunID: r.RunID, Iteration: n, Tenant: r.Tenant, Agent: r.Agent, Verdict: v,
		Model:   events.ModelRef{Provider: r.Request.Agent.Model.Provider, Name: r.Request.Agent.Model.Name},
		Results: results, Response: resp, Cost: cost, TStart: b.at, TEnd: b.at.Add(time.Millisecond),
		Policy: r.Request.Agent.Policy, EnabledTools: r.Request.Agent.EnabledTools, Spend: b.spend, Calls: calls}
	if resp != nil {
		t.Tools = r.Request.Agent.EnabledTools
	}
	return t
}

// turn adds model turn n, allowed by the loop rules.
func (b *builder) turn(n int, resp *envelope.ModelResponse, cost float64, results []events.TurnResult, calls ...events.TurnCall) {
	b.t.Helper()
	b.add(events.NewTurnCompleted(Source, b.turnOf(n, events.LoopVerdict{Allowed: true}, resp, cost, results, calls...), b.run.Trace))
}

// turnCall is the call #seq of a turn, of a tool whose declared cost is
// cost, on queue ("": the default queue).
func (b *builder) turnCall(seq int, name, version string, input json.RawMessage, cost float64, queue string) events.TurnCall {
	b.t.Helper()
	id, err := envelope.CallID(name, version, input, seq)
	if err != nil {
		b.t.Fatalf("storetest: call id: %v", err)
	}
	if queue == "" {
		queue = envelope.DefaultQueue
	}
	return events.TurnCall{CallID: id, Seq: seq, Name: name, Version: version, Input: input,
		ProviderCallID: fmt.Sprintf("tc_%d", seq), Cost: cost, Queue: queue}
}

// approved is the guard's approval of a call of turn iteration.
func (b *builder) approved(iteration int, c events.TurnCall) events.CallRequest {
	r := b.run
	return events.CallRequest{RunID: r.RunID, CallID: c.CallID, Seq: c.Seq, Iteration: iteration, Name: c.Name,
		Version: c.Version, Input: c.Input, ProviderCallID: c.ProviderCallID, Tenant: r.Tenant, Agent: r.Agent,
		Queue: c.Queue}
}

// SideEvents returns events of fx's first call that other services add
// around it: an approval request and its decision, and a sandbox job and its
// result. Their times follow the run's last event.
func SideEvents(t testing.TB, fx *Run) []events.Outgoing {
	t.Helper()
	env := fx.Envelopes[0]
	at := fx.Events[len(fx.Events)-1].Event.Time()
	var outs []events.Outgoing
	add := func(o events.Outgoing, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("storetest: side event: %v", err)
		}
		at = at.Add(time.Millisecond)
		o.Event.SetTime(at)
		outs = append(outs, o)
	}
	add(events.NewApprovalRequired(Source, events.ApprovalRequest{RunID: fx.RunID, CorrelationID: env.CallID,
		ToolName: env.Name, ToolVersion: env.Version, AgentName: fx.Agent, Tenant: fx.Tenant,
		ArgsSummary: `{"query":"weather in Paris"}`, EffectDescription: "searches the web", Reason: "policy requires approval for web_search",
		ExpiresAt: at.Add(time.Hour)}, fx.Trace))
	add(events.NewDecided(Source, events.Decision{RunID: fx.RunID, CallID: env.CallID, Decision: events.DecisionApprove,
		Note: "fine", By: "ops@example.com"}, fx.Tenant, fx.Trace))
	add(events.NewSandboxJob(Source, events.SandboxJob{RunID: fx.RunID, CallID: env.CallID, Tool: env.Name + "@" + env.Version,
		TenantID: fx.Tenant.ID(), Language: events.SandboxPython, Source: "print(1)", Input: json.RawMessage(`{}`),
		Stdout: events.SandboxStdoutJSON, TimeoutMS: 5000, Deadline: at.Add(time.Minute)}, fx.Trace))
	add(events.NewSandboxResult(Source, events.SandboxResult{RunID: fx.RunID, CallID: env.CallID,
		Output: json.RawMessage(`1`)}, fx.Tenant.ID(), fx.Trace))
	return outs
}

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
	// Envelopes are the run's tool call receipts in call order.
	Envelopes []envelope.ToolEnvelope
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

// CompletedRun builds a run of two iterations: the model asks for two tool
// calls at once (web_search succeeds, fetch_page times out), then answers.
// Its events start at base.
func CompletedRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run

	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	b.iteration(1, 0)
	inputA := json.RawMessage(`{"query": "weather in Paris", "max_results": 3}`)
	inputB := json.RawMessage(`{"url":"https://example.com/forecast"}`)
	reqA := b.callRequest(1, 1, "web_search", "1.2.0", inputA)
	reqB := b.callRequest(2, 1, "fetch_page", "2.0.0", inputB)
	b.turn(1, envelope.ModelResponse{
		ToolCalls: []envelope.ToolCall{
			{ID: "tc_1", Name: "web_search", Arguments: inputA},
			{ID: "tc_2", Name: "fetch_page", Arguments: inputB},
		},
		StopReason: "tool_use",
		Usage:      envelope.Usage{InputTokens: 120, OutputTokens: 30},
	})
	b.add(events.NewCallRequest(Source, "requested", reqA, r.Trace))
	b.add(events.NewCallRequest(Source, "requested", reqB, r.Trace))
	b.add(events.NewCallRequest(Source, "approved", reqA, r.Trace))
	b.add(events.NewCallRequest(Source, "approved", reqB, r.Trace))
	tA, tB := b.next(), b.next()
	b.add(events.NewCallStarted(Source, events.CallStarted{RunID: runID, CallID: reqA.CallID, Name: reqA.Name,
		Version: reqA.Version, TStart: tA, Executor: "executor-0"}, tenant, r.Trace))
	b.add(events.NewCallStarted(Source, events.CallStarted{RunID: runID, CallID: reqB.CallID, Name: reqB.Name,
		Version: reqB.Version, TStart: tB, Executor: "executor-1"}, tenant, r.Trace))
	envA := envelope.ToolEnvelope{CallID: reqA.CallID, Name: reqA.Name, Version: reqA.Version, Input: inputA,
		Output: json.RawMessage(`{"results":[{"title":"Paris: sunny, 21°C","url":"https://example.com/paris"}]}`),
		TStart: tA, TEnd: tA.Add(42 * time.Millisecond), Cached: true}
	envB := envelope.ToolEnvelope{CallID: reqB.CallID, Name: reqB.Name, Version: reqB.Version, Input: inputB,
		Error:  &envelope.ToolError{Code: envelope.CodeTimeout, Message: "fetch_page did not answer within 5s", RetryAfterS: 2},
		TStart: tB, TEnd: tB.Add(5 * time.Second)}
	b.add(events.NewCallCompleted(Source, runID, envA, tenant, r.Trace))
	b.add(events.NewCallCompleted(Source, runID, envB, tenant, r.Trace))
	r.Envelopes = []envelope.ToolEnvelope{envA, envB}
	b.iteration(2, 2)
	b.turn(2, envelope.ModelResponse{Content: "It is sunny in Paris, 21°C.", StopReason: "end_turn",
		Usage: envelope.Usage{InputTokens: 300, OutputTokens: 12}})
	out := envelope.NewAgentOutputs("It is sunny in Paris, 21°C.", r.Envelopes, "http://jaeger:16686/trace/"+r.Trace.TraceID())
	r.Outputs = &out
	r.Iterations = 2
	done := b.status(events.StatusCompleted)
	done.Outputs = &out
	done.Iteration, done.ToolCalls = 2, 2
	done.Spend, r.Spend = 0.0123, 0.0123
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
// tool, with pinned handles on its agent node (none of which can select
// anything).
func AnsweredRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time, pins []envelope.PinnedHandle) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run
	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	b.iteration(1, 0)
	b.turn(1, envelope.ModelResponse{Content: "No search needed.", StopReason: "end_turn",
		Usage: envelope.Usage{InputTokens: 50, OutputTokens: 5}})
	out := envelope.NewAgentOutputs("No search needed.", nil, "")
	r.Outputs = &out
	r.Iterations = 1
	done := b.status(events.StatusCompleted)
	done.Outputs = &out
	done.Iteration = 1
	done.Spend, r.Spend = 0.001, 0.001
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

// FailedRun builds a run that starts, passes its first iteration check and
// then fails with reason.
func FailedRun(t testing.TB, runID, agent string, tenant envelope.Tenant, base time.Time, reason string) *Run {
	t.Helper()
	b := newBuilder(t, runID, agent, tenant, base)
	r := b.run
	r.Reason = reason
	r.Iterations = 1
	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	b.add(events.NewRunStatus(Source, b.status(events.StatusStarted), "", r.Trace))
	b.iteration(1, 0)
	failed := b.status(events.StatusFailed)
	failed.Reason = reason
	failed.Iteration = 1
	b.add(events.NewRunStatus(Source, failed, "", r.Trace))
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
}

func (b *builder) status(s string) events.RunStatus {
	return events.RunStatus{RunID: b.run.RunID, Status: s, Agent: b.run.Agent, Tenant: b.run.Tenant,
		TraceID: b.run.Trace.TraceID()}
}

func (b *builder) iteration(n, toolCalls int) {
	r := b.run
	spend := 0.005 * float64(n-1) // what the turns before cost
	b.add(events.NewIterationRequested(Source, events.IterationCheck{RunID: r.RunID, Iteration: n, Tenant: r.Tenant,
		Agent: r.Agent, Policy: r.Request.Agent.Policy, ToolCalls: toolCalls, Spend: spend}, r.Trace))
	b.add(events.NewVerdict(Source, events.Verdict{RunID: r.RunID, Iteration: n, Allowed: true}, r.Tenant, r.Trace))
}

func (b *builder) turn(n int, resp envelope.ModelResponse) {
	r := b.run
	start := b.at
	b.add(events.NewLLMCompleted(Source, events.LLMCompleted{RunID: r.RunID, Turn: envelope.ModelTurn{
		Iteration: n, Model: r.Request.Agent.Model, Messages: r.Request.Messages,
		Tools: r.Request.Agent.EnabledTools, Response: resp, TStart: start, TEnd: start.Add(time.Millisecond),
	}}, r.Tenant, r.Trace))
}

func (b *builder) callRequest(seq, iteration int, name, version string, input json.RawMessage) events.CallRequest {
	b.t.Helper()
	id, err := envelope.CallID(name, version, input, seq)
	if err != nil {
		b.t.Fatalf("storetest: call id: %v", err)
	}
	r := b.run
	return events.CallRequest{RunID: r.RunID, CallID: id, Seq: seq, Iteration: iteration, Name: name,
		Version: version, Input: input, ProviderCallID: fmt.Sprintf("tc_%d", seq), Tenant: r.Tenant,
		Agent: r.Agent, EnabledTools: r.Request.Agent.EnabledTools, Policy: r.Request.Agent.Policy}
}

// SideEvents returns events of fx's first call that other services add
// around it: an approval request and its decision, the call's usage record,
// and a sandbox job and its result. Their times follow the run's last event.
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
	add(events.NewUsage(Source, events.Usage{RunID: fx.RunID, N: 1, Kind: events.UsageKindTool, Tenant: fx.Tenant,
		Agent: fx.Agent, Iteration: 1, Tool: env.Name + "@" + env.Version, CallID: env.CallID, Cost: 0.01, Billed: true}, fx.Trace))
	add(events.NewSandboxJob(Source, events.SandboxJob{RunID: fx.RunID, CallID: env.CallID, Tool: env.Name + "@" + env.Version,
		TenantID: fx.Tenant.ID(), Language: events.SandboxPython, Source: "print(1)", Input: json.RawMessage(`{}`),
		Stdout: events.SandboxStdoutJSON, TimeoutMS: 5000, Deadline: at.Add(time.Minute)}, fx.Trace))
	add(events.NewSandboxResult(Source, events.SandboxResult{RunID: fx.RunID, CallID: env.CallID,
		Output: json.RawMessage(`1`)}, fx.Tenant.ID(), fx.Trace))
	return outs
}

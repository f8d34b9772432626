package events_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// t0 is the fixed time of every fixture.
var t0 = time.Date(2025, 3, 14, 9, 26, 53, 589793000, time.UTC)

var (
	tenant = envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "u-42"}
	// runTrace is a valid W3C trace context with a vendor trace state.
	runTrace = events.RunTrace{
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		TraceState:  "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
	}
	policy = envelope.Policy{MaxIterations: 5, MaxToolCalls: 10, MaxBudget: 2.5,
		SideEffects: envelope.SideEffectsReads, Scopes: []string{"web:read"}}
)

func fixtureRunRequest() envelope.RunRequest {
	return envelope.RunRequest{
		RunID:  runID,
		Tenant: tenant,
		Agent: envelope.Agent{
			Name:         "researcher",
			Model:        envelope.Model{Provider: "scripted", Name: "script-1", MaxTokens: 1024},
			SystemPrompt: "You are a careful researcher.",
			EnabledTools: []string{"web_search@1.2.0"},
			Policy:       policy,
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "What is the weather in Paris?"}},
		Metadata: map[string]string{"workflow": "wf-1"},
	}
}

func fixtureCallRequest() events.CallRequest {
	return events.CallRequest{
		RunID: runID, CallID: callID, Seq: 1, Iteration: 1,
		Name: "web_search", Version: "1.2.0", Input: json.RawMessage(`{"query":"weather in Paris"}`),
		ProviderCallID: "call_1", Tenant: tenant, Agent: "researcher", Queue: envelope.DefaultQueue,
	}
}

func fixtureTurnEvent() events.Turn {
	resp := envelope.ModelResponse{StopReason: "tool_use", Usage: envelope.Usage{InputTokens: 10, OutputTokens: 2},
		ToolCalls: []envelope.ToolCall{{ID: "call_1", Name: "web_search", Arguments: json.RawMessage(`{"query":"weather in Paris"}`)}}}
	return events.Turn{
		RunID: runID, Iteration: 2, Tenant: tenant, Agent: "researcher",
		Verdict: events.LoopVerdict{Allowed: true}, Model: events.ModelRef{Provider: "scripted", Name: "script-1"},
		Tools: []string{"web_search@1.2.0"}, Results: []events.TurnResult{{CallID: callID, ProviderCallID: "call_0"}},
		Response: &resp, Cost: 0.0001, TStart: t0, TEnd: t0.Add(time.Second),
		Policy: policy, EnabledTools: []string{"web_search@1.2.0"}, Spend: 0.25,
		Calls: []events.TurnCall{{CallID: callID, Seq: 2, Name: "web_search", Version: "1.2.0",
			Input: json.RawMessage(`{"query":"weather in Paris"}`), ProviderCallID: "call_1", Cost: 0.01, Queue: "default"}},
	}
}

func fixtureEnvelope() envelope.ToolEnvelope {
	return envelope.ToolEnvelope{
		CallID: callID, Name: "web_search", Version: "1.2.0",
		Input:  json.RawMessage(`{"query":"weather in Paris"}`),
		Output: json.RawMessage(`{"results":[]}`),
		TStart: t0, TEnd: t0.Add(250 * time.Millisecond),
	}
}

func fixtureTurn() envelope.ModelTurn {
	return envelope.ModelTurn{
		Iteration: 2,
		Model:     envelope.Model{Provider: "scripted", Name: "script-1"},
		Messages:  []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}},
		Tools:     []string{"web_search@1.2.0"},
		Response:  envelope.ModelResponse{Content: "hello", StopReason: "end_turn", Usage: envelope.Usage{InputTokens: 10, OutputTokens: 2}},
		TStart:    t0, TEnd: t0.Add(time.Second),
	}
}

// constructed is one event made by a New* constructor, with what it must carry.
type constructed struct {
	name    string
	out     events.Outgoing
	typ     string
	id      string
	subject string
	callID  string
	data    any // a pointer to a zero value of the data's Go type
}

// constructedOut is the event allConstructors makes under name.
func constructedOut(t testing.TB, name string) events.Outgoing {
	t.Helper()
	for _, c := range allConstructors(t) {
		if c.name == name {
			return c.out
		}
	}
	t.Fatalf("allConstructors makes no %q", name)
	return events.Outgoing{}
}

// allConstructors builds one event with every New* constructor of event.go
// (every run status, both verdicts, both call request verbs).
func allConstructors(t testing.TB) []constructed {
	t.Helper()
	const src = "/toolwire/test"
	must := func(o events.Outgoing, err error) events.Outgoing {
		t.Helper()
		require.NoError(t, err)
		return o
	}
	run := "toolwire.run." + runID
	call := "toolwire.call." + runID + "." + callID
	cs := []constructed{
		{"run requested", must(events.NewRunRequested(src, fixtureRunRequest(), runTrace)),
			events.TypeRunRequested, runID + "/requested", run + ".requested", "", new(envelope.RunRequest)},
	}
	for _, st := range []struct{ status, typ, disc string }{
		{events.StatusStarted, events.TypeRunStarted, ""},
		{events.StatusSuspended, events.TypeRunSuspended, "2"},
		{events.StatusResumed, events.TypeRunResumed, "2"},
		{events.StatusCompleted, events.TypeRunCompleted, ""},
		{events.StatusFailed, events.TypeRunFailed, ""},
		{events.StatusCancelled, events.TypeRunCancelled, ""},
	} {
		s := events.RunStatus{RunID: runID, Status: st.status, Agent: "researcher", Tenant: tenant,
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Iteration: 2, ToolCalls: 1}
		if st.status == events.StatusCompleted {
			o := envelope.NewAgentOutputs("sunny", []envelope.ToolEnvelope{fixtureEnvelope()}, "")
			s.Outputs = &o
		}
		if st.status == events.StatusFailed {
			s.Reason = "model unavailable"
		}
		if st.status == events.StatusCancelled {
			cut := fixtureEnvelope()
			cut.CallID, cut.Input = strings.Repeat("b", 64), json.RawMessage(`{"query":"weather in Lyon"}`)
			cut.Output, cut.Error = nil, events.CancelledCallError(true, "cancelled by ops@acme: runaway")
			o := envelope.NewAgentOutputs("", []envelope.ToolEnvelope{fixtureEnvelope(), cut}, "")
			s.Outputs, s.Reason = &o, "cancelled by ops@acme: runaway"
		}
		id := runID + "/" + st.status
		if st.disc != "" {
			id += "/" + st.disc
		}
		if events.IsEndStatus(st.status) {
			id = runID + "/end" // one id for every end: a second is a duplicate
		}
		cs = append(cs, constructed{"run " + st.status, must(events.NewRunStatus(src, s, st.disc, runTrace)),
			st.typ, id, run + "." + st.status, "", new(events.RunStatus)})
	}
	denied := events.Turn{RunID: runID, Iteration: 11, Tenant: tenant, Agent: "researcher", TStart: t0, TEnd: t0,
		Verdict: events.LoopVerdict{Code: envelope.CodePolicyDenied, Reason: "max_iterations (10) reached", Rule: "max_iterations"},
		Model:   events.ModelRef{Provider: "scripted", Name: "script-1"}, Policy: policy, Spend: 0.5}
	cs = append(cs,
		constructed{"turn completed", must(events.NewTurnCompleted(src, fixtureTurnEvent(), runTrace)),
			events.TypeTurnCompleted, runID + "/turn/2", run + ".turn.2.completed", "", new(events.Turn)},
		constructed{"turn denied", must(events.NewTurnCompleted(src, denied, runTrace)),
			events.TypeTurnCompleted, runID + "/turn/11", run + ".turn.11.completed", "", new(events.Turn)},
		constructed{"call approved", must(events.NewCallApproved(src, fixtureCallRequest(), runTrace)),
			events.TypeCallApproved, runID + "/" + callID + "/approved", call + ".approved.default", callID, new(events.CallRequest)},
		constructed{"call started", must(events.NewCallStarted(src, events.CallStarted{RunID: runID, CallID: callID, Name: "web_search", Version: "1.2.0", TStart: t0, Executor: "executor-1"}, tenant, runTrace)),
			events.TypeCallStarted, runID + "/" + callID + "/started", call + ".started", callID, new(events.CallStarted)},
		constructed{"call completed", must(events.NewCallCompleted(src, runID, fixtureEnvelope(), tenant, runTrace)),
			events.TypeCallCompleted, runID + "/" + callID + "/completed", call + ".completed", callID, new(envelope.ToolEnvelope)},
		constructed{"call started with secrets", must(events.NewCallStarted(src, events.CallStarted{RunID: runID, CallID: callID, Name: "web_search", Version: "1.2.0", TStart: t0,
			SecretScopes: map[string]string{"SEARCH_KEY": "org"}, Warnings: []string{"secret SEARCH_KEY fell back to org scope"}}, tenant, runTrace)),
			events.TypeCallStarted, runID + "/" + callID + "/started", call + ".started", callID, new(events.CallStarted)},
		constructed{"approval required", must(events.NewApprovalRequired(src, fixtureApprovalRequest(), runTrace)),
			events.TypeCallApprovalRequired, runID + "/" + callID + "/approval_required", call + ".approval_required", callID, new(events.ApprovalRequest)},
		constructed{"cancel requested", must(events.NewCancelRequested(src, events.CancelRequest{RunID: runID, Reason: "runaway", By: "ops@acme", Tenant: tenant, RequestedAt: t0}, runTrace)),
			events.TypeRunCancelRequested, runID + "/cancel_requested", run + ".cancel_requested", "", new(events.CancelRequest)},
		constructed{"decided", must(events.NewDecided(src, events.Decision{RunID: runID, CallID: callID, Decision: events.DecisionRevise, Note: "search the French sources", By: "ops@acme"}, tenant, runTrace)),
			events.TypeCallDecided, runID + "/" + callID + "/decided/revise", call + ".decided", callID, new(events.Decision)},
	)
	return cs
}

// requireSameEvent checks that got carries exactly want's attributes,
// extensions (compared in their canonical string form, which is all that
// binary mode can carry) and data bytes.
func requireSameEvent(t testing.TB, want, got *event.Event) {
	t.Helper()
	requireSameAttributes(t, want, got)
	require.True(t, bytes.Equal(want.Data(), got.Data()), "data: want %q, got %q", want.Data(), got.Data())
}

// requireSameEventJSON is requireSameEvent for a trip through structured mode,
// where JSON data is a JSON value whose insignificant whitespace is not kept.
func requireSameEventJSON(t testing.TB, want, got *event.Event) {
	t.Helper()
	requireSameAttributes(t, want, got)
	mt := want.DataMediaType()
	if (mt == "" || mt == event.ApplicationJSON || mt == event.TextJSON) && json.Valid(want.Data()) {
		require.JSONEq(t, string(want.Data()), string(got.Data()), "data")
		return
	}
	require.True(t, bytes.Equal(want.Data(), got.Data()), "data: want %q, got %q", want.Data(), got.Data())
}

func requireSameAttributes(t testing.TB, want, got *event.Event) {
	t.Helper()
	require.NotNil(t, got)
	require.Equal(t, want.SpecVersion(), got.SpecVersion(), "specversion")
	require.Equal(t, want.ID(), got.ID(), "id")
	require.Equal(t, want.Source(), got.Source(), "source")
	require.Equal(t, want.Type(), got.Type(), "type")
	require.Equal(t, want.Subject(), got.Subject(), "subject")
	require.Equal(t, want.DataSchema(), got.DataSchema(), "dataschema")
	require.Equal(t, want.DataContentType(), got.DataContentType(), "datacontenttype")
	require.True(t, want.Time().Equal(got.Time()), "time: want %s, got %s", want.Time(), got.Time())
	require.Equal(t, extStrings(t, want), extStrings(t, got), "extensions")
}

func extStrings(t testing.TB, e *event.Event) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range e.Extensions() {
		s, err := types.Format(v)
		require.NoError(t, err, "extension %s", k)
		out[k] = s
	}
	return out
}

func fixtureApprovalRequest() events.ApprovalRequest {
	return events.ApprovalRequest{
		RunID: runID, CorrelationID: callID, ToolName: "web_search", ToolVersion: "1.2.0", AgentName: "researcher",
		Tenant: tenant, ArgsSummary: `{"query":"weather in Paris"}`, EffectDescription: "Searches the web (reads external data).",
		Reason: "the policy requires approval for tool web_search", Preview: &events.ApprovalPreview{Output: json.RawMessage(`{"results":[]}`)},
		ExpiresAt: t0.Add(15 * time.Minute),
	}
}

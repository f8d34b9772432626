package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Deciders of ApprovalRun: the one whose decision the guard applied, and
// the one whose later decision it ignored.
const (
	FirstDecider = "alice"
	LateDecider  = "mallory"
)

// ApprovalRun builds a run whose one call (send_email) waits for an
// operator's approval: FirstDecider decides first, the Policy Guard
// applies that decision and publishes its outcome (the call approved to its
// queue and then completed, or its POLICY_DENIED completion, as
// services/policy/approvals.go writes them), and then LateDecider's
// decision late comes in, which the guard ignored. The run is started and
// has not ended. Its events start at base.
func ApprovalRun(t testing.TB, runID string, tenant envelope.Tenant, base time.Time, first, late events.DecisionKind) *Run {
	t.Helper()
	b := newBuilder(t, runID, "mailer", tenant, base)
	r := b.run
	r.Request.Agent.EnabledTools = []string{"send_email@1.0.0"}
	b.add(events.NewRunRequested(Source, r.Request, r.Trace))
	input := json.RawMessage(`{"to":"bob@example.com","subject":"hi"}`)
	call := b.turnCall(1, "send_email", "1.0.0", input, 0, "")
	b.turn(1, &envelope.ModelResponse{ToolCalls: []envelope.ToolCall{{ID: "tc_1", Name: "send_email", Arguments: input}},
		StopReason: "tool_use"}, 0.001, nil, call)
	req := b.approved(1, call)
	b.add(events.NewApprovalRequired(Source, events.ApprovalRequest{RunID: runID, CorrelationID: call.CallID,
		ToolName: call.Name, ToolVersion: call.Version, AgentName: r.Agent, Tenant: tenant,
		ArgsSummary: string(input), EffectDescription: "sends an email", Reason: "policy requires approval for writes",
		ExpiresAt: base.Add(time.Hour)}, r.Trace))
	decision := func(k events.DecisionKind, by string) events.Decision {
		d := events.Decision{RunID: runID, CallID: call.CallID, Decision: k, By: by}
		if k != events.DecisionApprove {
			d.Note = "not to " + by + "'s liking"
		}
		return d
	}
	applied := decision(first, FirstDecider)
	b.add(events.NewDecided(Source, applied, tenant, r.Trace))
	at := b.next()
	if first == events.DecisionApprove {
		req.OperatorApproved = true
		b.add(events.NewCallApproved(Source, req, r.Trace))
		env := envelope.ToolEnvelope{CallID: call.CallID, Name: call.Name, Version: call.Version, Input: input,
			Output: json.RawMessage(`{"sent":true}`), TStart: at, TEnd: at.Add(time.Millisecond)}
		b.add(events.NewCallCompleted(Source, runID, env, tenant, r.Trace))
		r.Envelopes = append(r.Envelopes, env)
	} else {
		kind, msg := "deny", "approval denied"
		if first == events.DecisionRevise {
			kind, msg = "revise", "revision requested"
		}
		env := envelope.ToolEnvelope{CallID: call.CallID, Name: call.Name, Version: call.Version, Input: input,
			Error: &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: msg + " by " + FirstDecider + ": " + applied.Note,
				Details: map[string]any{"approval": kind, "by": FirstDecider, "note": applied.Note}},
			TStart: at, TEnd: at}
		b.add(events.NewCallCompleted(Source, runID, env, tenant, r.Trace))
		r.Envelopes = append(r.Envelopes, env)
	}
	b.add(events.NewDecided(Source, decision(late, LateDecider), tenant, r.Trace))
	r.Queues = []string{req.Queue}
	r.Iterations = 1
	return r
}

// CallEvents are the recorded events of one call of a run, in recorded
// order, or fails t.
func CallEvents(t testing.TB, s store.Store, runID, callID string) []store.EventRow {
	t.Helper()
	evs, err := s.Events(ctx(t), runID)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.EventRow
	for _, e := range evs {
		if e.CallID == callID {
			out = append(out, e)
		}
	}
	return out
}

// runApprovalContract: what a store keeps of a call's approval shows the
// decision the guard applied, not the last one recorded (issue 29).
func runApprovalContract(t *testing.T, newStore func(t *testing.T) store.Store) {
	for _, c := range []struct {
		first, late events.DecisionKind
		state       string
	}{
		{events.DecisionDeny, events.DecisionApprove, store.ApprovalDenied},
		{events.DecisionApprove, events.DecisionDeny, store.ApprovalApproved},
		{events.DecisionRevise, events.DecisionApprove, store.ApprovalRevised},
	} {
		t.Run("ALate"+string(c.late)+"After"+string(c.first)+"IsIgnored", func(t *testing.T) {
			s := newStore(t)
			fx := ApprovalRun(t, "run-approval", TenantA, Base, c.first, c.late)
			mustWrite(t, s, fx.Records(t)...)
			a := store.ApprovalOf(CallEvents(t, s, fx.RunID, fx.Envelopes[0].CallID))
			if a.State != c.state || a.Applied == nil || a.Applied.By != FirstDecider || a.Applied.Decision != string(c.first) ||
				a.Applied.Event == "" || len(a.Ignored) != 1 || a.Ignored[0].By != LateDecider || len(a.Awaiting) != 0 {
				t.Fatalf("approval = %+v, want %s by %s applied and %s's %s ignored", a, c.state, FirstDecider, LateDecider, c.late)
			}
		})
	}
}

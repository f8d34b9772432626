package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/policy/pii"
)

// writer is a tool that writes, registered for the approval tests.
func writerDef() envelope.ToolDefinition {
	d := toolDef("send_email", "1.0.0")
	d.Description = "Sends an email"
	d.Metadata.SideEffects = envelope.SideEffectsWrites
	d.SupportsPreview = true
	return d
}

func approvalHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarnessConfig(t, Config{Concurrency: 4, ApprovalSweep: 20 * time.Millisecond, PreviewTimeout: time.Second})
	require.NoError(t, h.reg.Put(t.Context(), registry.Entry{Definition: writerDef()}))
	ref := envelope.ToolRef{Name: "send_email", Version: "1.0.0"}
	require.Eventually(t, func() bool {
		_, ok := h.svc.catalog.Lookup(ref)
		return ok
	}, waitFor, 5*time.Millisecond)
	return h
}

var approvalPolicy = envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}, ApprovalTimeoutS: 60}

func (h *harness) decide(d events.Decision) {
	h.t.Helper()
	h.publish(events.NewDecided("/toolwire/cli", d, tenant, events.RunTrace{}))
}

// decideAgain publishes a decision under another event id, as one published
// after the stream's duplicate window would be.
func (h *harness) decideAgain(d events.Decision) {
	h.t.Helper()
	out, err := events.NewDecided("/toolwire/cli", d, tenant, events.RunTrace{})
	require.NoError(h.t, err)
	out.Event.SetID(out.Event.ID() + "/later")
	require.NoError(h.t, h.pub.Publish(h.t.Context(), out))
}

func (h *harness) record(runID, callID string) events.ApprovalRecord {
	h.t.Helper()
	key, err := events.ApprovalKey(runID, callID)
	require.NoError(h.t, err)
	e, err := h.svc.approvals.Get(h.t.Context(), key)
	require.NoError(h.t, err)
	rec, err := events.DecodeApprovalRecord(e.Value())
	require.NoError(h.t, err)
	return rec
}

// An approval request carries what the operator needs, and the call waits:
// then each decision has its outcome.
func TestApprovalDecisions(t *testing.T) {
	h := approvalHarness(t)
	tests := []struct {
		name     string
		decision events.Decision
		state    events.ApprovalState
		message  string // "" when approved
		details  map[string]any
	}{
		{name: "approve", decision: events.Decision{Decision: events.DecisionApprove, By: "alice"}, state: events.ApprovalApproved},
		{name: "deny", decision: events.Decision{Decision: events.DecisionDeny, By: "alice", Note: "not to customers"},
			state: events.ApprovalDenied, message: "approval denied by alice: not to customers",
			details: map[string]any{"approval": "deny", "by": "alice", "note": "not to customers"}},
		{name: "deny without a note", decision: events.Decision{Decision: events.DecisionDeny},
			state: events.ApprovalDenied, message: "approval denied", details: map[string]any{"approval": "deny"}},
		{name: "revise", decision: events.Decision{Decision: events.DecisionRevise, By: "bob", Note: "send it to the team list instead"},
			state: events.ApprovalRevised, message: "revision requested by bob: send it to the team list instead",
			details: map[string]any{"approval": "revise", "by": "bob", "note": "send it to the team list instead"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runID := "run-appr-" + string(rune('a'+i))
			req := turnCall(t, "send_email", "1.0.0", 1)
			req.Input = json.RawMessage(`{"to":"bob@example.com","password":"hunter2","body":"hello"}`)
			req.CallID = callIDOf(t, req)
			turn := newTurn(runID, 1, approvalPolicy, []string{"send_email@1.0.0"}, req)
			required := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approval_required")
			outcomes := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*", "toolwire.call."+runID+".*.completed")
			before := time.Now()
			h.publishTurn(turn)

			ev := h.nextEvent(required)
			require.Equal(t, events.TypeCallApprovalRequired, ev.Type())
			require.Equal(t, runID+"/"+req.CallID+"/approval_required", ev.ID())
			require.NoError(t, h.schemas.Validate(events.SchemaApprovalRequest, ev.Data()))
			ar := decode[events.ApprovalRequest](t, ev)
			require.Equal(t, req.CallID, ar.CorrelationID, "the call id is the correlation id")
			require.Equal(t, "send_email", ar.ToolName)
			require.Equal(t, "1.0.0", ar.ToolVersion)
			require.Equal(t, "researcher", ar.AgentName)
			require.Equal(t, tenant, ar.Tenant)
			require.Equal(t, `{"body":"hello","password":"[redacted]","to":"[email]"}`, ar.ArgsSummary)
			require.Equal(t, "Calls send_email@1.0.0. Sends an email. It writes: it changes external state, and runs at most once for this call.", ar.EffectDescription)
			require.Equal(t, "the policy requires approval for tools that write, and send_email@1.0.0 writes", ar.Reason)
			require.Equal(t, &events.ApprovalPreview{Unavailable: "preview unavailable: no executor answers preview requests"}, ar.Preview,
				"the tool supports previews, but no executor runs here")
			require.WithinRange(t, ar.ExpiresAt, before.Add(59*time.Second), time.Now().Add(61*time.Second))
			require.NotContains(t, string(ev.Data()), "hunter2")

			// The call waits: nothing else is published for it.
			pending := h.record(runID, req.CallID)
			require.True(t, pending.Pending())
			require.Equal(t, ar.ExpiresAt, pending.Deadline)
			require.Equal(t, time.Minute, pending.Deadline.Sub(pending.RequestedAt), "the record says how long the operator has")
			require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.*"))

			d := tt.decision
			d.RunID, d.CallID = runID, req.CallID
			h.decide(d)
			ev = h.nextEvent(outcomes)
			if tt.message == "" {
				require.Equal(t, events.TypeCallApproved, ev.Type())
				require.Equal(t, runID+"/"+req.CallID+"/approved", ev.ID())
				sent := wantApproved(t, turn, req, "default")
				sent.OperatorApproved, sent.Gate = true, autoMedium
				require.Equal(t, sent, decode[events.CallRequest](t, ev), "the approved call is the turn's call, marked as an operator's approval")
			} else {
				require.Equal(t, events.TypeCallCompleted, ev.Type())
				env := decode[envelope.ToolEnvelope](t, ev)
				require.NoError(t, h.schemas.Validate(envelope.SchemaToolEnvelope, ev.Data()))
				require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
				require.Equal(t, tt.message, env.Error.Message)
				require.Equal(t, tt.details, env.Error.Details)
				require.Equal(t, req.CallID, env.CallID)
			}
			servicetest.PollUntil(t, waitFor, "the record is settled", func() bool {
				rec := h.record(runID, req.CallID)
				return rec.State == tt.state && rec.Settled
			})
			rec := h.record(runID, req.CallID)
			require.Equal(t, &d, rec.Decision)

			// The same decision again within the duplicate window is dropped
			// by the stream (one decided event per call and decision); an
			// opposite one is stored, for the call's audit to show it ignored,
			// and ignored by the guard, as is a later one: nothing more is
			// published.
			h.decide(d)
			require.Equal(t, uint64(1), h.count(events.StreamCalls, "toolwire.call."+runID+".*.decided"))
			h.decide(events.Decision{RunID: runID, CallID: req.CallID, Decision: events.DecisionApprove, By: "mallory"})
			decided := uint64(2)
			if d.Decision == events.DecisionApprove {
				decided = 1
			}
			require.Equal(t, decided, h.count(events.StreamCalls, "toolwire.call."+runID+".*.decided"))
			h.decideAgain(events.Decision{RunID: runID, CallID: req.CallID, Decision: events.DecisionApprove, By: "mallory"})
			require.Eventually(t, func() bool {
				return testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues(approvalIgnored)) >= float64(i+1)
			}, waitFor, 5*time.Millisecond)
			require.Equal(t, uint64(1), h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")+
				h.count(events.StreamCalls, "toolwire.call."+runID+".*.completed"))
			require.Equal(t, tt.state, h.record(runID, req.CallID).State)
		})
	}
	require.Equal(t, 4.0, testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues(approvalRequested)))
	require.Equal(t, 1.0, testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues("approved")))
	require.Equal(t, 2.0, testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues("denied")))
	require.Equal(t, 1.0, testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues("revised")))
}

// No decision by the deadline is a denial; a decision after it is ignored.
func TestApprovalTimeout(t *testing.T) {
	h := approvalHarness(t)
	const runID = "run-appr-timeout"
	p := approvalPolicy
	p.ApprovalTimeoutS = 1
	req := turnCall(t, "send_email", "1.0.0", 1)
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
	h.publishTurn(newTurn(runID, 1, p, []string{"send_email@1.0.0"}, req))

	env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
	require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
	require.Equal(t, "approval timed out: no decision within 1s", env.Error.Message)
	rec := h.record(runID, req.CallID)
	require.Equal(t, events.ApprovalExpired, rec.State)
	require.Equal(t, map[string]any{"approval": "timeout", "deadline": rec.Deadline.UTC().Format(time.RFC3339Nano)}, env.Error.Details)
	require.False(t, env.TStart.Before(rec.Deadline), "denied at or after the deadline, never before")

	h.decide(events.Decision{RunID: runID, CallID: req.CallID, Decision: events.DecisionApprove})
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues(approvalIgnored)) == 1
	}, waitFor, 5*time.Millisecond)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.*"))
	require.Equal(t, 1.0, testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues("expired")))
}

// A decision for a call that awaits none is ignored and logged; a malformed
// one is dead-lettered.
func TestApprovalDecisionForUnknownCall(t *testing.T) {
	h := approvalHarness(t)
	const runID = "run-appr-unknown"
	h.decide(events.Decision{RunID: runID, CallID: "abcdef", Decision: events.DecisionApprove})
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues(approvalIgnored)) == 1
	}, waitFor, 5*time.Millisecond)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.*"))
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.completed"))

	dlq := h.watch(events.StreamDLQ, consume.DLQSubject(events.StreamCalls, DurableDecisions))
	subj, err := events.CallSubject(runID, "abcdef", "decided")
	require.NoError(t, err)
	out, err := events.Build(events.TypeCallDecided, "bad-decision", subj, events.Attrs{Source: "/test", RunID: runID, CallID: "abcdef"},
		map[string]any{"run_id": runID, "call_id": "abcdef", "decision": "maybe"})
	require.NoError(t, err)
	require.NoError(t, h.pub.Publish(t.Context(), out))
	m := h.next(dlq)
	require.Contains(t, m.Headers().Get(consume.HeaderDLQError), `decision "maybe" is not one of approve, deny, revise`)
}

// A turn handled again publishes its approval request once, and does not
// restart its deadline: published again by the orchestrator, or redelivered
// by the stream.
func TestApprovalRequestIsIdempotent(t *testing.T) {
	h := approvalHarness(t)
	const runID = "run-appr-again"
	req := turnCall(t, "send_email", "1.0.0", 1)
	turn := newTurn(runID, 1, approvalPolicy, []string{"send_email@1.0.0"}, req)
	required := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approval_required")
	h.publishTurn(turn)
	h.nextEvent(required)
	first := h.record(runID, req.CallID)

	// The same turn again, under another event id (published again after
	// the duplicate window).
	out, err := events.NewTurnCompleted("/toolwire/orchestrator", turn, runTrace)
	require.NoError(t, err)
	again := out
	again.Event = out.Event.Clone()
	again.Event.SetID(out.Event.ID() + "/again")
	require.NoError(t, h.pub.Publish(t.Context(), again))
	h.drained(events.StreamRuns, DurableTurns)
	// And redelivered.
	require.NoError(t, h.svc.handleTurn(t.Context(), &consume.Delivery{Event: &out.Event, Subject: out.Subject, Attempt: 2}))

	require.Equal(t, uint64(1), h.count(events.StreamCalls, "toolwire.call."+runID+".*.approval_required"))
	require.Equal(t, uint64(1), h.count(events.StreamCalls, "toolwire.call."+runID+".>"), "nothing else is published for the call")
	require.Equal(t, first.Deadline, h.record(runID, req.CallID).Deadline)
	require.Equal(t, 1.0, testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues(approvalRequested)))
}

// A call that needs approval waits alone: the other calls of its turn run
// meanwhile, and the approved call goes to its tool's queue.
func TestApprovalHoldsOnlyItsCall(t *testing.T) {
	h := approvalHarness(t)
	const runID = "run-appr-turn"
	send := turnCall(t, "send_email", "1.0.0", 1)
	send.Queue = "mail"
	search := turnCall(t, "web_search", "1.0.0", 2)
	turn := newTurn(runID, 2, approvalPolicy, []string{"send_email@1.0.0", "web_search@1.0.0"}, send, search)
	required := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approval_required")
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	h.publishTurn(turn)

	ev, subj := h.nextEventOn(approved)
	require.Equal(t, "toolwire.call."+runID+"."+search.CallID+".approved.default", subj)
	require.Equal(t, wantApproved(t, turn, search, "default"), decode[events.CallRequest](t, ev), "the turn's other call runs at once")
	require.Equal(t, send.CallID, decode[events.ApprovalRequest](t, h.nextEvent(required)).CorrelationID)
	held := h.record(runID, send.CallID)
	require.True(t, held.Pending())
	require.Equal(t, "mail", held.Call.Queue)

	h.decide(events.Decision{RunID: runID, CallID: send.CallID, Decision: events.DecisionApprove, By: "alice"})
	ev, subj = h.nextEventOn(approved)
	require.Equal(t, "toolwire.call."+runID+"."+send.CallID+".approved.mail", subj, "the operator's approval goes to the tool's queue")
	want := wantApproved(t, turn, send, "mail")
	want.OperatorApproved, want.Gate = true, autoMedium
	require.Equal(t, want, decode[events.CallRequest](t, ev))
	require.NoError(t, h.schemas.Validate(events.SchemaCallRequest, ev.Data()))
	require.Equal(t, 1.0, testutil.ToFloat64(h.svc.metrics.verdicts.WithLabelValues(kindCall, "approved")),
		"a held call is counted by the approvals metric, not as a verdict")
}

// A record left decided but unsettled (a crash between the decision and its
// outcome) is settled by the sweeper.
func TestApprovalSweeperSettlesLeftovers(t *testing.T) {
	h := approvalHarness(t)
	const runID = "run-appr-crash"
	call := turnCall(t, "send_email", "1.0.0", 1)
	req := wantApproved(t, newTurn(runID, 1, approvalPolicy, []string{"send_email@1.0.0"}, call), call, "default")
	key, err := events.ApprovalKey(runID, req.CallID)
	require.NoError(t, err)
	decided := time.Now().Add(-time.Minute).UTC()
	rec := events.ApprovalRecord{
		State: events.ApprovalApproved, Call: req, Deadline: time.Now().Add(time.Hour),
		Decision:  &events.Decision{RunID: runID, CallID: req.CallID, Decision: events.DecisionApprove},
		DecidedAt: &decided, Trace: runTrace,
		Request: events.ApprovalRequest{RunID: runID, CorrelationID: req.CallID, ToolName: "send_email", ToolVersion: "1.0.0"},
	}
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	_, err = h.svc.approvals.Create(t.Context(), key, mustJSON(t, rec))
	require.NoError(t, err)
	ev := h.nextEvent(approved)
	req.OperatorApproved = true
	require.Equal(t, req, decode[events.CallRequest](t, ev))
	servicetest.PollUntil(t, waitFor, "the record is settled", func() bool { return h.record(runID, req.CallID).Settled })
}

func TestApprovalDeniedEnvelope(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	req := events.CallRequest{RunID: "r", CallID: "1cddb19ff260abc62231ef762d936bc03f3df400d7d6986f5a9e12f302969302", Name: "send_email", Version: "1.0.0", Input: json.RawMessage(`{}`),
		Queue: envelope.DefaultQueue}
	tests := []struct {
		name string
		rec  events.ApprovalRecord
		msg  string
	}{
		{"deny by, no note", events.ApprovalRecord{State: events.ApprovalDenied, Decision: &events.Decision{Decision: events.DecisionDeny, By: "ops"}}, "approval denied by ops"},
		{"deny note, no by", events.ApprovalRecord{State: events.ApprovalDenied, Decision: &events.Decision{Decision: events.DecisionDeny, Note: " too broad "}}, "approval denied: too broad"},
		{"revise", events.ApprovalRecord{State: events.ApprovalRevised, Decision: &events.Decision{Decision: events.DecisionRevise, Note: "smaller"}}, "revision requested: smaller"},
		{"timeout", events.ApprovalRecord{State: events.ApprovalExpired, RequestedAt: at.Add(-90 * time.Second), Deadline: at},
			"approval timed out: no decision within 1m30s"},
		{"timeout of a record that does not say when the call was held", events.ApprovalRecord{State: events.ApprovalExpired, Deadline: at},
			"approval timed out: no decision by 2026-01-02T03:04:05Z"},
	}
	schemas := testSchemas(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.rec.Call = req
			env := ApprovalDeniedEnvelope(&tt.rec, at)
			require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
			require.Equal(t, tt.msg, env.Error.Message)
			require.Equal(t, at, env.TStart)
			require.Zero(t, env.Cost, "a refused call costs nothing")
			require.NoError(t, schemas.ValidateValue(envelope.SchemaToolEnvelope, env))
		})
	}
}

func callIDOf(t *testing.T, req events.TurnCall) string {
	t.Helper()
	id, err := envelope.CallID(req.Name, req.Version, req.Input, req.Seq)
	require.NoError(t, err)
	return id
}

func TestApprovalKVErrors(t *testing.T) {
	// The record's revision guards every change.
	h := approvalHarness(t)
	key, err := events.ApprovalKey("run-x", "ab")
	require.NoError(t, err)
	rec := events.ApprovalRecord{State: events.ApprovalPending}
	_, err = h.svc.update(t.Context(), key, &rec, 42)
	require.True(t, errors.Is(err, jetstream.ErrKeyRevisionMismatch), "%v", err)
}

// TestApprovalOnlyForAValidInput: a call that needs approval but whose input
// its tool's schema refuses is answered VALIDATION_ERROR with the schema's
// problems at once: no approval is requested and none is held (the
// operator could only approve a call that then fails). A valid input of the
// same tool is held as before.
func TestApprovalOnlyForAValidInput(t *testing.T) {
	h := newHarnessConfig(t, Config{Concurrency: 4, ApprovalSweep: 20 * time.Millisecond, PreviewTimeout: time.Second})
	strict := writerDef()
	strict.Name = "send_strict"
	strict.InputSchema = json.RawMessage(`{"type":"object","required":["to"],"properties":{"to":{"type":"string","format":"email"}}}`)
	require.NoError(t, h.reg.Put(t.Context(), registry.Entry{Definition: strict}))
	const runID = "run-appr-invalid"
	bad := turnCall(t, "send_strict", "1.0.0", 1) // {"query":..., "limit":...}: no "to"
	good := events.TurnCall{Seq: 2, Name: "send_strict", Version: "1.0.0", Input: json.RawMessage(`{"to":"ops@acme.example"}`), ProviderCallID: "toolu_2"}
	var err error
	good.CallID, err = envelope.CallID(good.Name, good.Version, good.Input, good.Seq)
	require.NoError(t, err)
	turn := newTurn(runID, 1, approvalPolicy, []string{"send_strict@1.0.0"}, bad, good)
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
	required := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approval_required")
	h.publishTurn(turn)

	ev, subj := h.nextEventOn(completed)
	require.Equal(t, "toolwire.call."+runID+"."+bad.CallID+".completed", subj)
	env := decode[envelope.ToolEnvelope](t, ev)
	require.NotNil(t, env.Error)
	require.Equal(t, envelope.CodeValidation, env.Error.Code)
	require.Equal(t, "input for tool send_strict@1.0.0 does not match its input schema", env.Error.Message)
	require.Contains(t, fmt.Sprint(env.Error.Details), "to", "the schema's problems are given")
	require.NoError(t, h.schemas.Validate(envelope.SchemaToolEnvelope, ev.Data()))

	req := decode[events.ApprovalRequest](t, h.nextEvent(required))
	require.Equal(t, good.CallID, req.CorrelationID, "only the valid call awaits a decision")
	require.Equal(t, `{"to":"[email]"}`, req.ArgsSummary, "no personal data in what the operator is shown")
	key, err := events.ApprovalKey(runID, bad.CallID)
	require.NoError(t, err)
	_, err = h.svc.approvals.Get(t.Context(), key)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "nothing is held for the invalid call")
	held := h.record(runID, good.CallID)
	require.True(t, held.Pending())
}

// TestApprovalSummaryPerOrg: an org configured apart gets its own
// stripping: none here, so its operator sees the recipient.
func TestApprovalSummaryPerOrg(t *testing.T) {
	h := newHarnessConfig(t, Config{Concurrency: 4, ApprovalSweep: 20 * time.Millisecond, PreviewTimeout: time.Second,
		PII: PIIConfig{Orgs: map[string][]pii.Kind{tenant.OrgID: {}}}})
	require.NoError(t, h.reg.Put(t.Context(), registry.Entry{Definition: writerDef()}))
	const runID = "run-appr-pii-org"
	c := events.TurnCall{Seq: 1, Name: "send_email", Version: "1.0.0", Input: json.RawMessage(`{"to":"ops@acme.example","ip":"10.0.0.9"}`), ProviderCallID: "toolu_1"}
	var err error
	c.CallID, err = envelope.CallID(c.Name, c.Version, c.Input, c.Seq)
	require.NoError(t, err)
	required := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approval_required")
	h.publishTurn(newTurn(runID, 1, approvalPolicy, []string{"send_email@1.0.0"}, c))
	req := decode[events.ApprovalRequest](t, h.nextEvent(required))
	require.Equal(t, `{"ip":"10.0.0.9","to":"ops@acme.example"}`, req.ArgsSummary)
}

// autoMedium is the gate of a call of a tool that writes, without a risk
// policy, under the default autonomy: what the approved call carries.
var autoMedium = &envelope.GateVerdict{Gate: envelope.GateAuto, Autonomy: envelope.AutonomyAutonomous, Risk: envelope.RiskMedium, Source: "default"}

package orchestrator_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
)

// guard plays the Policy Guard's part in these tests, as its approvals
// feature behaves: it allows iterations and decides each call itself.
type guard struct {
	h   *harness
	ctx context.Context
}

func (g guard) allowIteration(runID string, n int) {
	g.h.t.Helper()
	g.h.next(g.ctx, events.StreamRuns, "toolwire.run."+runID+".iteration."+itoa(n)+".requested")
	out, err := events.NewVerdict("/toolwire/policy", events.Verdict{RunID: runID, Iteration: n, Allowed: true}, envelope.Tenant{OrgID: "org1"}, events.RunTrace{})
	require.NoError(g.h.t, err)
	require.NoError(g.h.t, g.h.pub.Publish(g.ctx, out))
}

// request waits for the request of the call #seq of a run, its id computed
// as the orchestrator computes it.
func (g guard) request(runID, tool string, input any, seq int) events.CallRequest {
	g.h.t.Helper()
	b, err := json.Marshal(input)
	require.NoError(g.h.t, err)
	id, err := envelope.CallID(tool, "1.0.0", b, seq)
	require.NoError(g.h.t, err)
	e := g.h.next(g.ctx, events.StreamCalls, "toolwire.call."+runID+"."+id+".requested")
	var r events.CallRequest
	require.NoError(g.h.t, json.Unmarshal(e.Data, &r))
	return r
}

func (g guard) publish(o events.Outgoing, err error) {
	g.h.t.Helper()
	require.NoError(g.h.t, err)
	require.NoError(g.h.t, g.h.pub.Publish(g.ctx, o))
}

func (g guard) approvalRequired(c events.CallRequest) {
	g.publish(events.NewApprovalRequired("/toolwire/policy", events.ApprovalRequest{
		RunID: c.RunID, CorrelationID: c.CallID, ToolName: c.Name, ToolVersion: c.Version, AgentName: c.Agent,
		Tenant: c.Tenant, ArgsSummary: string(c.Input), EffectDescription: "Writes.", Reason: "the policy requires approval",
		ExpiresAt: time.Now().Add(time.Hour),
	}, events.RunTrace{}))
}

// approve publishes the guard's own approval of a call.
func (g guard) approve(c events.CallRequest) {
	g.publish(events.NewCallRequest("/toolwire/policy", "approved", c, events.RunTrace{}))
}

// operatorApprove does what the guard does once an operator approves a call
// that waited: it publishes the call as approved, then marks its approval
// record approved and settled (which the orchestrator watches).
func (g guard) operatorApprove(c events.CallRequest) {
	g.h.t.Helper()
	c.OperatorApproved = true
	g.approve(c)
	kv, err := g.h.env.JS.KeyValue(g.ctx, events.BucketApprovals)
	require.NoError(g.h.t, err)
	key, err := events.ApprovalKey(c.RunID, c.CallID)
	require.NoError(g.h.t, err)
	rec, err := json.Marshal(events.ApprovalRecord{State: events.ApprovalApproved, Call: c, Settled: true, Deadline: time.Now().Add(time.Hour)})
	require.NoError(g.h.t, err)
	_, err = kv.Put(g.ctx, key, rec)
	require.NoError(g.h.t, err)
}

func itoa(n int) string { return string(rune('0' + n)) }

func statusOf(t *testing.T, e stored) events.RunStatus {
	t.Helper()
	var s events.RunStatus
	require.NoError(t, json.Unmarshal(e.Data, &s))
	return s
}

// A call that waits for an operator's decision suspends the run; the run holds
// nothing in memory meanwhile, so every orchestrator replica can die and a new
// one resume it when the decision arrives.
func TestSuspendedRunResumesOnAnyReplica(t *testing.T) {
	h := newHarnessWithoutPolicy(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := guard{h: h, ctx: ctx}
	// A dead replica's unacknowledged events come back after the ack wait.
	cfg := orchestrator.Config{AckWait: 2 * time.Second}
	r1, r2 := h.startOrchestrator("o1", cfg), h.startOrchestrator("o2", cfg)

	req := scripted(t, "suspend-1", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			toolCall("echo", map[string]any{"text": "needs approval"}),
			toolCall("echo", map[string]any{"text": "runs meanwhile"}),
		}},
		map[string]any{"content": "both done"},
	)
	h.submit(ctx, req)
	g.allowIteration(req.RunID, 1)
	waiting := g.request(req.RunID, "echo", map[string]any{"text": "needs approval"}, 1)
	other := g.request(req.RunID, "echo", map[string]any{"text": "runs meanwhile"}, 2)

	g.approvalRequired(waiting)
	g.approve(other)
	sus := statusOf(t, h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended"))
	require.Equal(t, "waiting for approval of call "+waiting.CallID+" (echo@1.0.0)", sus.Reason)
	h.next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+other.CallID+".completed")

	// Every replica dies while the run waits; a new one starts.
	r1.kill()
	r2.kill()
	h.startOrchestrator("o3", cfg)
	g.operatorApprove(waiting)
	res := statusOf(t, h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	// The approval and the completion it leads to race; either resumes.
	require.Contains(t, []string{"call " + waiting.CallID + " (echo@1.0.0) approved", "call " + waiting.CallID + " (echo@1.0.0) completed"},
		res.Reason)
	g.allowIteration(req.RunID, 2)
	final, err := h.wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, "both done", final.Outputs.Response)
	require.Len(t, final.Outputs.ToolOrder, 2)

	evs := h.streamEvents(ctx)[req.RunID]
	require.Len(t, ofType(evs, events.TypeRunSuspended), 1)
	require.Len(t, ofType(evs, events.TypeRunResumed), 1)
	require.Len(t, ofType(evs, events.TypeRunStarted), 1)
}

// A denial arrives as the call's POLICY_DENIED completion: the run resumes and
// the model sees why.
func TestSuspendedRunResumesOnDenial(t *testing.T) {
	h := newHarnessWithoutPolicy(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := guard{h: h, ctx: ctx}
	h.startOrchestrator("o1", orchestrator.Config{})

	req := scripted(t, "suspend-2", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			toolCall("echo", map[string]any{"text": "denied"}),
			toolCall("echo", map[string]any{"text": "fine"}),
		}},
		map[string]any{"content": "one was denied"},
	)
	h.submit(ctx, req)
	g.allowIteration(req.RunID, 1)
	calls := []events.CallRequest{
		g.request(req.RunID, "echo", map[string]any{"text": "denied"}, 1),
		g.request(req.RunID, "echo", map[string]any{"text": "fine"}, 2),
	}
	g.approvalRequired(calls[0])
	h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended")
	// A late or repeated approval request changes nothing.
	g.approvalRequired(calls[0])
	g.approve(calls[1])
	now := time.Now().UTC()
	g.publish(events.NewCallCompleted("/toolwire/policy", req.RunID, envelope.ToolEnvelope{
		CallID: calls[0].CallID, Name: "echo", Version: "1.0.0", Input: calls[0].Input,
		Error: &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "approval denied"}, TStart: now, TEnd: now,
	}, calls[0].Tenant, events.RunTrace{}))
	res := statusOf(t, h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	require.Equal(t, "call "+calls[0].CallID+" (echo@1.0.0) completed without approval: POLICY_DENIED: approval denied", res.Reason)

	g.allowIteration(req.RunID, 2)
	final, err := h.wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	denied := final.Outputs.ToolsByID[calls[0].CallID]
	require.Equal(t, envelope.CodePolicyDenied, denied.Error.Code)

	// The model's second turn saw the denial.
	var turn2 events.LLMCompleted
	for _, e := range ofType(h.streamEvents(ctx)[req.RunID], events.TypeLLMCompleted) {
		require.NoError(t, json.Unmarshal(e.Data, &turn2))
	}
	require.Equal(t, 2, turn2.Turn.Iteration)
	var toolMsgs []envelope.Message
	for _, m := range turn2.Turn.Messages {
		if m.Role == envelope.RoleTool {
			toolMsgs = append(toolMsgs, m)
		}
	}
	require.Len(t, toolMsgs, 2)
	require.True(t, toolMsgs[0].IsError)
	require.JSONEq(t, `{"error":{"code":"POLICY_DENIED","message":"approval denied"}}`, toolMsgs[0].Content)
	require.False(t, toolMsgs[1].IsError)
	require.Len(t, ofType(h.streamEvents(ctx)[req.RunID], events.TypeRunSuspended), 1)
}

// With the real Policy Guard's approvals: a call the policy holds for an
// operator suspends the run while the turn's other call runs; the operator's
// approval resumes it.
func TestSuspensionWithTheRealGuard(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h.startOrchestrator("o1", orchestrator.Config{AckWait: 2 * time.Second})
	req := scripted(t, "approval-1", []string{"echo@1.0.0", "calculator@1.0.0"},
		envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"echo"}}},
		map[string]any{"tool_calls": []any{
			toolCall("echo", map[string]any{"text": "send it"}),
			toolCall("calculator", map[string]any{"expression": "1+1"}),
		}},
		map[string]any{"content": "sent"},
	)
	h.submit(ctx, req)
	g := guard{h: h, ctx: ctx}
	held := g.request(req.RunID, "echo", map[string]any{"text": "send it"}, 1)
	calc := g.request(req.RunID, "calculator", map[string]any{"expression": "1+1"}, 2)
	h.next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+held.CallID+".approval_required")
	sus := statusOf(t, h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended"))
	require.Equal(t, "waiting for approval of call "+held.CallID+" (echo@1.0.0)", sus.Reason)
	h.next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+calc.CallID+".completed") // ran meanwhile

	g.publish(events.NewDecided("/toolwire/cli", events.Decision{RunID: req.RunID, CallID: held.CallID,
		Decision: events.DecisionApprove, By: "ops"}, req.Tenant, events.RunTrace{}))
	h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed")
	final, err := h.wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	for _, id := range final.Outputs.ToolOrder {
		require.Nil(t, final.Outputs.ToolsByID[id].Error)
	}
	evs := h.streamEvents(ctx)[req.RunID]
	require.Len(t, ofType(evs, events.TypeRunSuspended), 1)
	require.Len(t, ofType(evs, events.TypeRunResumed), 1)
}

// The orchestrator learns of an operator's approval from the guard's approval
// record (approved and settled), not from call.approved: the run resumes with
// the approval as its reason even before the call completes. The replica was
// started with a context that ended right after Start (as service.Run's ends
// after its start-up timeout): the watch of the records outlives it.
func TestSuspendedRunResumesOnTheApprovalRecord(t *testing.T) {
	h := newHarnessWithoutPolicy(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := guard{h: h, ctx: ctx}
	h.startOrchestrator("o1", orchestrator.Config{})

	req := scripted(t, "suspend-3", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{toolCall("echo", map[string]any{"text": "held"})}},
		map[string]any{"content": "done"},
	)
	h.submit(ctx, req)
	g.allowIteration(req.RunID, 1)
	held := g.request(req.RunID, "echo", map[string]any{"text": "held"}, 1)
	g.approvalRequired(held)
	h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended")

	kv, err := h.env.JS.KeyValue(ctx, events.BucketApprovals)
	require.NoError(t, err)
	key, err := events.ApprovalKey(held.RunID, held.CallID)
	require.NoError(t, err)
	rec, err := json.Marshal(events.ApprovalRecord{State: events.ApprovalApproved, Call: held, Settled: true,
		Deadline: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = kv.Put(ctx, key, rec)
	require.NoError(t, err)
	res := statusOf(t, h.next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	require.Equal(t, "call "+held.CallID+" (echo@1.0.0) approved", res.Reason)
	require.Len(t, ofType(h.streamEvents(ctx)[req.RunID], events.TypeRunResumed), 1)
	require.Zero(t, len(ofType(h.streamEvents(ctx)[req.RunID], events.TypeCallCompleted)), "the call itself was never sent on")
}

package orchestrator_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

// newHarness is a JetStream whose registry holds echo@1.0.0, as the executor
// registers it; the tests play the guard's and the executor's parts.
func newHarness(t *testing.T) *orchestratortest.Harness {
	t.Helper()
	h := orchestratortest.New(t)
	h.Register(orchestratortest.Tool("echo", "1.0.0"))
	return h
}

// A call that waits for an operator's decision suspends the run; the run holds
// nothing in memory meanwhile, so every orchestrator replica can die and a new
// one resume it when the decision arrives.
func TestSuspendedRunResumesOnAnyReplica(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	// A dead replica's unacknowledged events come back after the ack wait.
	cfg := orchestrator.Config{AckWait: 2 * time.Second}
	r1, r2 := h.Start("o1", cfg), h.Start("o2", cfg)

	req := orchestratortest.Scripted(t, "suspend-1", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("echo", map[string]any{"text": "needs approval"}),
			orchestratortest.ToolCall("echo", map[string]any{"text": "runs meanwhile"}),
		}},
		map[string]any{"content": "both done"},
	)
	h.Submit(ctx, req)
	waiting := g.Request(req.RunID, "echo", map[string]any{"text": "needs approval"}, 1)
	other := g.Request(req.RunID, "echo", map[string]any{"text": "runs meanwhile"}, 2)

	g.ApprovalRequired(waiting)
	g.Approve(other)
	g.Complete(other, json.RawMessage(`{"text":"runs meanwhile"}`))
	sus := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended"))
	require.Equal(t, "waiting for approval of call "+waiting.CallID+" (echo@1.0.0)", sus.Reason)
	h.Next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+other.CallID+".completed")

	// Every replica dies while the run waits; a new one starts.
	r1.Kill()
	r2.Kill()
	h.Start("o3", cfg)
	g.OperatorApprove(waiting)
	g.Complete(waiting, json.RawMessage(`{"text":"needs approval"}`))
	res := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	// The approval and the completion it leads to race; either resumes.
	require.Contains(t, []string{"call " + waiting.CallID + " (echo@1.0.0) approved", "call " + waiting.CallID + " (echo@1.0.0) completed"},
		res.Reason)
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, "both done", final.Outputs.Response)
	require.Len(t, final.Outputs.ToolOrder, 2)

	evs := h.StreamEvents(ctx)[req.RunID]
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunSuspended), 1)
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunResumed), 1)
	require.Len(t, orchestratortest.OfType(evs, events.TypeTurnCompleted), 1, "the final answer rides on the completed event")
	require.Len(t, orchestratortest.Turns(t, evs), 2)
	require.Empty(t, orchestratortest.OfType(evs, events.TypeRunStarted), "the first model call answered at once: no started event")
}

// A denial arrives as the call's POLICY_DENIED completion: the run resumes and
// the model sees why.
func TestSuspendedRunResumesOnDenial(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	var mu sync.Mutex
	var sent [][]envelope.Message // what the model was sent, call by call
	h.Start("o1", orchestrator.Config{Providers: orchestrator.Providers{scripted.Name: provider.Func(
		func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
			mu.Lock()
			sent = append(sent, r.Messages)
			mu.Unlock()
			return scripted.Provider{}.Complete(ctx, r)
		})}})

	req := orchestratortest.Scripted(t, "suspend-2", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("echo", map[string]any{"text": "denied"}),
			orchestratortest.ToolCall("echo", map[string]any{"text": "fine"}),
		}},
		map[string]any{"content": "one was denied"},
	)
	h.Submit(ctx, req)
	calls := []events.CallRequest{
		g.Request(req.RunID, "echo", map[string]any{"text": "denied"}, 1),
		g.Request(req.RunID, "echo", map[string]any{"text": "fine"}, 2),
	}
	g.ApprovalRequired(calls[0])
	h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended")
	// A late or repeated approval request changes nothing.
	g.ApprovalRequired(calls[0])
	g.Approve(calls[1])
	g.Complete(calls[1], json.RawMessage(`{"text":"fine"}`))
	now := time.Now().UTC()
	g.Publish(events.NewCallCompleted("/toolwire/policy", req.RunID, envelope.ToolEnvelope{
		CallID: calls[0].CallID, Name: "echo", Version: "1.0.0", Input: calls[0].Input,
		Error: &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "approval denied"}, TStart: now, TEnd: now,
	}, calls[0].Tenant, events.RunTrace{}))
	res := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	require.Equal(t, "call "+calls[0].CallID+" (echo@1.0.0) completed without approval: POLICY_DENIED: approval denied", res.Reason)

	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	denied := final.Outputs.ToolsByID[calls[0].CallID]
	require.Equal(t, envelope.CodePolicyDenied, denied.Error.Code)

	// The model's second turn saw the denial: its record lists the results
	// it was sent, and the model was sent the conversation rebuilt from the
	// run's events.
	turns := orchestratortest.Turns(t, h.StreamEvents(ctx)[req.RunID])
	require.Len(t, turns, 2)
	turn2 := turns[1]
	require.Equal(t, 2, turn2.Iteration)
	require.Equal(t, "one was denied", turn2.Response.Content)
	require.Equal(t, []events.TurnResult{
		{CallID: calls[0].CallID, ProviderCallID: calls[0].ProviderCallID, IsError: true},
		{CallID: calls[1].CallID, ProviderCallID: calls[1].ProviderCallID},
	}, turn2.Results)
	mu.Lock()
	require.Len(t, sent, 2)
	second := sent[1]
	mu.Unlock()
	var toolMsgs []envelope.Message
	for _, m := range second {
		if m.Role == envelope.RoleTool {
			toolMsgs = append(toolMsgs, m)
		}
	}
	require.Len(t, toolMsgs, 2)
	require.True(t, toolMsgs[0].IsError)
	require.JSONEq(t, `{"error":{"code":"POLICY_DENIED","message":"approval denied"}}`, toolMsgs[0].Content)
	require.False(t, toolMsgs[1].IsError)
	require.Len(t, orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeRunSuspended), 1)
}

// The orchestrator learns of an operator's approval from the guard's approval
// record (approved and settled), not from call.approved: the run resumes with
// the approval as its reason even before the call completes. The replica was
// started with a context that ended right after Start (as service.Run's ends
// after its start-up timeout): the watch of the records outlives it.
func TestSuspendedRunResumesOnTheApprovalRecord(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	h.Start("o1", orchestrator.Config{})

	req := orchestratortest.Scripted(t, "suspend-3", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "held"})}},
		map[string]any{"content": "done"},
	)
	h.Submit(ctx, req)
	held := g.Request(req.RunID, "echo", map[string]any{"text": "held"}, 1)
	g.ApprovalRequired(held)
	h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended")

	g.SettleApproval(held)
	res := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	require.Equal(t, "call "+held.CallID+" (echo@1.0.0) approved", res.Reason)
	require.Len(t, orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeRunResumed), 1)
	require.Zero(t, len(orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeCallCompleted)), "the call itself was never sent on")
}

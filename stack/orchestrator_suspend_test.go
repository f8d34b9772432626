package stack_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
)

// With the real Policy Guard's approvals: a call the policy holds for an
// operator suspends the run while the turn's other call runs; the operator's
// approval resumes it.
func TestSuspensionWithTheRealGuard(t *testing.T) {
	h := newPipeline(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h.Start("o1", orchestrator.Config{AckWait: 2 * time.Second})
	req := orchestratortest.Scripted(t, "approval-1", []string{"echo@1.0.0", "calculator@1.0.0"},
		envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"echo"}}},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("echo", map[string]any{"text": "send it"}),
			orchestratortest.ToolCall("calculator", map[string]any{"expression": "1+1"}),
		}},
		map[string]any{"content": "sent"},
	)
	h.Submit(ctx, req)
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	held := g.Request(req.RunID, "echo", map[string]any{"text": "send it"}, 1)
	calc := g.Request(req.RunID, "calculator", map[string]any{"expression": "1+1"}, 2)
	h.Next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+held.CallID+".approval_required")
	sus := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended"))
	require.Equal(t, "waiting for approval of call "+held.CallID+" (echo@1.0.0)", sus.Reason)
	h.Next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+calc.CallID+".completed") // ran meanwhile

	g.Publish(events.NewDecided("/toolwire/cli", events.Decision{RunID: req.RunID, CallID: held.CallID,
		Decision: events.DecisionApprove, By: "ops"}, req.Tenant, events.RunTrace{}))
	h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed")
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	for _, id := range final.Outputs.ToolOrder {
		require.Nil(t, final.Outputs.ToolsByID[id].Error)
	}
	evs := h.StreamEvents(ctx)[req.RunID]
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunSuspended), 1)
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunResumed), 1)
}

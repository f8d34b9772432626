package stack_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
)

func usageOf(t *testing.T, evs []orchestratortest.Stored) []events.Usage {
	t.Helper()
	var out []events.Usage
	for _, e := range orchestratortest.OfType(evs, events.TypeUsageRecorded) {
		var u events.Usage
		require.NoError(t, json.Unmarshal(e.Data, &u))
		out = append(out, u)
	}
	return out
}

func money(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// A run that would exceed max_budget stops before the call that would exceed
// it, with POLICY_DENIED and a clear reason: a tool call whose declared cost
// would cross the budget never runs, and a model call whose least cost would
// cross it is never made.
func TestBudgetStopsBeforeTheCallThatWouldExceedIt(t *testing.T) {
	var paidRuns atomic.Int32
	paid := loopTool("paid", 0.01, func(context.Context, json.RawMessage) (json.RawMessage, error) {
		paidRuns.Add(1)
		return json.RawMessage(`{"ok":true}`), nil
	})
	h := newPipeline(t, paid)
	h.Start("o1", orchestrator.Config{Prices: orchestrator.Prices{
		"scripted/priced": {InputPerMTok: 1000, OutputPerMTok: 2000},
	}})

	t.Run("tool call", func(t *testing.T) {
		req := orchestratortest.Scripted(t, "budget-tools", []string{"paid@1.0.0"}, envelope.Policy{MaxBudget: 0.025},
			map[string]any{"tool_calls": []any{
				orchestratortest.ToolCall("paid", map[string]any{"n": 1}),
				orchestratortest.ToolCall("paid", map[string]any{"n": 2}),
				orchestratortest.ToolCall("paid", map[string]any{"n": 3}),
			}},
			map[string]any{"content": "two of three"},
		)
		final := h.Run(req, time.Minute)
		require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
		require.EqualValues(t, 2, paidRuns.Load(), "the third call never ran")
		require.InDelta(t, 0.02, final.Spend, 1e-12)

		out := final.Outputs
		require.Len(t, out.ToolOrder, 3)
		for i, id := range out.ToolOrder[:2] {
			require.Nil(t, out.ToolsByID[id].Error, "call #%d", i+1)
		}
		third := out.ToolsByID[out.ToolOrder[2]]
		require.Equal(t, envelope.CodePolicyDenied, third.Error.Code)
		require.Equal(t, "max_budget (0.025) would be exceeded by call #3 (paid@1.0.0, cost 0.01): "+
			"the run has spent 0 and this turn's calls up to it cost 0.03", third.Error.Message)

		evs := h.StreamEvents(t.Context())[req.RunID]
		shape := orchestratortest.CountBySubject(evs)
		require.Zero(t, shape["toolwire.call."+req.RunID+"."+third.CallID+".approved"], "never approved")
		require.Zero(t, shape["toolwire.call."+req.RunID+"."+third.CallID+".started"], "never started")
		billed := 0.0
		for _, u := range usageOf(t, evs) {
			if u.Kind == events.UsageKindTool {
				require.Equal(t, u.CallID != third.CallID, u.Billed, u.CallID)
				billed += u.Cost
			}
		}
		require.InDelta(t, 0.02, billed, 1e-12)
	})

	t.Run("model call", func(t *testing.T) {
		req := orchestratortest.Scripted(t, "budget-model", []string{"paid@1.0.0"}, envelope.Policy{MaxBudget: 0.15},
			map[string]any{"tool_calls": []any{orchestratortest.ToolCall("paid", map[string]any{"n": 1})}},
			map[string]any{"content": "never said"},
		)
		req.Agent.Model.Name = "priced"
		req.Messages[0].Content = strings.Repeat("spend ", 70) // 420 characters: 105 tokens to the scripted model
		final := h.Run(req, time.Minute)
		require.Equal(t, events.StatusFailed, final.Status)
		require.Equal(t, envelope.CodePolicyDenied, final.Code)

		evs := h.StreamEvents(t.Context())[req.RunID]
		require.Len(t, orchestratortest.OfType(evs, events.TypeLLMCompleted), 1, "the second model call was never made")
		var turn1 events.Usage
		for _, u := range usageOf(t, evs) {
			if u.Kind == events.UsageKindModel {
				turn1 = u
			}
		}
		require.Equal(t, 105, turn1.InputTokens)
		spent := turn1.Cost + 0.01
		least := float64(turn1.InputTokens+turn1.OutputTokens) * 1000 / 1e6
		require.InDelta(t, spent, final.Spend, 1e-12)
		require.Equal(t, "policy denied iteration 2: max_budget (0.15) would be exceeded by model call 2: the run has spent "+
			money(spent)+" and the call costs at least "+money(least), final.Reason)
		require.Len(t, orchestratortest.OfType(evs, events.TypeIterationDenied), 1)
	})
}

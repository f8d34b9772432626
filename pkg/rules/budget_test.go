package rules_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/rules"
)

func TestMaxBudgetLoop(t *testing.T) {
	for _, tc := range []struct {
		name          string
		budget, spend float64
		minCost       float64
		reason        string // "" means allowed
		iteration     int
	}{
		{name: "no budget", spend: 1e9, minCost: 5},
		{name: "first call, nothing spent", budget: 1},
		{name: "within", budget: 1, spend: 0.4, minCost: 0.5},
		{name: "exactly at the budget", budget: 1, spend: 0.5, minCost: 0.5},
		{name: "float sums at the budget", budget: 0.3, spend: 0.1 + 0.2},
		{name: "zero-priced model at the budget", budget: 1, spend: 1},
		{name: "next call would pass it", budget: 1, spend: 0.8, minCost: 0.25, iteration: 3,
			reason: "max_budget (1) would be exceeded by model call 3: the run has spent 0.8 and the call costs at least 0.25"},
		{name: "already past it", budget: 0.5, spend: 0.75, iteration: 2,
			reason: "max_budget (0.5) reached: the run has spent 0.75, nothing is left for model call 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			it := max(tc.iteration, 1)
			d := rules.NewGuard().CheckLoop(rules.Loop{Iteration: it,
				Policy: envelope.Policy{MaxBudget: tc.budget}, Spend: tc.spend, MinCost: tc.minCost})
			if tc.reason == "" {
				require.True(t, d.Allowed, d.Reason)
				return
			}
			require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied, Reason: tc.reason, Rule: rules.RuleMaxBudget}, d)
		})
	}
}

// A turn that would cross the budget runs its first calls and is refused the
// rest, each refusal saying why, before any call of the turn has run.
func TestMaxBudgetCallFanOut(t *testing.T) {
	search := envelope.ToolDefinition{Name: "web_search", Version: "1.0.0", Cost: 0.02}
	g := rules.NewGuard()
	const spend = 0.05
	var allowed, denied []int
	var reasons []string
	for seq := 1; seq <= 5; seq++ {
		d := g.CheckCall(rules.Call{Seq: seq, Name: "web_search", Version: "1.0.0",
			EnabledTools: []string{"web_search@1.0.0"}, Policy: envelope.Policy{MaxBudget: 0.1},
			Spend: spend, Cost: 0.02, CostBefore: float64(seq-1) * 0.02,
			Tool: &search, State: envelope.ToolActive})
		if d.Allowed {
			allowed = append(allowed, seq)
			continue
		}
		denied = append(denied, seq)
		require.Equal(t, rules.RuleMaxBudget, d.Rule)
		require.Equal(t, envelope.CodePolicyDenied, d.Code)
		reasons = append(reasons, d.Reason)
	}
	require.Equal(t, []int{1, 2}, allowed)
	require.Equal(t, []int{3, 4, 5}, denied)
	require.Equal(t, "max_budget (0.1) would be exceeded by call #3 (web_search@1.0.0, cost 0.02): "+
		"the run has spent 0.05 and this turn's calls up to it cost 0.06", reasons[0])
}

func TestMaxBudgetCallUsesTheHigherCost(t *testing.T) {
	for _, tc := range []struct {
		name                string
		turnCost, defCost   float64
		allowed             bool
		reasonHasCostOfCall string
	}{
		{name: "registry agrees", turnCost: 0.5, defCost: 0.5, allowed: true},
		{name: "registry raised the price since the turn", turnCost: 0.5, defCost: 2, reasonHasCostOfCall: "cost 2)"},
		{name: "turn carries the higher cost", turnCost: 2, defCost: 0.5, reasonHasCostOfCall: "cost 2)"},
		{name: "free tool", allowed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			def := envelope.ToolDefinition{Name: "send", Version: "1.0.0", Cost: tc.defCost}
			d := rules.NewGuard().CheckCall(rules.Call{Seq: 1, Name: "send", Version: "1.0.0",
				EnabledTools: []string{"send@1.0.0"}, Policy: envelope.Policy{MaxBudget: 1},
				Spend: 0.25, Cost: tc.turnCost, Tool: &def, State: envelope.ToolActive})
			require.Equal(t, tc.allowed, d.Allowed, d.Reason)
			if !tc.allowed {
				require.Contains(t, d.Reason, tc.reasonHasCostOfCall)
			}
		})
	}
}

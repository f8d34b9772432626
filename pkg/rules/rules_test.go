package rules_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/rules"
)

func toolDef(name string, se envelope.SideEffects, scopes ...string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: name, Version: "1.0.0", Description: "Does " + name + ".",
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: se, Cache: envelope.CacheNone},
		RequiredScopes: scopes,
	}
}

// check judges call #1 of def, enabled and in state.
func check(g *rules.Guard, def envelope.ToolDefinition, state envelope.ToolState, p envelope.Policy) rules.Decision {
	ref := def.Ref()
	return g.CheckCall(rules.Call{
		Seq: 1, Name: ref.Name, Version: ref.Version, EnabledTools: []string{ref.String()}, Policy: p,
		Tool: &def, State: state,
	})
}

// The side-effect ceiling: a read-only node never runs a tool that writes.
func TestSideEffectsRule(t *testing.T) {
	tests := []struct {
		name    string
		tool    envelope.SideEffects
		ceiling envelope.SideEffects
		reason  string // "" when allowed
	}{
		{name: "no ceiling allows writes", tool: envelope.SideEffectsWrites},
		{name: "writes under writes", tool: envelope.SideEffectsWrites, ceiling: envelope.SideEffectsWrites},
		{name: "reads under reads", tool: envelope.SideEffectsReads, ceiling: envelope.SideEffectsReads},
		{name: "none under none", tool: envelope.SideEffectsNone, ceiling: envelope.SideEffectsNone},
		{name: "none under reads", tool: envelope.SideEffectsNone, ceiling: envelope.SideEffectsReads},
		{name: "writes above reads", tool: envelope.SideEffectsWrites, ceiling: envelope.SideEffectsReads,
			reason: `tool t@1.0.0 has side effects "writes", above this agent's ceiling "reads"`},
		{name: "writes above none", tool: envelope.SideEffectsWrites, ceiling: envelope.SideEffectsNone,
			reason: `tool t@1.0.0 has side effects "writes", above this agent's ceiling "none"`},
		{name: "reads above none", tool: envelope.SideEffectsReads, ceiling: envelope.SideEffectsNone,
			reason: `tool t@1.0.0 has side effects "reads", above this agent's ceiling "none"`},
		{name: "undeclared counts as writes", tool: "", ceiling: envelope.SideEffectsReads,
			reason: `tool t@1.0.0 has side effects "writes", above this agent's ceiling "reads"`},
		{name: "unknown side effects fail closed", tool: "deletes",
			reason: `tool t@1.0.0 declares unknown side effects "deletes"`},
		{name: "unknown ceiling fails closed", tool: envelope.SideEffectsNone, ceiling: "some",
			reason: `the agent's side_effects ceiling "some" is not one of none, reads, writes`},
	}
	g := rules.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := check(g, toolDef("t", tt.tool), envelope.ToolActive, envelope.Policy{SideEffects: tt.ceiling})
			if tt.reason == "" {
				require.Equal(t, rules.Decision{Allowed: true}, autoGated(t, d))
				return
			}
			require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: rules.RuleSideEffects}, d)
		})
	}
}

// Scopes: every scope the tool requires must be granted to the run.
func TestScopesRule(t *testing.T) {
	tests := []struct {
		name     string
		required []string
		granted  []string
		reason   string // "" when allowed
	}{
		{name: "nothing required", granted: []string{"crm:read"}},
		{name: "all granted", required: []string{"crm:read", "crm:write"}, granted: []string{"crm:write", "crm:read", "x"}},
		{name: "one missing", required: []string{"crm:read", "crm:write"}, granted: []string{"crm:read"},
			reason: "tool t@1.0.0 needs scope crm:write, not granted to this run (granted: crm:read)"},
		{name: "none granted", required: []string{"crm:read", "crm:write"},
			reason: "tool t@1.0.0 needs scopes crm:read, crm:write, not granted to this run (granted: none)"},
		{name: "scopes match exactly", required: []string{"crm:write"}, granted: []string{"crm:*", "CRM:WRITE"},
			reason: "tool t@1.0.0 needs scope crm:write, not granted to this run (granted: crm:*, CRM:WRITE)"},
	}
	g := rules.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := check(g, toolDef("t", envelope.SideEffectsNone, tt.required...), envelope.ToolActive, envelope.Policy{Scopes: tt.granted})
			if tt.reason == "" {
				require.Equal(t, rules.Decision{Allowed: true}, autoGated(t, d))
				return
			}
			require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: rules.RuleScopes}, d)
		})
	}
}

// Rules run in order: the ceiling is checked before the scopes, both after
// the registry's lifecycle.
func TestRuleOrder(t *testing.T) {
	g := rules.NewGuard()
	def := toolDef("t", envelope.SideEffectsWrites, "crm:write")
	d := check(g, def, envelope.ToolActive, envelope.Policy{SideEffects: envelope.SideEffectsReads})
	require.Equal(t, rules.RuleSideEffects, d.Rule)
	d = check(g, def, envelope.ToolBlocked, envelope.Policy{SideEffects: envelope.SideEffectsReads})
	require.Equal(t, rules.RuleLifecycle, d.Rule)
	require.Equal(t, "tool t@1.0.0 is blocked", d.Reason)
}

// The call rules read the registry's definition only when there is one: run
// out of their default order (a custom guard), they still judge a call of a
// version the registry does not hold, and fail closed.
func TestCallRulesWithoutADefinition(t *testing.T) {
	c := rules.Call{Seq: 4, Name: "ghost", Version: "1.0.0", Cost: 0.5, Spend: 0.75,
		Policy: envelope.Policy{SideEffects: envelope.SideEffectsReads, MaxBudget: 1}}
	require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied,
		Reason: `tool ghost@1.0.0 has side effects "writes", above this agent's ceiling "reads"`}, rules.SideEffects(&c),
		"a tool of unknown side effects is taken as one that writes")
	require.Equal(t, rules.Allow(), rules.Scopes(&c))
	require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied, Reason: `tool ghost@1.0.0 has unknown registry state ""`},
		rules.Lifecycle(&c))
	require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied,
		Reason: "max_budget (1) would be exceeded by call #4 (ghost@1.0.0, cost 0.5): the run has spent 0.75 and this turn's calls up to it cost 0.5"},
		rules.MaxBudgetCall(&c), "the turn's cost stands when the registry has none")
	require.Equal(t, envelope.SideEffectsWrites, rules.EffectiveSideEffects(nil))
}

// Approval is not a denial: an allowed call carries why it must wait.
func TestApprovalRequired(t *testing.T) {
	tests := []struct {
		name   string
		tool   envelope.ToolDefinition
		policy envelope.Policy
		want   string
	}{
		{name: "no approval policy", tool: toolDef("send", envelope.SideEffectsWrites)},
		{name: "writes", tool: toolDef("send", envelope.SideEffectsWrites),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}},
			want:   "the policy requires approval for tools that write, and send@1.0.0 writes"},
		{name: "undeclared counts as writes", tool: toolDef("send", ""),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}},
			want:   "the policy requires approval for tools that write, and send@1.0.0 writes"},
		{name: "reads need none under writes", tool: toolDef("look", envelope.SideEffectsReads),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}}},
		{name: "named", tool: toolDef("look", envelope.SideEffectsReads),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"look"}}},
			want:   "the policy requires approval for tool look"},
	}
	g := rules.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := check(g, tt.tool, envelope.ToolActive, tt.policy)
			require.True(t, d.Allowed)
			require.Equal(t, tt.want, d.ApprovalRequired)
		})
	}
	// A denied call never asks for approval.
	d := check(g, toolDef("send", envelope.SideEffectsWrites), envelope.ToolActive, envelope.Policy{
		SideEffects: envelope.SideEffectsReads, RequireApproval: &envelope.ApprovalPolicy{Writes: true}})
	require.False(t, d.Allowed)
	require.Empty(t, d.ApprovalRequired)
	// The check does not change the definition it was given.
	def := toolDef("send", "")
	check(g, def, envelope.ToolActive, envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}})
	require.Empty(t, def.Metadata.SideEffects)
}

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

// autoGated is d, an allowed call's decision, without its gate, which must
// be auto (the default autonomy runs low and medium risks).
func autoGated(t *testing.T, d rules.Decision) rules.Decision {
	t.Helper()
	require.NotNil(t, d.Gate, "an allowed call of a registered tool has its gate")
	require.Equal(t, envelope.GateAuto, d.Gate.Gate, "%+v", d.Gate)
	d.Gate = nil
	return d
}

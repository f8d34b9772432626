package policy_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/services/policy"
)

func toolEntry(name string, se envelope.SideEffects, scopes ...string) registry.Entry {
	return registry.Entry{State: registry.StateActive, Definition: envelope.ToolDefinition{
		Name: name, Version: "1.0.0", Description: "Does " + name + ".",
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: se, Cache: envelope.CacheNone},
		RequiredScopes: scopes,
	}}
}

func check(g *policy.Guard, e registry.Entry, p envelope.Policy) policy.Decision {
	ref := e.Definition.Ref()
	return g.CheckCall(events.CallRequest{
		RunID: "run-1", CallID: "ab", Seq: 1, Iteration: 1, Name: ref.Name, Version: ref.Version,
		EnabledTools: []string{ref.String()}, Policy: p,
	}, func(envelope.ToolRef) (registry.Entry, bool) { return e, true })
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
	g := policy.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := check(g, toolEntry("t", tt.tool), envelope.Policy{SideEffects: tt.ceiling})
			if tt.reason == "" {
				require.Equal(t, policy.Decision{Allowed: true}, d)
				return
			}
			require.Equal(t, policy.Decision{Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: policy.RuleSideEffects}, d)
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
	g := policy.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := check(g, toolEntry("t", envelope.SideEffectsNone, tt.required...), envelope.Policy{Scopes: tt.granted})
			if tt.reason == "" {
				require.Equal(t, policy.Decision{Allowed: true}, d)
				return
			}
			require.Equal(t, policy.Decision{Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: policy.RuleScopes}, d)
		})
	}
}

// Rules run in order: the ceiling is checked before the scopes, both after
// the registry's lifecycle.
func TestRuleOrder(t *testing.T) {
	g := policy.NewGuard()
	e := toolEntry("t", envelope.SideEffectsWrites, "crm:write")
	d := check(g, e, envelope.Policy{SideEffects: envelope.SideEffectsReads})
	require.Equal(t, policy.RuleSideEffects, d.Rule)
	e.State = registry.StateBlocked
	d = check(g, e, envelope.Policy{SideEffects: envelope.SideEffectsReads})
	require.Equal(t, policy.RuleLifecycle, d.Rule)
	require.Equal(t, "tool t@1.0.0 is blocked", d.Reason)
}

// Approval is not a denial: an allowed call carries why it must wait.
func TestApprovalRequired(t *testing.T) {
	tests := []struct {
		name   string
		tool   registry.Entry
		policy envelope.Policy
		want   string
	}{
		{name: "no approval policy", tool: toolEntry("send", envelope.SideEffectsWrites)},
		{name: "writes", tool: toolEntry("send", envelope.SideEffectsWrites),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}},
			want:   "the policy requires approval for tools that write, and send@1.0.0 writes"},
		{name: "undeclared counts as writes", tool: toolEntry("send", ""),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}},
			want:   "the policy requires approval for tools that write, and send@1.0.0 writes"},
		{name: "reads need none under writes", tool: toolEntry("look", envelope.SideEffectsReads),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}}},
		{name: "named", tool: toolEntry("look", envelope.SideEffectsReads),
			policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"look"}}},
			want:   "the policy requires approval for tool look"},
	}
	g := policy.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := check(g, tt.tool, tt.policy)
			require.True(t, d.Allowed)
			require.Equal(t, tt.want, d.ApprovalRequired)
		})
	}
	// A denied call never asks for approval.
	d := check(g, toolEntry("send", envelope.SideEffectsWrites), envelope.Policy{
		SideEffects: envelope.SideEffectsReads, RequireApproval: &envelope.ApprovalPolicy{Writes: true}})
	require.False(t, d.Allowed)
	require.Empty(t, d.ApprovalRequired)
}

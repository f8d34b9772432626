package rules_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/rules"
)

// registered is what a registry holds of one version.
type registered struct {
	def   envelope.ToolDefinition
	state envelope.ToolState
}

// lookup finds a version as the policy service's registry catalog would.
type lookup func(envelope.ToolRef) (registered, bool)

func entry(name, version string, state envelope.ToolState) registered {
	return registered{def: envelope.ToolDefinition{Name: name, Version: version}, state: state}
}

var testCatalog = map[envelope.ToolRef]registered{
	{Name: "web_search", Version: "1.0.0"}: entry("web_search", "1.0.0", envelope.ToolActive),
	{Name: "calc", Version: "2.1.0"}:       entry("calc", "2.1.0", envelope.ToolActive),
	{Name: "old_search", Version: "0.9.0"}: entry("old_search", "0.9.0", envelope.ToolDeprecated),
	{Name: "rm_rf", Version: "1.0.0"}:      entry("rm_rf", "1.0.0", envelope.ToolBlocked),
	{Name: "weird", Version: "1.0.0"}:      entry("weird", "1.0.0", "retired"),
	{Name: "beta", Version: "0.1.0"}:       entry("beta", "0.1.0", envelope.ToolDraft),
}

func catalogLookup(ref envelope.ToolRef) (registered, bool) {
	e, ok := testCatalog[ref]
	return e, ok
}

// withTool fills in c.Tool and c.State from l, as the policy service does
// from its registry catalog: only a resolved version is looked up, and a
// version the registry does not hold leaves Tool nil.
func withTool(c rules.Call, l lookup) rules.Call {
	if c.Version == "" {
		return c
	}
	if e, ok := l(c.Ref()); ok {
		c.Tool, c.State = &e.def, e.state
	}
	return c
}

var enabledAll = []string{"web_search@1.0.0", "calc@2.1.0", "old_search@0.9.0", "rm_rf@1.0.0", "ghost@1.0.0", "weird@1.0.0", "beta@0.1.0"}

func TestCheckLoop(t *testing.T) {
	tests := []struct {
		name      string
		iteration int
		policy    envelope.Policy
		allowed   bool
		reason    string
	}{
		{name: "first iteration", iteration: 1, allowed: true},
		{name: "last iteration under the default cap", iteration: 10, allowed: true},
		{name: "past the default cap", iteration: 11,
			reason: "max_iterations (10) reached: iteration 11 not allowed"},
		{name: "far past the default cap", iteration: 40,
			reason: "max_iterations (10) reached: iteration 40 not allowed"},
		{name: "custom cap reached", iteration: 3, policy: envelope.Policy{MaxIterations: 3}, allowed: true},
		{name: "past a custom cap", iteration: 4, policy: envelope.Policy{MaxIterations: 3},
			reason: "max_iterations (3) reached: iteration 4 not allowed"},
		{name: "custom cap above the default", iteration: 11, policy: envelope.Policy{MaxIterations: 50}, allowed: true},
	}
	g := rules.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := g.CheckLoop(rules.Loop{Iteration: tt.iteration, Policy: tt.policy})
			if tt.allowed {
				require.Equal(t, rules.Decision{Allowed: true}, d)
				require.Equal(t, "approved", d.Outcome())
				return
			}
			require.Equal(t, rules.Decision{
				Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: rules.RuleMaxIterations,
			}, d)
			require.Equal(t, "denied", d.Outcome())
		})
	}
}

func TestCheckCall(t *testing.T) {
	tests := []struct {
		name     string
		tool     string // bare name
		version  string // "" when the orchestrator found no enabled version
		seq      int
		enabled  []string
		policy   envelope.Policy
		lookup   lookup
		allowed  bool
		rule     string
		reason   string
		warnings []string
	}{
		{name: "enabled and active", tool: "web_search", version: "1.0.0", seq: 1, allowed: true},
		{name: "last call under the default cap", tool: "calc", version: "2.1.0", seq: 25, allowed: true},
		{name: "not enabled at all", tool: "send_email", seq: 1,
			enabled: []string{"web_search@1.0.0", "calc@2.1.0"},
			rule:    rules.RuleEnabledTools,
			reason:  "tool send_email is not enabled for this agent (enabled: web_search@1.0.0, calc@2.1.0)"},
		{name: "nothing enabled", tool: "web_search", seq: 1, enabled: []string{},
			rule:   rules.RuleEnabledTools,
			reason: "tool web_search is not enabled for this agent (enabled: none)"},
		{name: "another version enabled", tool: "web_search", version: "2.0.0", seq: 1,
			enabled: []string{"web_search@1.0.0"},
			rule:    rules.RuleEnabledTools,
			reason:  "tool web_search@2.0.0 is not enabled for this agent (enabled: web_search@1.0.0)"},
		{name: "bare name on the list does not enable a version", tool: "web_search", version: "1.0.0", seq: 1,
			enabled: []string{"web_search"},
			rule:    rules.RuleEnabledTools,
			reason:  "tool web_search@1.0.0 is not enabled for this agent (enabled: web_search)"},
		{name: "past the default cap", tool: "web_search", version: "1.0.0", seq: 26,
			rule:   rules.RuleMaxToolCalls,
			reason: "max_tool_calls (25) reached: call #26 not allowed"},
		{name: "past a custom cap", tool: "web_search", version: "1.0.0", seq: 3,
			policy: envelope.Policy{MaxToolCalls: 2},
			rule:   rules.RuleMaxToolCalls,
			reason: "max_tool_calls (2) reached: call #3 not allowed"},
		{name: "allow-list is checked before the cap", tool: "send_email", seq: 99,
			enabled: []string{"calc@2.1.0"},
			rule:    rules.RuleEnabledTools,
			reason:  "tool send_email is not enabled for this agent (enabled: calc@2.1.0)"},
		{name: "version unknown to the registry", tool: "ghost", version: "1.0.0", seq: 1,
			rule:   rules.RuleRegistered,
			reason: "unknown tool ghost@1.0.0: it is not in the tool registry"},
		{name: "no registry at all", tool: "web_search", version: "1.0.0", seq: 1,
			lookup: func(envelope.ToolRef) (registered, bool) { return registered{}, false },
			rule:   rules.RuleRegistered,
			reason: "unknown tool web_search@1.0.0: it is not in the tool registry"},
		{name: "blocked", tool: "rm_rf", version: "1.0.0", seq: 1,
			rule:   rules.RuleLifecycle,
			reason: "tool rm_rf@1.0.0 is blocked"},
		{name: "a draft does not run", tool: "beta", version: "0.1.0", seq: 1,
			rule:   rules.RuleLifecycle,
			reason: "tool beta@0.1.0 is a draft: it does not run until it is published"},
		{name: "deprecated runs with a warning", tool: "old_search", version: "0.9.0", seq: 1,
			allowed: true, warnings: []string{"tool old_search@0.9.0 is deprecated"}},
		{name: "unknown registry state fails closed", tool: "weird", version: "1.0.0", seq: 1,
			rule:   rules.RuleLifecycle,
			reason: `tool weird@1.0.0 has unknown registry state "retired"`},
	}
	g := rules.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enabled := tt.enabled
			if enabled == nil {
				enabled = enabledAll
			}
			l := tt.lookup
			if l == nil {
				l = catalogLookup
			}
			c := withTool(rules.Call{Seq: tt.seq, Name: tt.tool, Version: tt.version, EnabledTools: enabled, Policy: tt.policy}, l)
			d := g.CheckCall(c)
			if tt.allowed {
				require.Equal(t, rules.Decision{Allowed: true, Warnings: tt.warnings}, autoGated(t, d))
				return
			}
			require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: tt.rule}, d)
		})
	}
}

// A turn of 10 parallel calls with 3 left under the cap: the orchestrator
// numbers them 23..32 in order, so the first three run and the rest are
// refused, each with its own number.
func TestCheckCallFanOutCrossingTheCap(t *testing.T) {
	g := rules.NewGuard()
	var allowed, denied []int
	for seq := 23; seq <= 32; seq++ {
		d := g.CheckCall(withTool(rules.Call{
			Seq: seq, Name: "web_search", Version: "1.0.0", EnabledTools: []string{"web_search@1.0.0"},
			Policy: envelope.Policy{MaxToolCalls: 25},
		}, catalogLookup))
		if d.Allowed {
			allowed = append(allowed, seq)
			continue
		}
		denied = append(denied, seq)
		require.Equal(t, envelope.CodePolicyDenied, d.Code)
		require.Equal(t, fmt.Sprintf("max_tool_calls (25) reached: call #%d not allowed", seq), d.Reason)
		require.Equal(t, rules.RuleMaxToolCalls, d.Rule)
	}
	require.Equal(t, []int{23, 24, 25}, allowed)
	require.Equal(t, []int{26, 27, 28, 29, 30, 31, 32}, denied)
}

// Further rules slot in as values: they run in order, the first denial wins,
// and warnings of the rules that ran are kept.
func TestGuardWithRules(t *testing.T) {
	// (side_effects is a default rule now; a custom rule of the same kind.)
	noDB := rules.CallRule{Name: "no_db", Check: func(c *rules.Call) rules.Decision {
		if strings.HasPrefix(c.Name, "db_") && !slices.Contains(c.Policy.Scopes, "databases") {
			return rules.Deny("tool %s: acme's agents do not touch databases", c.Ref())
		}
		return rules.Allow()
	}}
	budget := rules.LoopRule{Name: "max_budget", Check: func(c *rules.Loop) rules.Decision {
		if c.Policy.MaxBudget > 0 && c.Spend >= c.Policy.MaxBudget {
			return rules.Deny("max_budget (%g) reached", c.Policy.MaxBudget)
		}
		return rules.Allow()
	}}
	g := rules.NewGuardWith(
		append(rules.DefaultLoopRules(), budget),
		append(rules.DefaultCallRules(), noDB))

	writer := envelope.ToolDefinition{
		Name: "db_write", Version: "1.0.0", Metadata: envelope.ToolMetadata{SideEffects: envelope.SideEffectsWrites},
	}
	c := rules.Call{
		Seq: 1, Name: "db_write", Version: "1.0.0",
		EnabledTools: []string{"db_write@1.0.0"}, Policy: envelope.Policy{SideEffects: envelope.SideEffectsReads},
		Tool: &writer, State: envelope.ToolDeprecated,
	}
	// A default rule denies first.
	require.Equal(t, rules.Decision{
		Code:     envelope.CodePolicyDenied,
		Reason:   `tool db_write@1.0.0 has side effects "writes", above this agent's ceiling "reads"`,
		Rule:     "side_effects",
		Warnings: []string{"tool db_write@1.0.0 is deprecated"},
	}, g.CheckCall(c))
	// Past the defaults, the added rule denies, and the warnings of the rules
	// that ran are kept.
	c.Policy.SideEffects = ""
	require.Equal(t, rules.Decision{
		Code:     envelope.CodePolicyDenied,
		Reason:   "tool db_write@1.0.0: acme's agents do not touch databases",
		Rule:     "no_db",
		Warnings: []string{"tool db_write@1.0.0 is deprecated"},
	}, g.CheckCall(c))

	c.Policy.Scopes = []string{"databases"}
	require.True(t, g.CheckCall(c).Allowed)

	// An added rule runs after the defaults: here the default max_budget rule
	// answers first.
	d := g.CheckLoop(rules.Loop{Iteration: 2, Spend: 1.5, Policy: envelope.Policy{MaxBudget: 1}})
	require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied,
		Reason: "max_budget (1) reached: the run has spent 1.5, nothing is left for model call 2", Rule: "max_budget"}, d)
	// The default rules come first.
	d = g.CheckLoop(rules.Loop{Iteration: 11, Spend: 1.5, Policy: envelope.Policy{MaxBudget: 1}})
	require.Equal(t, rules.RuleMaxIterations, d.Rule)

	// A guard keeps its own copy of the rules it was given.
	callRules := rules.DefaultCallRules()
	g = rules.NewGuardWith(nil, callRules)
	callRules[0] = noDB
	require.Equal(t, rules.RuleEnabledTools, g.CheckCall(rules.Call{Seq: 1, Name: "db_write"}).Rule)
}

// A rule's own code, when set, is kept; a rule that names no code or rule
// gets POLICY_DENIED and its name.
func TestDeniedKeepsTheRulesCodeAndName(t *testing.T) {
	custom := rules.CallRule{Name: "custom", Check: func(*rules.Call) rules.Decision {
		return rules.Decision{Code: envelope.CodeValidation, Reason: "bad", Rule: "inner"}
	}}
	bare := rules.CallRule{Name: "bare", Check: func(*rules.Call) rules.Decision {
		return rules.Decision{Reason: "no"}
	}}
	require.Equal(t, rules.Decision{Code: envelope.CodeValidation, Reason: "bad", Rule: "inner"},
		rules.NewGuardWith(nil, []rules.CallRule{custom}).CheckCall(rules.Call{}))
	require.Equal(t, rules.Decision{Code: envelope.CodePolicyDenied, Reason: "no", Rule: "bare"},
		rules.NewGuardWith(nil, []rules.CallRule{bare}).CheckCall(rules.Call{}))
}

package policy_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/services/policy"
)

// catalog is an in-memory Lookup over registry entries.
type catalog map[envelope.ToolRef]registry.Entry

func (c catalog) lookup(ref envelope.ToolRef) (registry.Entry, bool) {
	e, ok := c[ref]
	return e, ok
}

func entry(name, version string, state registry.State) registry.Entry {
	return registry.Entry{
		Definition: envelope.ToolDefinition{Name: name, Version: version},
		State:      state,
	}
}

var testCatalog = catalog{
	{Name: "web_search", Version: "1.0.0"}: entry("web_search", "1.0.0", registry.StateActive),
	{Name: "calc", Version: "2.1.0"}:       entry("calc", "2.1.0", registry.StateActive),
	{Name: "old_search", Version: "0.9.0"}: entry("old_search", "0.9.0", registry.StateDeprecated),
	{Name: "rm_rf", Version: "1.0.0"}:      entry("rm_rf", "1.0.0", registry.StateBlocked),
	{Name: "weird", Version: "1.0.0"}:      entry("weird", "1.0.0", "retired"),
}

var enabledAll = []string{"web_search@1.0.0", "calc@2.1.0", "old_search@0.9.0", "rm_rf@1.0.0", "ghost@1.0.0", "weird@1.0.0"}

func TestCheckIteration(t *testing.T) {
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
	g := policy.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := g.CheckIteration(events.IterationCheck{RunID: "run-1", Iteration: tt.iteration, Policy: tt.policy})
			if tt.allowed {
				require.Equal(t, policy.Decision{Allowed: true}, d)
				return
			}
			require.Equal(t, policy.Decision{
				Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: policy.RuleMaxIterations,
			}, d)
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
		lookup   policy.Lookup
		allowed  bool
		rule     string
		reason   string
		warnings []string
	}{
		{name: "enabled and active", tool: "web_search", version: "1.0.0", seq: 1, allowed: true},
		{name: "last call under the default cap", tool: "calc", version: "2.1.0", seq: 25, allowed: true},
		{name: "not enabled at all", tool: "send_email", seq: 1,
			enabled: []string{"web_search@1.0.0", "calc@2.1.0"},
			rule:    policy.RuleEnabledTools,
			reason:  "tool send_email is not enabled for this agent (enabled: web_search@1.0.0, calc@2.1.0)"},
		{name: "nothing enabled", tool: "web_search", seq: 1, enabled: []string{},
			rule:   policy.RuleEnabledTools,
			reason: "tool web_search is not enabled for this agent (enabled: none)"},
		{name: "another version enabled", tool: "web_search", version: "2.0.0", seq: 1,
			enabled: []string{"web_search@1.0.0"},
			rule:    policy.RuleEnabledTools,
			reason:  "tool web_search@2.0.0 is not enabled for this agent (enabled: web_search@1.0.0)"},
		{name: "bare name on the list does not enable a version", tool: "web_search", version: "1.0.0", seq: 1,
			enabled: []string{"web_search"},
			rule:    policy.RuleEnabledTools,
			reason:  "tool web_search@1.0.0 is not enabled for this agent (enabled: web_search)"},
		{name: "past the default cap", tool: "web_search", version: "1.0.0", seq: 26,
			rule:   policy.RuleMaxToolCalls,
			reason: "max_tool_calls (25) reached: call #26 not allowed"},
		{name: "past a custom cap", tool: "web_search", version: "1.0.0", seq: 3,
			policy: envelope.Policy{MaxToolCalls: 2},
			rule:   policy.RuleMaxToolCalls,
			reason: "max_tool_calls (2) reached: call #3 not allowed"},
		{name: "allow-list is checked before the cap", tool: "send_email", seq: 99,
			enabled: []string{"calc@2.1.0"},
			rule:    policy.RuleEnabledTools,
			reason:  "tool send_email is not enabled for this agent (enabled: calc@2.1.0)"},
		{name: "version unknown to the registry", tool: "ghost", version: "1.0.0", seq: 1,
			rule:   policy.RuleRegistered,
			reason: "unknown tool ghost@1.0.0: it is not in the tool registry"},
		{name: "no registry at all", tool: "web_search", version: "1.0.0", seq: 1, lookup: func(envelope.ToolRef) (registry.Entry, bool) {
			return registry.Entry{}, false
		},
			rule:   policy.RuleRegistered,
			reason: "unknown tool web_search@1.0.0: it is not in the tool registry"},
		{name: "blocked", tool: "rm_rf", version: "1.0.0", seq: 1,
			rule:   policy.RuleLifecycle,
			reason: "tool rm_rf@1.0.0 is blocked"},
		{name: "deprecated runs with a warning", tool: "old_search", version: "0.9.0", seq: 1,
			allowed: true, warnings: []string{"tool old_search@0.9.0 is deprecated"}},
		{name: "unknown registry state fails closed", tool: "weird", version: "1.0.0", seq: 1,
			rule:   policy.RuleLifecycle,
			reason: `tool weird@1.0.0 has unknown registry state "retired"`},
	}
	g := policy.NewGuard()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enabled := tt.enabled
			if enabled == nil {
				enabled = enabledAll
			}
			lookup := tt.lookup
			if lookup == nil {
				lookup = testCatalog.lookup
			}
			req := events.CallRequest{
				RunID: "run-1", CallID: "ab", Seq: tt.seq, Iteration: 1,
				Name: tt.tool, Version: tt.version, Input: json.RawMessage(`{}`),
				EnabledTools: enabled, Policy: tt.policy,
			}
			d := g.CheckCall(req, lookup)
			if tt.allowed {
				require.Equal(t, policy.Decision{Allowed: true, Warnings: tt.warnings}, d)
				return
			}
			require.Equal(t, policy.Decision{Code: envelope.CodePolicyDenied, Reason: tt.reason, Rule: tt.rule}, d)
		})
	}
}

// A turn of 10 parallel calls with 3 left under the cap: the orchestrator
// numbers them 23..32 in order, so the first three run and the rest are
// refused, each with its own number.
func TestCheckCallFanOutCrossingTheCap(t *testing.T) {
	g := policy.NewGuard()
	var allowed, denied []int
	for seq := 23; seq <= 32; seq++ {
		d := g.CheckCall(events.CallRequest{
			RunID: "run-1", CallID: fmt.Sprintf("%x", seq), Seq: seq, Iteration: 4,
			Name: "web_search", Version: "1.0.0", EnabledTools: []string{"web_search@1.0.0"},
			Policy: envelope.Policy{MaxToolCalls: 25},
		}, testCatalog.lookup)
		if d.Allowed {
			allowed = append(allowed, seq)
			continue
		}
		denied = append(denied, seq)
		require.Equal(t, envelope.CodePolicyDenied, d.Code)
		require.Equal(t, fmt.Sprintf("max_tool_calls (25) reached: call #%d not allowed", seq), d.Reason)
		require.Equal(t, policy.RuleMaxToolCalls, d.Rule)
	}
	require.Equal(t, []int{23, 24, 25}, allowed)
	require.Equal(t, []int{26, 27, 28, 29, 30, 31, 32}, denied)
}

// Further rules slot in as values: they run in order, the first denial wins,
// and warnings of the rules that ran are kept.
func TestGuardWithRules(t *testing.T) {
	// (side_effects is a default rule now; a custom rule of the same kind.)
	noDB := policy.CallRule{Name: "no_db", Check: func(c *policy.CallCheck) policy.Decision {
		if strings.HasPrefix(c.Request.Name, "db_") && c.Request.Tenant.OrgID == "acme" {
			return policy.Deny("tool %s: acme's agents do not touch databases", c.Request.Ref())
		}
		return policy.Allow()
	}}
	budget := policy.IterationRule{Name: "max_budget", Check: func(c *events.IterationCheck) policy.Decision {
		if c.Policy.MaxBudget > 0 && c.Spend >= c.Policy.MaxBudget {
			return policy.Deny("max_budget (%g) reached", c.Policy.MaxBudget)
		}
		return policy.Allow()
	}}
	g := policy.NewGuardWith(
		append(policy.DefaultIterationRules(), budget),
		append(policy.DefaultCallRules(), noDB))

	writer := registry.Entry{State: registry.StateDeprecated, Definition: envelope.ToolDefinition{
		Name: "db_write", Version: "1.0.0", Metadata: envelope.ToolMetadata{SideEffects: envelope.SideEffectsWrites},
	}}
	lookup := func(envelope.ToolRef) (registry.Entry, bool) { return writer, true }
	req := events.CallRequest{
		RunID: "run-1", CallID: "ab", Seq: 1, Iteration: 1, Name: "db_write", Version: "1.0.0",
		EnabledTools: []string{"db_write@1.0.0"}, Policy: envelope.Policy{SideEffects: envelope.SideEffectsReads},
		Tenant: envelope.Tenant{OrgID: "acme"},
	}
	// A default rule denies first.
	require.Equal(t, policy.Decision{
		Code:     envelope.CodePolicyDenied,
		Reason:   `tool db_write@1.0.0 has side effects "writes", above this agent's ceiling "reads"`,
		Rule:     "side_effects",
		Warnings: []string{"tool db_write@1.0.0 is deprecated"},
	}, g.CheckCall(req, lookup))
	// Past the defaults, the added rule denies, and the warnings of the rules
	// that ran are kept.
	req.Policy.SideEffects = ""
	require.Equal(t, policy.Decision{
		Code:     envelope.CodePolicyDenied,
		Reason:   "tool db_write@1.0.0: acme's agents do not touch databases",
		Rule:     "no_db",
		Warnings: []string{"tool db_write@1.0.0 is deprecated"},
	}, g.CheckCall(req, lookup))

	req.Tenant.OrgID = "globex"
	require.True(t, g.CheckCall(req, lookup).Allowed)

	// An added rule runs after the defaults: here the default max_budget rule
	// (budget.go) answers first.
	d := g.CheckIteration(events.IterationCheck{RunID: "run-1", Iteration: 2, Spend: 1.5, Policy: envelope.Policy{MaxBudget: 1}})
	require.Equal(t, policy.Decision{Code: envelope.CodePolicyDenied,
		Reason: "max_budget (1) reached: the run has spent 1.5, nothing is left for model call 2", Rule: "max_budget"}, d)
	// The default rules come first.
	d = g.CheckIteration(events.IterationCheck{RunID: "run-1", Iteration: 11, Spend: 1.5, Policy: envelope.Policy{MaxBudget: 1}})
	require.Equal(t, policy.RuleMaxIterations, d.Rule)
}

// testSchemas compiles the contract and event data schemas.
func testSchemas(t *testing.T) *envelope.Schemas {
	t.Helper()
	s, err := events.NewSchemas()
	require.NoError(t, err)
	return s
}

func TestDeniedEnvelopeMatchesSchema(t *testing.T) {
	schemas := testSchemas(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	tests := []struct {
		name, tool, version string
	}{
		{name: "tool not enabled: no version", tool: "send_email"},
		{name: "blocked version", tool: "rm_rf", version: "1.0.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := json.RawMessage(`{"to": "a@example.com", "n": 1.0}`)
			callID, err := envelope.CallID(tt.tool, tt.version, input, 7)
			require.NoError(t, err)
			req := events.CallRequest{RunID: "run-1", CallID: callID, Seq: 7, Iteration: 2, Name: tt.tool, Version: tt.version, Input: input}
			env := policy.DeniedEnvelope(&req, policy.Deny("no"), now)

			require.Equal(t, callID, env.CallID)
			require.Equal(t, tt.tool, env.Name)
			require.Equal(t, tt.version, env.Version)
			require.Equal(t, string(input), string(env.Input), "input is kept byte for byte")
			require.Nil(t, env.Output)
			require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "no"}, env.Error)
			require.Equal(t, now.UTC(), env.TStart)
			require.Equal(t, time.UTC, env.TStart.Location())
			require.Equal(t, env.TStart, env.TEnd)
			require.NoError(t, schemas.ValidateValue(envelope.SchemaToolEnvelope, env))
		})
	}
}

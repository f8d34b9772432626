package rules_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/rules"
)

// TestDefaultGates: every cell of the default matrix, as docs/policy.md
// gives it.
func TestDefaultGates(t *testing.T) {
	want := map[envelope.Autonomy][4]envelope.Gate{
		envelope.AutonomyManual:     {envelope.GateConfirm, envelope.GateConfirm, envelope.GateConfirm, envelope.GateDeny},
		envelope.AutonomySupervised: {envelope.GateAuto, envelope.GatePreview, envelope.GateConfirm, envelope.GateDeny},
		envelope.AutonomyAutonomous: {envelope.GateAuto, envelope.GateAuto, envelope.GatePreview, envelope.GateConfirm},
	}
	var g rules.Gates
	for a, row := range want {
		for i, r := range envelope.Risks() {
			v := g.For("acme", a, r, "")
			require.Equal(t, row[i], v.Gate, "%s × %s", a, r)
			require.Equal(t, "default", v.Source)
		}
	}
	require.Equal(t, envelope.GateAuto, g.For("acme", "", envelope.RiskMedium, "").Gate, "no autonomy is autonomous")
	require.Equal(t, envelope.GateDeny, g.For("acme", envelope.AutonomyManual, "unknown", "").Gate, "a cell the matrix lacks fails closed")
}

// TestGateOverrides: an org's overrides change its cells only, the last one
// winning, and say so.
func TestGateOverrides(t *testing.T) {
	o, err := rules.ParseGateOverrides("acme:*/high=confirm; acme:autonomous/critical=deny ;lab:supervised/medium=auto")
	require.NoError(t, err)
	g := rules.Gates{Overrides: o}
	v := g.For("acme", envelope.AutonomyAutonomous, envelope.RiskHigh, "")
	require.Equal(t, envelope.GateConfirm, v.Gate)
	require.Equal(t, "org acme", v.Source)
	require.Equal(t, envelope.GateDeny, g.For("acme", envelope.AutonomyAutonomous, envelope.RiskCritical, "").Gate)
	require.Equal(t, envelope.GateAuto, g.For("lab", envelope.AutonomySupervised, envelope.RiskMedium, "").Gate)
	other := g.For("other", envelope.AutonomyAutonomous, envelope.RiskHigh, "")
	require.Equal(t, envelope.GatePreview, other.Gate, "another org keeps the default")
	require.Equal(t, "default", other.Source)

	for _, bad := range []string{"acme", ":*/high=confirm", "acme:*/high", "acme:high=confirm", "acme:sometimes/high=auto", "acme:*/huge=auto", "acme:*/high=maybe"} {
		_, err := rules.ParseGateOverrides(bad)
		require.Error(t, err, bad)
		require.ErrorContains(t, err, "want ORG:AUTONOMY/RISK=GATE")
	}
}

// TestGateOfACall: the guard classifies a call by the action its input
// names and gates it: a supervised node runs a low-risk read, previews a
// medium write, confirms a high one and refuses a critical one, saying
// which cell did; a preview gate of a tool without a dry run is confirm.
func TestGateOfACall(t *testing.T) {
	api := envelope.ToolDefinition{Name: "crm", Version: "1.0.0", SupportsPreview: true,
		Metadata: envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone},
		Risk: &envelope.RiskPolicy{Default: envelope.RiskHigh, Field: "method",
			Actions: map[string]envelope.Risk{"GET": envelope.RiskLow, "POST": envelope.RiskMedium, "DELETE": envelope.RiskCritical}}}
	g := rules.NewGuard()
	call := func(def envelope.ToolDefinition, input string, p envelope.Policy) rules.Decision {
		return g.CheckCall(rules.Call{Seq: 1, Name: def.Name, Version: def.Version, EnabledTools: []string{def.Ref().String()},
			Policy: p, Tool: &def, State: envelope.ToolActive, Input: json.RawMessage(input), Org: "acme"})
	}
	sup := envelope.Policy{Autonomy: envelope.AutonomySupervised}
	for _, tc := range []struct {
		input    string
		gate     envelope.Gate
		allowed  bool
		approval string
	}{
		{`{"method":"GET"}`, envelope.GateAuto, true, ""},
		{`{"method":"post"}`, envelope.GatePreview, true, "gate supervised × medium (POST) → preview (default)"},
		{`{"method":"PATCH"}`, envelope.GateConfirm, true, "gate supervised × high → confirm (default)"},
		{`{}`, envelope.GateConfirm, true, "gate supervised × high → confirm (default)"},
		{`{"method":"DELETE"}`, envelope.GateDeny, false, ""},
	} {
		d := call(api, tc.input, sup)
		require.Equal(t, tc.allowed, d.Allowed, tc.input)
		require.NotNil(t, d.Gate, tc.input)
		require.Equal(t, tc.gate, d.Gate.Gate, tc.input)
		require.Equal(t, tc.approval, d.ApprovalRequired, tc.input)
		if !tc.allowed {
			require.Equal(t, rules.RuleGate, d.Rule)
			require.Equal(t, "tool crm@1.0.0 is denied by the gate matrix: supervised × critical (DELETE) → deny (default)", d.Reason)
		}
	}

	noPreview := api
	noPreview.SupportsPreview = false
	d := call(noPreview, `{"method":"POST"}`, sup)
	require.Equal(t, envelope.GateConfirm, d.Gate.Gate)
	require.Contains(t, d.Gate.Note, "falls back to confirm")

	// Without a risk policy: by side effects, under the default autonomy
	// nothing changes for a tool that writes (medium: auto).
	plain := envelope.ToolDefinition{Name: "mail", Version: "1.0.0",
		Metadata: envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone}}
	d = call(plain, `{}`, envelope.Policy{})
	require.True(t, d.Allowed)
	require.Equal(t, envelope.GateAuto, d.Gate.Gate)
	require.Empty(t, d.ApprovalRequired)
	d = call(plain, `{}`, envelope.Policy{Autonomy: envelope.AutonomyManual})
	require.Equal(t, "gate manual × medium → confirm (default)", d.ApprovalRequired)

	// The explicit approval list keeps its own reason.
	d = call(plain, `{}`, envelope.Policy{Autonomy: envelope.AutonomyManual, RequireApproval: &envelope.ApprovalPolicy{Writes: true}})
	require.NotContains(t, d.ApprovalRequired, "gate")
	require.Equal(t, envelope.GateConfirm, d.Gate.Gate)
}

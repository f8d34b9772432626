package rules

import (
	"fmt"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Gates: the gate matrix says, for an agent node's autonomy and a call's
// risk (envelope.ToolDefinition.RiskOf), whether the call runs (auto), waits
// for an operator with its dry run shown (preview) or without (confirm), or
// is refused (deny). docs/policy.md, Gates, has the table.

// GateMatrix is a gate for each autonomy and risk.
type GateMatrix map[envelope.Autonomy]map[envelope.Risk]envelope.Gate

// DefaultGates is the safe default: a manual node confirms every call and
// never runs a critical one; a supervised node runs low-risk calls,
// previews medium ones, confirms high ones and never runs a critical one;
// an autonomous node (the default) runs low and medium calls, previews
// high ones and confirms critical ones.
func DefaultGates() GateMatrix {
	const (
		auto, preview, confirm, deny = envelope.GateAuto, envelope.GatePreview, envelope.GateConfirm, envelope.GateDeny
	)
	return GateMatrix{
		envelope.AutonomyManual:     {envelope.RiskLow: confirm, envelope.RiskMedium: confirm, envelope.RiskHigh: confirm, envelope.RiskCritical: deny},
		envelope.AutonomySupervised: {envelope.RiskLow: auto, envelope.RiskMedium: preview, envelope.RiskHigh: confirm, envelope.RiskCritical: deny},
		envelope.AutonomyAutonomous: {envelope.RiskLow: auto, envelope.RiskMedium: auto, envelope.RiskHigh: preview, envelope.RiskCritical: confirm},
	}
}

// GateOverride changes cells of the matrix for one org: the cells of
// Autonomy (every autonomy when "") and Risk (every risk when "") are Gate.
type GateOverride struct {
	Org      string
	Autonomy envelope.Autonomy
	Risk     envelope.Risk
	Gate     envelope.Gate
}

// ParseGateOverrides reads overrides as the policy service's configuration
// writes them: ORG:AUTONOMY/RISK=GATE separated by semicolons, * for every
// autonomy or risk ("acme:*/high=confirm; acme:autonomous/critical=deny").
// Later overrides win over earlier ones.
func ParseGateOverrides(s string) ([]GateOverride, error) {
	var out []GateOverride
	for part := range strings.SplitSeq(s, ";") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("gate override %q: %s (want ORG:AUTONOMY/RISK=GATE, * for any, such as acme:*/high=confirm)", part, why)
		}
		org, rest, ok := strings.Cut(part, ":")
		if !ok || strings.TrimSpace(org) == "" {
			return nil, bad("no org")
		}
		cell, gate, ok := strings.Cut(rest, "=")
		if !ok {
			return nil, bad("no gate")
		}
		a, r, ok := strings.Cut(cell, "/")
		if !ok {
			return nil, bad("no autonomy/risk cell")
		}
		o := GateOverride{Org: strings.TrimSpace(org), Gate: envelope.Gate(strings.TrimSpace(gate))}
		if a = strings.TrimSpace(a); a != "*" {
			o.Autonomy = envelope.Autonomy(a)
			if a == "" || !o.Autonomy.Valid() {
				return nil, bad(fmt.Sprintf("autonomy %q is not one of manual, supervised, autonomous, *", a))
			}
		}
		if r = strings.TrimSpace(r); r != "*" {
			o.Risk = envelope.Risk(r)
			if o.Risk.Rank() < 0 {
				return nil, bad(fmt.Sprintf("risk %q is not one of low, medium, high, critical, *", r))
			}
		}
		if !o.Gate.Valid() {
			return nil, bad(fmt.Sprintf("gate %q is not one of auto, preview, confirm, deny", o.Gate))
		}
		out = append(out, o)
	}
	return out, nil
}

// Gates decide calls' gates: a matrix and the orgs' overrides. The zero
// value is DefaultGates without overrides.
type Gates struct {
	Matrix    GateMatrix
	Overrides []GateOverride
}

// For is the gate of a call of a tool of risk r (looked up by action) by
// an agent node of autonomy a in org: the org's last override of the cell,
// else the matrix's; a cell the matrix does not hold is deny (fail
// closed).
func (g Gates) For(org string, a envelope.Autonomy, r envelope.Risk, action string) envelope.GateVerdict {
	a = a.Level()
	v := envelope.GateVerdict{Gate: envelope.GateDeny, Autonomy: a, Risk: r, Action: action, Source: "default"}
	m := g.Matrix
	if m == nil {
		m = DefaultGates()
	}
	if gate, ok := m[a][r]; ok {
		v.Gate = gate
	}
	for _, o := range g.Overrides {
		if o.Org == org && (o.Autonomy == "" || o.Autonomy == a) && (o.Risk == "" || o.Risk == r) {
			v.Gate, v.Source = o.Gate, "org "+org
		}
	}
	return v
}

// RuleGate is the rule name of a call the gate matrix denies.
const RuleGate = "gate"

// gate applies the gates to an allowed call of a registered tool: deny
// refuses it; preview and confirm put it to an operator.
func (g *Guard) gate(c *Call, dec *Decision) {
	if !dec.Allowed || c.Tool == nil {
		return
	}
	risk, action := c.Tool.RiskOf(c.Input)
	v := g.gates.For(c.Org, c.Policy.Autonomy, risk, action)
	if v.Gate == envelope.GatePreview && !c.Tool.SupportsPreview {
		v.Gate, v.Note = envelope.GateConfirm, "the tool has no dry run: the preview gate falls back to confirm"
	}
	dec.Gate = &v
	switch v.Gate {
	case envelope.GateDeny:
		warnings := dec.Warnings
		*dec = denied(Deny("tool %s is denied by the gate matrix: %s", c.Ref(), v.Cell()), RuleGate, warnings)
		dec.Gate = &v
	case envelope.GatePreview, envelope.GateConfirm:
		if dec.ApprovalRequired == "" {
			dec.ApprovalRequired = "gate " + v.Cell()
		}
	}
}

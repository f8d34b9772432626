package envelope

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Risk is how much harm a tool action can do, the column of the gate
// matrix (docs/policy.md, Gates).
type Risk string

// Risk levels, lowest first.
const (
	RiskLow      Risk = "low"
	RiskMedium   Risk = "medium"
	RiskHigh     Risk = "high"
	RiskCritical Risk = "critical"
)

// Risks are the levels, lowest first.
func Risks() []Risk { return []Risk{RiskLow, RiskMedium, RiskHigh, RiskCritical} }

// Rank orders the levels (low 0 ... critical 3); -1 for an unknown one.
func (r Risk) Rank() int {
	switch r {
	case RiskLow:
		return 0
	case RiskMedium:
		return 1
	case RiskHigh:
		return 2
	case RiskCritical:
		return 3
	}
	return -1
}

// RiskPolicy classifies a tool's calls: Default, or the level Actions gives
// the action the call's input names in its top-level field Field (an HTTP
// method, an operation name).
type RiskPolicy struct {
	Default Risk            `json:"default,omitempty"`
	Field   string          `json:"field,omitempty"`
	Actions map[string]Risk `json:"actions,omitempty"`
}

var riskFieldRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// Validate checks the policy's levels and field.
func (p *RiskPolicy) Validate() error {
	if p.Default != "" && p.Default.Rank() < 0 {
		return fmt.Errorf("risk.default %q is not one of low, medium, high, critical", p.Default)
	}
	if len(p.Actions) > 0 && p.Field == "" {
		return fmt.Errorf("risk.actions need risk.field: the input field that names the action")
	}
	if p.Field != "" && !riskFieldRE.MatchString(p.Field) {
		return fmt.Errorf("risk.field %q is not an input field name", p.Field)
	}
	for a, r := range p.Actions {
		if r.Rank() < 0 {
			return fmt.Errorf("risk.actions[%q] %q is not one of low, medium, high, critical", a, r)
		}
	}
	return nil
}

// RiskOf classifies a call of d with input: the level of the action the
// input names (its risk.field; matched exactly, else ignoring case), else
// risk.default, else what the side effects imply (writes: medium; reads and
// none: low). action is the action matched, "" when none was.
func (d *ToolDefinition) RiskOf(input []byte) (r Risk, action string) {
	if p := d.Risk; p != nil {
		if p.Field != "" && len(p.Actions) > 0 {
			var in map[string]json.RawMessage
			if json.Unmarshal(input, &in) == nil {
				var a string
				if json.Unmarshal(in[p.Field], &a) == nil && a != "" {
					if lvl, ok := p.Actions[a]; ok {
						return lvl, a
					}
					for k, lvl := range p.Actions {
						if strings.EqualFold(k, a) {
							return lvl, k
						}
					}
				}
			}
		}
		if p.Default != "" {
			return p.Default, ""
		}
	}
	if d.Metadata.SideEffects == SideEffectsWrites {
		return RiskMedium, ""
	}
	return RiskLow, ""
}

// Autonomy is how freely an agent node acts, the row of the gate matrix.
type Autonomy string

// Autonomy levels, least free first.
const (
	// AutonomyManual: every call waits for an operator.
	AutonomyManual Autonomy = "manual"
	// AutonomySupervised: low-risk calls run; others are previewed or
	// confirmed.
	AutonomySupervised Autonomy = "supervised"
	// AutonomyAutonomous: the default; only high and critical calls are
	// put to an operator.
	AutonomyAutonomous Autonomy = "autonomous"
)

// Autonomies are the levels, least free first.
func Autonomies() []Autonomy {
	return []Autonomy{AutonomyManual, AutonomySupervised, AutonomyAutonomous}
}

// Valid reports whether a is a known level ("" is the default).
func (a Autonomy) Valid() bool {
	return a == "" || a == AutonomyManual || a == AutonomySupervised || a == AutonomyAutonomous
}

// Level is a, or the default, autonomous.
func (a Autonomy) Level() Autonomy {
	if a == "" {
		return AutonomyAutonomous
	}
	return a
}

// Gate is what the gate matrix says of a call: it runs (auto), waits for an
// operator with its dry run shown (preview) or without (confirm), or is
// refused (deny).
type Gate string

// Gates.
const (
	GateAuto    Gate = "auto"
	GatePreview Gate = "preview"
	GateConfirm Gate = "confirm"
	GateDeny    Gate = "deny"
)

// Gates are the gates, least strict first.
func Gates() []Gate { return []Gate{GateAuto, GatePreview, GateConfirm, GateDeny} }

// Valid reports whether g is a known gate.
func (g Gate) Valid() bool {
	return g == GateAuto || g == GatePreview || g == GateConfirm || g == GateDeny
}

// GateVerdict is the gate a call got and the cell of the matrix that gave
// it, carried on the call's events (the approval request, the approved
// call) and shown on its timeline.
type GateVerdict struct {
	Gate     Gate     `json:"gate"`
	Autonomy Autonomy `json:"autonomy"`
	Risk     Risk     `json:"risk"`
	// Action is the action the risk was looked up by, if any.
	Action string `json:"action,omitempty"`
	// Source says which matrix gave the cell: "default", or "org <id>"
	// for an org's override.
	Source string `json:"source"`
	// Note says what else the gate did: a preview gate of a tool without
	// a dry run falls back to confirm.
	Note string `json:"note,omitempty"`
}

// Cell is the verdict's cell, as messages name it: "supervised × high →
// confirm (default)".
func (v GateVerdict) Cell() string {
	s := fmt.Sprintf("%s × %s", v.Autonomy, v.Risk)
	if v.Action != "" {
		s = fmt.Sprintf("%s × %s (%s)", v.Autonomy, v.Risk, v.Action)
	}
	return fmt.Sprintf("%s → %s (%s)", s, v.Gate, v.Source)
}

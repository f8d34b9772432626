// Package rules is the Policy Guard's rule book as pure functions: no I/O,
// nothing but the data of a check. The orchestrator runs the loop rules where
// the loop runs (before each model call) and the policy service runs the call
// rules on every call of a model turn, from this one code base.
//
// A Guard runs a check's rules in order; the first denial wins, and its
// Decision says which rule denied and why, in words the model and an operator
// can act on. Warnings (a deprecated tool) do not stop a check.
package rules

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Decision is the answer to one check.
type Decision struct {
	Allowed bool
	// Code is POLICY_DENIED when the check was denied, empty when allowed.
	Code envelope.ErrorCode
	// Reason says why the check was denied; empty when allowed.
	Reason string
	// Rule names the rule that denied the check; empty when allowed.
	Rule string
	// Warnings are findings that do not block, such as a deprecated tool.
	Warnings []string
	// Details are a denial's particulars, such as the problems of an input
	// its tool's schema refuses; they go in the envelope's error.
	Details []string
	// ApprovalRequired, on an allowed tool call, says why the call must wait
	// for an operator's decision before it runs; empty when it need not.
	ApprovalRequired string
	// Gate is the gate matrix's verdict on a call of a registered tool,
	// with the cell that gave it.
	Gate *envelope.GateVerdict
}

// Allow is the decision of a rule that has nothing against a check.
func Allow() Decision { return Decision{Allowed: true} }

// Deny is a POLICY_DENIED decision with a formatted reason.
func Deny(format string, args ...any) Decision {
	return Decision{Code: envelope.CodePolicyDenied, Reason: fmt.Sprintf(format, args...)}
}

// Warn is an allowing decision that carries a warning.
func Warn(format string, args ...any) Decision {
	return Decision{Allowed: true, Warnings: []string{fmt.Sprintf(format, args...)}}
}

// Outcome is "approved" or "denied", for metrics and logs.
func (d Decision) Outcome() string {
	if d.Allowed {
		return "approved"
	}
	return "denied"
}

// Loop is what the loop rules judge before model call Iteration of a run.
type Loop struct {
	Iteration int
	Policy    envelope.Policy
	// ToolCalls is how many tool calls the run has made so far.
	ToolCalls int
	// Spend is what the run has cost so far (model turns and billed calls).
	Spend float64
	// MinCost is the least the model call asked for will cost: the tokens of
	// the previous call, which the next prompt repeats, at the model's input
	// price (0 for the first call or an unpriced model).
	MinCost float64
}

// Call is what the call rules judge: one call of a model turn, with what the
// turn says of the run and what the registry says of the tool.
type Call struct {
	Seq     int
	Name    string
	Version string // "" when the model named a tool the agent has not enabled
	// Policy and EnabledTools are the agent's.
	Policy       envelope.Policy
	EnabledTools []string
	// Spend is the run's spend when the turn's calls were made; Cost the
	// call's declared cost then; CostBefore the declared cost of the turn's
	// calls ahead of this one (lower seq).
	Spend, Cost, CostBefore float64
	// Tool is the registry's definition of Name@Version and State its
	// lifecycle state; Tool is nil when the registry does not hold it.
	Tool  *envelope.ToolDefinition
	State envelope.ToolState
	// Input is the call's arguments (the gate matrix reads the action a
	// tool's risk depends on); Org is the run's org (whose overrides of
	// the matrix apply).
	Input json.RawMessage
	Org   string
}

// Ref is the called tool's name@version.
func (c *Call) Ref() envelope.ToolRef { return envelope.ToolRef{Name: c.Name, Version: c.Version} }

// called is name@version, or the bare name when no version was resolved.
func (c *Call) called() string {
	if c.Version == "" {
		return c.Name
	}
	return c.Ref().String()
}

// Rule is one rule of a check of C (Loop or Call): its name, which a denial
// names, and the check.
type Rule[C any] struct {
	Name  string
	Check func(c *C) Decision
}

// LoopRule is one rule of the loop check.
type LoopRule = Rule[Loop]

// CallRule is one rule of the call check.
type CallRule = Rule[Call]

// Rule names, also the "rule" label of the guard's denial metric.
const (
	RuleMaxIterations = "max_iterations"
	RuleMaxBudget     = "max_budget"
	RuleEnabledTools  = "enabled_tools"
	RuleMaxToolCalls  = "max_tool_calls"
	RuleRegistered    = "registered"
	RuleLifecycle     = "lifecycle"
	RuleSideEffects   = "side_effects"
	RuleScopes        = "scopes"
)

// Guard runs the rules of each check in order; the first denial wins. Guards
// are immutable and safe for concurrent use.
type Guard struct {
	loop  []LoopRule
	call  []CallRule
	gates Gates
}

// WithGates is g deciding calls' gates with gates (the default matrix
// without overrides otherwise).
func (g *Guard) WithGates(gates Gates) *Guard {
	c := *g
	c.gates = gates
	return &c
}

// NewGuard returns a guard with DefaultLoopRules and DefaultCallRules.
func NewGuard() *Guard { return NewGuardWith(DefaultLoopRules(), DefaultCallRules()) }

// NewGuardWith returns a guard with the given rules, run in order.
func NewGuardWith(loop []LoopRule, call []CallRule) *Guard {
	return &Guard{loop: slices.Clone(loop), call: slices.Clone(call)}
}

// DefaultLoopRules: the iteration cap, then the budget.
func DefaultLoopRules() []LoopRule {
	return []LoopRule{
		{Name: RuleMaxIterations, Check: MaxIterations},
		{Name: RuleMaxBudget, Check: MaxBudgetLoop},
	}
}

// DefaultCallRules: the allow-list first (a tool the agent may not use is
// refused whatever else holds), then the cap, then what the registry says of
// the version (registered, lifecycle, side effects, scopes), the budget last.
func DefaultCallRules() []CallRule {
	return []CallRule{
		{Name: RuleEnabledTools, Check: EnabledTools},
		{Name: RuleMaxToolCalls, Check: MaxToolCalls},
		{Name: RuleRegistered, Check: Registered},
		{Name: RuleLifecycle, Check: Lifecycle},
		{Name: RuleSideEffects, Check: SideEffects},
		{Name: RuleScopes, Check: Scopes},
		{Name: RuleMaxBudget, Check: MaxBudgetCall},
	}
}

// CheckLoop decides whether model call c.Iteration of a run may happen.
func (g *Guard) CheckLoop(c Loop) Decision { return check(g.loop, &c) }

// CheckCall decides whether a tool call may run, and whether it must first
// wait for an operator's approval.
func (g *Guard) CheckCall(c Call) Decision {
	dec := check(g.call, &c)
	if dec.Allowed && c.Tool != nil {
		def := *c.Tool
		def.Metadata.SideEffects = EffectiveSideEffects(&def)
		if need, why := c.Policy.RequireApproval.Requires(&def); need {
			dec.ApprovalRequired = why
		}
	}
	g.gate(&c, &dec)
	return dec
}

// check runs rules on c in order: the first that denies decides; the
// warnings of every rule that ran are kept.
func check[C any](rules []Rule[C], c *C) Decision {
	var warnings []string
	for _, r := range rules {
		d := r.Check(c)
		warnings = append(warnings, d.Warnings...)
		if !d.Allowed {
			return denied(d, r.Name, warnings)
		}
	}
	return Decision{Allowed: true, Warnings: warnings}
}

func denied(d Decision, rule string, warnings []string) Decision {
	d.Allowed, d.Warnings = false, warnings
	if d.Code == "" {
		d.Code = envelope.CodePolicyDenied
	}
	if d.Rule == "" {
		d.Rule = rule
	}
	return d
}

// MaxIterations caps the model calls of a run (max_iterations, default 10;
// docs/policy.md, Guard): call n is allowed while n <= the cap.
func MaxIterations(c *Loop) Decision {
	limit := c.Policy.Iterations()
	if c.Iteration > limit {
		return Deny("max_iterations (%d) reached: iteration %d not allowed", limit, c.Iteration)
	}
	return Allow()
}

// budgetSlack absorbs the rounding of float sums: a run exactly at its budget
// is within it.
const budgetSlack = 1e-9

// MaxBudgetLoop enforces max_budget before a model call (docs/agent-loop.md,
// Budget): the call is refused when the run's spend plus the least the call
// will cost would pass the budget. A zero budget means no limit.
func MaxBudgetLoop(c *Loop) Decision {
	limit := c.Policy.MaxBudget
	if limit <= 0 || c.Spend+c.MinCost <= limit+budgetSlack {
		return Allow()
	}
	if c.MinCost <= 0 {
		return Deny("max_budget (%s) reached: the run has spent %s, nothing is left for model call %d",
			money(limit), money(c.Spend), c.Iteration)
	}
	return Deny("max_budget (%s) would be exceeded by model call %d: the run has spent %s and the call costs at least %s",
		money(limit), c.Iteration, money(c.Spend), money(c.MinCost))
}

// EnabledTools is the strict allow-list (enabled_tools; docs/policy.md,
// Guard): the called name@version must be one of the agent's enabled tools.
// The model calls tools by bare name and the orchestrator fills in the enabled
// version, so a tool that is not enabled at all arrives without a version and
// never matches.
func EnabledTools(c *Call) Decision {
	if c.Version != "" && slices.Contains(c.EnabledTools, c.Ref().String()) {
		return Allow()
	}
	enabled := "none"
	if len(c.EnabledTools) > 0 {
		enabled = strings.Join(c.EnabledTools, ", ")
	}
	return Deny("tool %s is not enabled for this agent (enabled: %s)", c.called(), enabled)
}

// MaxToolCalls caps the tool calls of a run (max_tool_calls, default 25;
// docs/policy.md, Guard). The orchestrator numbers a run's calls 1, 2, ... in
// order, also across the parallel calls of one turn, so call #n is allowed
// while n <= the cap and a turn that would cross it runs its first calls and
// is refused the rest.
func MaxToolCalls(c *Call) Decision {
	limit := c.Policy.ToolCalls()
	if c.Seq > limit {
		return Deny("max_tool_calls (%d) reached: call #%d not allowed", limit, c.Seq)
	}
	return Allow()
}

// Registered refuses a version the tool registry does not hold
// (docs/policy.md, Guard).
func Registered(c *Call) Decision {
	if c.Tool == nil {
		return Deny("unknown tool %s: it is not in the tool registry", c.called())
	}
	return Allow()
}

// Lifecycle applies the registry state of the version (docs/policy.md,
// Registry): blocked is refused, deprecated runs with a warning, active runs.
// Any other state is refused: the guard fails closed.
func Lifecycle(c *Call) Decision {
	switch c.State {
	case envelope.ToolActive:
		return Allow()
	case envelope.ToolDeprecated:
		return Warn("tool %s is deprecated", c.Ref())
	case envelope.ToolBlocked:
		return Deny("tool %s is blocked", c.Ref())
	case envelope.ToolDraft:
		return Deny("tool %s is a draft: it does not run until it is published", c.Ref())
	default:
		return Deny("tool %s has unknown registry state %q", c.Ref(), c.State)
	}
}

// SideEffects applies the agent's side-effect ceiling (side_effects;
// docs/policy.md, Guard): a tool whose declared side effects rank above the
// ceiling is refused, so a read-only node (ceiling reads) never runs a tool
// that writes. No ceiling means writes. A tool whose side effects are unknown
// is refused.
func SideEffects(c *Call) Decision {
	ceiling := c.Policy.SideEffectCeiling()
	got := EffectiveSideEffects(c.Tool)
	if got.Rank() < 0 {
		return Deny("tool %s declares unknown side effects %q", c.Ref(), got)
	}
	if ceiling.Rank() < 0 {
		return Deny("the agent's side_effects ceiling %q is not one of none, reads, writes", ceiling)
	}
	if got.Rank() > ceiling.Rank() {
		return Deny("tool %s has side effects %q, above this agent's ceiling %q", c.Ref(), got, ceiling)
	}
	return Allow()
}

// Scopes requires every scope the tool's definition names (required_scopes)
// to be granted to the run (policy.scopes).
func Scopes(c *Call) Decision {
	var missing []string
	if c.Tool != nil {
		for _, s := range c.Tool.RequiredScopes {
			if !slices.Contains(c.Policy.Scopes, s) {
				missing = append(missing, s)
			}
		}
	}
	if len(missing) == 0 {
		return Allow()
	}
	granted := "none"
	if len(c.Policy.Scopes) > 0 {
		granted = strings.Join(c.Policy.Scopes, ", ")
	}
	noun := "scope"
	if len(missing) > 1 {
		noun = "scopes"
	}
	return Deny("tool %s needs %s %s, not granted to this run (granted: %s)",
		c.Ref(), noun, strings.Join(missing, ", "), granted)
}

// MaxBudgetCall enforces max_budget before a tool call. The calls of one
// model turn are judged together, each with the run's spend when the turn
// made them and the declared cost of the turn's calls ahead of it: call #n
// runs only if the spend plus the cost of the turn's calls up to and
// including it stays within the budget, so that a turn that would cross the
// budget runs its first calls and is refused the rest, before any of them
// runs. The call's own cost is the larger of the turn's and the registry's,
// so that a registry change between the turn and the check never lets a call
// through cheaper than it is.
func MaxBudgetCall(c *Call) Decision {
	limit := c.Policy.MaxBudget
	if limit <= 0 {
		return Allow()
	}
	cost := c.Cost
	if c.Tool != nil {
		cost = max(cost, c.Tool.Cost)
	}
	if c.Spend+c.CostBefore+cost <= limit+budgetSlack {
		return Allow()
	}
	return Deny("max_budget (%s) would be exceeded by call #%d (%s, cost %s): the run has spent %s and this turn's calls up to it cost %s",
		money(limit), c.Seq, c.called(), money(cost), money(c.Spend), money(c.CostBefore+cost))
}

// EffectiveSideEffects is what the guard assumes a tool does: its declared
// side effects, or writes (the worst) when it declares none (or is unknown).
func EffectiveSideEffects(def *envelope.ToolDefinition) envelope.SideEffects {
	if def == nil || def.Metadata.SideEffects == "" {
		return envelope.SideEffectsWrites
	}
	return def.Metadata.SideEffects
}

// money prints an amount with up to six significant digits: 0.03, not
// 0.030000000000000002.
func money(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

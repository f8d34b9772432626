package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
)

// Decision is the guard's answer to one check.
type Decision struct {
	Allowed bool
	// Code is POLICY_DENIED when the check was denied, empty when allowed.
	Code envelope.ErrorCode
	// Reason says why the check was denied, in words the model and an operator
	// can act on; empty when allowed.
	Reason string
	// Rule names the rule that denied the check; empty when allowed.
	Rule string
	// Warnings are findings that do not block, such as a deprecated tool.
	Warnings []string
	// ApprovalRequired, on an allowed tool call, says why the call must wait
	// for an operator's decision before it runs; empty when it need not.
	ApprovalRequired string
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

// Lookup finds a tool version in the tool registry; (*registry.Catalog).Lookup
// is one.
type Lookup func(envelope.ToolRef) (registry.Entry, bool)

// CallCheck is what a call rule judges: the request, exactly as the
// orchestrator published it, and the registry's entry for the called version.
type CallCheck struct {
	Request *events.CallRequest
	Entry   registry.Entry
	// Registered reports whether the registry holds name@version; Entry is the
	// zero value when it does not.
	Registered bool
}

// IterationRule is one rule of the iteration check. Rules are pure: everything
// they need is in the check.
type IterationRule struct {
	Name  string
	Check func(c *events.IterationCheck) Decision
}

// CallRule is one rule of the tool call check. Rules are pure: everything they
// need is in the request and the registry entry.
type CallRule struct {
	Name  string
	Check func(c *CallCheck) Decision
}

// Guard is the Policy Guard's rule book (spec 5.1): it runs a check's rules in
// order and the first denial wins. Guards are immutable and safe for
// concurrent use.
type Guard struct {
	iteration []IterationRule
	call      []CallRule
}

// Rule names, also the "rule" label of the denial metric.
const (
	RuleMaxIterations = "max_iterations"
	RuleEnabledTools  = "enabled_tools"
	RuleMaxToolCalls  = "max_tool_calls"
	RuleRegistered    = "registered"
	RuleLifecycle     = "lifecycle"
	RuleSideEffects   = "side_effects"
	RuleScopes        = "scopes"
)

// NewGuard returns a guard with the default rules (DefaultIterationRules and
// DefaultCallRules, each in its order).
func NewGuard() *Guard {
	return NewGuardWith(DefaultIterationRules(), DefaultCallRules())
}

// NewGuardWith returns a guard with the given rules, run in order.
func NewGuardWith(iteration []IterationRule, call []CallRule) *Guard {
	return &Guard{iteration: slices.Clone(iteration), call: slices.Clone(call)}
}

// DefaultIterationRules are the iteration rules of NewGuard.
func DefaultIterationRules() []IterationRule {
	return []IterationRule{
		{Name: RuleMaxIterations, Check: MaxIterations},
		{Name: RuleMaxBudget, Check: MaxBudgetIteration},
	}
}

// DefaultCallRules are the tool call rules of NewGuard. The allow-list comes
// first (a tool the agent may not use is refused whatever else holds), then the
// cap, then what the registry says about the version (registered, lifecycle,
// side effects, scopes), and the budget last.
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

// CheckIteration decides whether iteration c.Iteration of a run may call the
// model.
func (g *Guard) CheckIteration(c events.IterationCheck) Decision {
	var warnings []string
	for _, r := range g.iteration {
		d := r.Check(&c)
		warnings = append(warnings, d.Warnings...)
		if !d.Allowed {
			return denied(d, r.Name, warnings)
		}
	}
	return Decision{Allowed: true, Warnings: warnings}
}

// CheckCall decides whether a tool call may run; lookup resolves the called
// version in the tool registry.
func (g *Guard) CheckCall(req events.CallRequest, lookup Lookup) Decision {
	c := CallCheck{Request: &req}
	if lookup != nil && req.Version != "" {
		c.Entry, c.Registered = lookup(req.Ref())
	}
	var warnings []string
	for _, r := range g.call {
		d := r.Check(&c)
		warnings = append(warnings, d.Warnings...)
		if !d.Allowed {
			return denied(d, r.Name, warnings)
		}
	}
	dec := Decision{Allowed: true, Warnings: warnings}
	if c.Registered {
		def := c.Entry.Definition
		def.Metadata.SideEffects = effectiveSideEffects(&def)
		if need, why := req.Policy.RequireApproval.Requires(&def); need {
			dec.ApprovalRequired = why
		}
	}
	return dec
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

// MaxIterations caps the LLM-tool loops of a run (spec 5.1, max_iterations,
// default 10): iteration n is allowed while n <= the cap.
func MaxIterations(c *events.IterationCheck) Decision {
	limit := c.Policy.Iterations()
	if c.Iteration > limit {
		return Deny("max_iterations (%d) reached: iteration %d not allowed", limit, c.Iteration)
	}
	return Allow()
}

// EnabledTools is the strict allow-list (spec 5.1, enabled_tools): the called
// name@version must be one of the agent's enabled tools. The model calls tools
// by bare name and the orchestrator fills in the enabled version, so a tool
// that is not enabled at all arrives without a version and never matches.
func EnabledTools(c *CallCheck) Decision {
	req := c.Request
	if req.Version != "" && slices.Contains(req.EnabledTools, req.Ref().String()) {
		return Allow()
	}
	enabled := "none"
	if len(req.EnabledTools) > 0 {
		enabled = strings.Join(req.EnabledTools, ", ")
	}
	return Deny("tool %s is not enabled for this agent (enabled: %s)", calledTool(req), enabled)
}

// MaxToolCalls caps the tool calls of a run (spec 5.1, max_tool_calls, default
// 25). The orchestrator numbers a run's calls 1, 2, ... in order, also across
// the parallel calls of one turn, so call #n is allowed while n <= the cap and
// a turn that would cross it runs its first calls and is refused the rest.
func MaxToolCalls(c *CallCheck) Decision {
	limit := c.Request.Policy.ToolCalls()
	if c.Request.Seq > limit {
		return Deny("max_tool_calls (%d) reached: call #%d not allowed", limit, c.Request.Seq)
	}
	return Allow()
}

// Registered refuses a version the tool registry does not hold (spec 7.1: all
// tools are versioned in the registry).
func Registered(c *CallCheck) Decision {
	if !c.Registered {
		return Deny("unknown tool %s: it is not in the tool registry", calledTool(c.Request))
	}
	return Allow()
}

// Lifecycle applies the registry state of the version (spec 7.2): blocked is
// refused, deprecated runs with a warning, active runs. Any other state is
// refused: the guard fails closed.
func Lifecycle(c *CallCheck) Decision {
	ref := c.Request.Ref()
	switch c.Entry.State {
	case registry.StateActive:
		return Allow()
	case registry.StateDeprecated:
		return Warn("tool %s is deprecated", ref)
	case registry.StateBlocked:
		return Deny("tool %s is blocked", ref)
	default:
		return Deny("tool %s has unknown registry state %q", ref, c.Entry.State)
	}
}

// calledTool is name@version, or the bare name when no version was resolved.
func calledTool(req *events.CallRequest) string {
	if req.Version == "" {
		return req.Name
	}
	return req.Ref().String()
}

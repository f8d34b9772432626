package policy

import (
	"strconv"

	"github.com/toolwire/toolwire/pkg/events"
)

// RuleMaxBudget names the budget rule of both checks.
const RuleMaxBudget = "max_budget"

// budgetSlack absorbs the rounding of float sums: a run exactly at its budget
// is within it.
const budgetSlack = 1e-9

// MaxBudgetIteration enforces max_budget before a model call (spec 5.1): the
// run's spend is accrued live by the orchestrator (model tokens at its prices,
// plus executed tools' declared costs), and MinCost is the least the next call
// will cost. The call is refused when spend + MinCost would pass the budget. A
// zero budget means no limit.
func MaxBudgetIteration(c *events.IterationCheck) Decision {
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

// MaxBudgetCall enforces max_budget before a tool call. The orchestrator
// requests the calls of one model turn together, each with the run's spend at
// that moment and the declared cost of the turn's calls ahead of it; call #n
// runs only if the spend plus the cost of the turn's calls up to and including
// it stays within the budget, so that a turn that would cross the budget runs
// its first calls and is refused the rest, before any of them runs. The call's
// own cost is the larger of the request's and the registry's, so that a
// registry change between request and check never lets a call through
// cheaper than it is.
func MaxBudgetCall(c *CallCheck) Decision {
	req := c.Request
	limit := req.Policy.MaxBudget
	if limit <= 0 {
		return Allow()
	}
	cost := max(req.Cost, c.Entry.Definition.Cost)
	total := req.Spend + req.BatchCostBefore + cost
	if total <= limit+budgetSlack {
		return Allow()
	}
	return Deny("max_budget (%s) would be exceeded by call #%d (%s, cost %s): the run has spent %s and this turn's calls up to it cost %s",
		money(limit), req.Seq, calledTool(req), money(cost), money(req.Spend), money(req.BatchCostBefore+cost))
}

// money prints an amount with up to six significant digits: 0.03, not
// 0.030000000000000002.
func money(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

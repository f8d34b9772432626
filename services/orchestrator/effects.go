package orchestrator

import (
	"context"
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// cause names the event a handler handled; the effects it publishes are those
// that event caused, derived from the run state alone, so that a redelivered
// event (after a crash between the state change and its publishes) publishes
// exactly what was missing, and JetStream drops the rest as duplicates by id.
type cause struct {
	created   bool   // the run request
	iteration int    // the verdict of this iteration (and the model turn it led to)
	callID    string // the completion of this call
	approval  string // an approval event of this call
}

// publishEffects publishes every event the state implies for the cause. All
// ids are deterministic.
func (s *Service) publishEffects(ctx context.Context, st *RunState, c cause) error {
	tr := st.Trace
	ctx = events.ContextWithRunTrace(ctx, tr)
	req := st.Request
	traceID := traceIDOf(tr)
	// next holds the events another service waits for (call requests, the
	// next iteration's check), outs the others (lifecycle, model turns,
	// usage): next goes out first, so that the server stores and delivers
	// the agent loop's next hop before the records of this one.
	var next, outs []events.Outgoing
	add := func(o events.Outgoing, err error) error {
		if err != nil {
			return err
		}
		switch o.Event.Type() {
		case events.TypeCallRequested, events.TypeIterationRequested:
			next = append(next, o)
		default:
			outs = append(outs, o)
		}
		return nil
	}
	status := func(name, reason string) events.RunStatus {
		return events.RunStatus{RunID: st.RunID, Status: name, Agent: req.Agent.Name, Tenant: req.Tenant, TraceID: traceID,
			Iteration: st.Iteration, ToolCalls: len(st.Calls), Spend: st.Spend, Reason: reason}
	}

	if c.created {
		started := status(events.StatusStarted, "")
		started.Warnings = st.Warnings
		if err := add(events.NewRunStatus(s.cfg.Source, started, "", tr)); err != nil {
			return err
		}
	}
	if n := c.iteration; n > 0 {
		if turn := st.turn(n); turn != nil {
			if err := add(events.NewLLMCompleted(s.cfg.Source, events.LLMCompleted{RunID: st.RunID, Turn: *turn}, req.Tenant, tr)); err != nil {
				return err
			}
			if u := st.turnUsage(n); u != nil {
				if err := add(events.NewUsage(s.cfg.Source, s.modelUsage(st, u), tr)); err != nil {
					return err
				}
			}
			calls := st.callsOf(n)
			var batch float64
			for _, call := range calls {
				if !call.Local {
					batch += call.Cost
				}
			}
			var before float64
			for _, call := range calls {
				switch {
				case call.Local:
					if err := add(events.NewCallCompleted(s.cfg.Source, st.RunID, *call.Envelope, req.Tenant, tr)); err != nil {
						return err
					}
					if err := add(events.NewUsage(s.cfg.Source, s.toolUsage(st, call), tr)); err != nil {
						return err
					}
				case call.Envelope == nil:
					err := add(events.NewCallRequest(s.cfg.Source, "requested", events.CallRequest{
						RunID: st.RunID, CallID: call.CallID, Seq: call.Seq, Iteration: call.Iteration, Name: call.Name,
						Version: call.Version, Input: call.Input, ProviderCallID: call.ProviderCallID, Tenant: req.Tenant,
						Agent: req.Agent.Name, EnabledTools: req.Agent.EnabledTools, Policy: req.Agent.Policy,
						Spend: st.spendAt(n), Cost: call.Cost, BatchCost: batch, BatchCostBefore: before,
					}, tr))
					if err != nil {
						return err
					}
				}
				if !call.Local {
					before += call.Cost
				}
			}
		}
	}
	if c.callID != "" {
		if call := st.call(c.callID); call != nil {
			if call.Envelope != nil && call.UsageN > 0 {
				if err := add(events.NewUsage(s.cfg.Source, s.toolUsage(st, call), tr)); err != nil {
					return err
				}
			}
			if call.Approval == ApprovalResumed {
				if err := add(events.NewRunStatus(s.cfg.Source, status(events.StatusResumed, call.ResumedBy), call.CallID, tr)); err != nil {
					return err
				}
			}
		}
	}
	if c.approval != "" {
		if call := st.call(c.approval); call != nil && call.Approval != "" {
			reason := fmt.Sprintf("waiting for approval of call %s (%s)", call.CallID, call.ref())
			if err := add(events.NewRunStatus(s.cfg.Source, status(events.StatusSuspended, reason), call.CallID, tr)); err != nil {
				return err
			}
			if call.Approval == ApprovalResumed {
				if err := add(events.NewRunStatus(s.cfg.Source, status(events.StatusResumed, call.ResumedBy), call.CallID, tr)); err != nil {
					return err
				}
			}
		}
	}

	final := false
	switch {
	case st.Phase == PhaseAwaitingVerdict && s.causedIteration(st, c):
		m := req.Agent.Model
		err := add(events.NewIterationRequested(s.cfg.Source, events.IterationCheck{
			RunID: st.RunID, Iteration: st.Iteration, Tenant: req.Tenant, Agent: req.Agent.Name,
			Policy: req.Agent.Policy, ToolCalls: len(st.Calls), Spend: st.Spend, MinCost: s.minModelCost(st, m),
		}, tr))
		if err != nil {
			return err
		}
	case st.Done() && (c.created || c.iteration > 0 || c.callID != ""):
		end := status(events.StatusCompleted, st.Reason)
		end.Outputs, end.Pinned = st.Outputs, st.Pinned
		if st.Phase == PhaseFailed {
			end.Status, end.Code = events.StatusFailed, st.Code
		}
		if err := add(events.NewRunStatus(s.cfg.Source, end, "", tr)); err != nil {
			return err
		}
		final = true
	}
	if err := s.pub.PublishAll(ctx, append(next, outs...)); err != nil {
		return err
	}
	if final {
		s.metrics.runs.WithLabelValues(st.Phase).Inc()
	}
	return nil
}

// causedIteration reports whether the cause is what led to the check of the
// current iteration: the run's start (iteration 1), or the previous turn (its
// calls all answered at once, or its last envelope). Other causes leave it
// alone, so that an old event redelivered much later does not ask again.
func (s *Service) causedIteration(st *RunState, c cause) bool {
	switch {
	case c.created:
		return st.Iteration == 1
	case c.iteration > 0:
		return c.iteration == st.Iteration-1
	case c.callID != "":
		call := st.call(c.callID)
		return call != nil && call.Iteration == st.Iteration-1
	}
	return false
}

// minModelCost is the least the next model call costs: its prompt repeats
// the previous call's prompt and answer, at the model's input price.
func (s *Service) minModelCost(st *RunState, m envelope.Model) float64 {
	u := st.turnUsage(st.Iteration - 1)
	if u == nil {
		return 0
	}
	price, _ := s.cfg.Prices.For(m.Provider, m.Name)
	return price.Cost(u.InputTokens+u.OutputTokens, 0)
}

func (s *Service) modelUsage(st *RunState, u *TurnUsage) events.Usage {
	m := st.Request.Agent.Model
	return events.Usage{
		RunID: st.RunID, N: u.UsageN, Kind: events.UsageKindModel, Tenant: st.Request.Tenant, Agent: st.Request.Agent.Name,
		Iteration: u.Iteration, Provider: m.Provider, Model: m.Name, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		Cost: u.Cost, Unpriced: u.Unpriced, Billed: true,
	}
}

func (s *Service) toolUsage(st *RunState, c *CallState) events.Usage {
	u := events.Usage{
		RunID: st.RunID, N: c.UsageN, Kind: events.UsageKindTool, Tenant: st.Request.Tenant, Agent: st.Request.Agent.Name,
		Iteration: c.Iteration, Tool: c.ref(), CallID: c.CallID, Billed: c.Billed,
	}
	if c.Billed {
		u.Cost = c.Cost
	}
	return u
}

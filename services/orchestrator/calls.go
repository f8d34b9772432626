package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// handleCallCompleted stores a call's envelope and what it cost; when the
// turn's last envelope arrives, the results go into the conversation and the
// next iteration is requested.
func (s *Service) handleCallCompleted(ctx context.Context, d *events.Delivery) error {
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return events.Permanent(err)
	}
	var env envelope.ToolEnvelope
	if err := events.DecodeData(d.Event, &env); err != nil {
		return events.Permanent(err)
	}
	if env.CallID != subj.CallID {
		return events.Permanent(fmt.Errorf("envelope call_id %s does not match subject %s", env.CallID, d.Subject))
	}
	recorded := false
	st, _, err := s.states.update(ctx, subj.RunID, func(st *RunState) (bool, error) {
		recorded = false
		c := st.call(env.CallID)
		if c == nil {
			return false, events.Permanent(fmt.Errorf("run %s has no call %s", subj.RunID, env.CallID))
		}
		if c.Envelope != nil || st.Done() {
			return false, nil // a duplicate
		}
		e := env
		c.Envelope = &e
		c.Billed = billable(c, &e)
		st.NextUsage++
		c.UsageN = st.NextUsage
		if c.Approval == ApprovalWaiting {
			c.Approval, c.ResumedBy = ApprovalResumed, resumedByCompletion(c, &e)
		}
		if c.Iteration == st.Iteration {
			advanceIfTurnDone(st)
		}
		st.recomputeSpend()
		recorded = true
		return true, nil
	})
	if errors.Is(err, errNoRunState) {
		// A call outside any run of ours (a tool node run by `toolwire call`):
		// its envelope is for whoever asked, not for the agent loop.
		s.log.Debug("envelope of a call outside any run", "run_id", subj.RunID, "call_id", env.CallID)
		return nil
	}
	if err != nil {
		return err
	}
	if recorded && env.Error != nil && env.Error.Code == envelope.CodeUnknown {
		// The model saw the code and message only; the internals are here.
		s.log.WarnContext(ctx, "tool call failed with an internal error", "run_id", subj.RunID, "call_id", env.CallID,
			"tool", env.Name+"@"+env.Version, "message", env.Error.Message, "details", env.Error.Details)
	}
	c := st.call(env.CallID)
	if err := s.fault(ctx, FaultAfterRecordEnvelope, subj.RunID, c.Iteration); err != nil {
		return err
	}
	return s.publishEffects(ctx, st, cause{callID: env.CallID})
}

func resumedByCompletion(c *CallState, env *envelope.ToolEnvelope) string {
	if env.Error != nil {
		return fmt.Sprintf("call %s (%s) completed without approval: %s: %s", c.CallID, c.ref(), env.Error.Code, env.Error.Message)
	}
	return fmt.Sprintf("call %s (%s) completed", c.CallID, c.ref())
}

// ref is the call's name@version, or its bare name when no version matched.
func (c *CallState) ref() string {
	if c.Version == "" {
		return c.Name
	}
	return c.Name + "@" + c.Version
}

// handleApproval follows the approvals of a run's calls: a call that needs an
// operator's decision (approval_required) suspends the run until its approval
// (approved) or its completion (a denial is a POLICY_DENIED completion)
// arrives, which resumes it. Nothing waits in memory meanwhile: the state is
// in KV, and any replica handles whichever event comes next.
func (s *Service) handleApproval(ctx context.Context, d *events.Delivery) error {
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return events.Permanent(err)
	}
	want := map[string]string{"approval_required": events.TypeCallApprovalRequired, "approved": events.TypeCallApproved}[subj.Verb]
	if want == "" || d.Event.Type() != want {
		return events.Permanent(fmt.Errorf("orchestrator: unexpected event type %q on %s", d.Event.Type(), d.Subject))
	}
	if subj.Verb == "approved" {
		// Every call the guard lets through is published as approved; only
		// an operator's approval can resume a suspended run.
		var req events.CallRequest
		if err := events.DecodeData(d.Event, &req); err != nil {
			return events.Permanent(err)
		}
		if !req.OperatorApproved {
			return nil
		}
	}
	unknownCall := false
	st, _, err := s.states.update(ctx, subj.RunID, func(st *RunState) (bool, error) {
		c := st.call(subj.CallID)
		unknownCall = c == nil
		if c == nil || !approvalChanges(st, c, subj.Verb) {
			return false, nil
		}
		if subj.Verb == "approval_required" {
			c.Approval = ApprovalWaiting
		} else {
			c.Approval, c.ResumedBy = ApprovalResumed, fmt.Sprintf("call %s (%s) approved", c.CallID, c.ref())
		}
		return true, nil
	})
	if errors.Is(err, errNoRunState) {
		// A call of a run this orchestrator never had (a tool node run by
		// `toolwire call`): there is no run to suspend or resume.
		return nil
	}
	if err != nil {
		return err
	}
	if unknownCall {
		if subj.Verb == "approval_required" {
			return events.Permanent(fmt.Errorf("approval required for call %s, which run %s never made", subj.CallID, subj.RunID))
		}
		return nil
	}
	return s.publishEffects(ctx, st, cause{approval: subj.CallID})
}

// approvalChanges reports whether an approval event changes the call's
// state: approval_required suspends a call still pending, approved resumes a
// waiting one. A late or repeated event changes nothing.
func approvalChanges(st *RunState, c *CallState, verb string) bool {
	switch verb {
	case "approval_required":
		return c.Approval == "" && c.Envelope == nil && !st.Done()
	case "approved":
		return c.Approval == ApprovalWaiting
	}
	return false
}

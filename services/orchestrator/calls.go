package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

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
// (watchApprovals) or its completion (a denial is a POLICY_DENIED completion)
// arrives, which resumes it. Nothing waits in memory meanwhile: the state is
// in KV, and any replica handles whichever event comes next.
func (s *Service) handleApproval(ctx context.Context, d *events.Delivery) error {
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return events.Permanent(err)
	}
	if subj.Verb != "approval_required" || d.Event.Type() != events.TypeCallApprovalRequired {
		return events.Permanent(fmt.Errorf("orchestrator: unexpected event type %q on %s", d.Event.Type(), d.Subject))
	}
	return s.applyApproval(ctx, subj.RunID, subj.CallID, string(subj.Verb))
}

// applyApproval records an approval event of a call ("approval_required" or
// "approved") in its run and publishes what it changed.
func (s *Service) applyApproval(ctx context.Context, runID, callID, verb string) error {
	unknownCall := false
	st, _, err := s.states.update(ctx, runID, func(st *RunState) (bool, error) {
		c := st.call(callID)
		unknownCall = c == nil
		if c == nil || !approvalChanges(st, c, verb) {
			return false, nil
		}
		if verb == "approval_required" {
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
		if verb == "approval_required" {
			return events.Permanent(fmt.Errorf("approval required for call %s, which run %s never made", callID, runID))
		}
		return nil
	}
	return s.publishEffects(ctx, st, cause{approval: callID})
}

// watchApprovals follows the guard's approval records and resumes a run when
// an operator's approval of its waiting call has been sent on to the
// executor (the record is approved and settled). Watching the records, rather
// than consuming every call.approved, costs nothing for the calls that need
// no approval. On start the watch goes through the records there are, so an
// approval given while no orchestrator ran is seen too; a run whose approval
// is missed anyway resumes when the call completes.
//
// ctx bounds the start only: the watch follows the records until Stop, with
// life (the service's lifetime) as the context of the run-state writes.
func (s *Service) watchApprovals(ctx, life context.Context) error {
	kv, err := s.js.KeyValue(ctx, events.BucketApprovals)
	if err != nil {
		return fmt.Errorf("orchestrator: open approvals: %w", err)
	}
	// The records there are now are applied in the background, as later
	// changes are: a start need not wait for them. The writes' context ends
	// before the watch stops, so that Stop does not wait for a write that
	// cannot finish.
	actx, cancel := context.WithCancel(life)
	w, err := events.WatchKV(ctx, kv, false, func(e jetstream.KeyValueEntry) { s.onApprovalRecord(actx, e) })
	if err != nil {
		cancel()
		return fmt.Errorf("orchestrator: %w", err)
	}
	s.OnStopFunc(func() {
		cancel()
		w.Stop()
	})
	return nil
}

// onApprovalRecord resumes the run of a call whose approval record is
// approved and settled.
func (s *Service) onApprovalRecord(ctx context.Context, e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		return // a deleted record
	}
	var rec events.ApprovalRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		s.log.Warn("unreadable approval record", "key", e.Key(), "err", err)
		return
	}
	if rec.State != events.ApprovalApproved || !rec.Settled {
		return
	}
	if err := s.applyApproval(ctx, rec.Call.RunID, rec.Call.CallID, "approved"); err != nil && ctx.Err() == nil {
		s.log.Warn("approval not applied; the call's completion resumes the run", "key", e.Key(), "err", err)
	}
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

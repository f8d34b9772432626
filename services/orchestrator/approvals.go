package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/kvwatch"
)

// Approvals. A call that the run's policy makes wait for an operator's
// decision (mayWaitForApproval) has a small state of its own beside the
// run's phase, PendingCall.Approval, moved by compare-and-set through
// withCall like every change of a run:
//
//	""      -> waiting  approval_required (handleApproval); the run's
//	                    suspended event is published
//	waiting -> resumed  the guard's approval record, approved and settled
//	                    (watchApprovals, onApprovalRecord); the suspended
//	                    event, then the resumed one, are published
//	waiting -> resumed  the call's envelope, whatever it says (a denial is a
//	                    POLICY_DENIED completion; handleCallCompleted in
//	                    loop.go); the resumed event is published
//
// The run stays awaiting_tools meanwhile, and the call's envelope moves it on
// as any other's. Nothing waits in memory: any replica handles whichever of
// these events comes next, in whatever order. A suspension or resumption has
// a deterministic event id (run, status, call), so that publishing it again
// on a redelivery adds nothing.

// handleApproval follows the approvals of a run's calls: a call that needs an
// operator's decision (approval_required) suspends the run until its approval
// (watchApprovals) or its completion (a denial is a POLICY_DENIED completion)
// arrives, which resumes it. Nothing waits in memory meanwhile: the state is
// in KV, and any replica handles whichever event comes next.
func (s *Service) handleApproval(ctx context.Context, d *consume.Delivery) error {
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return consume.Permanent(err)
	}
	if subj.Verb != events.VerbApprovalRequired || d.Event.Type() != events.TypeCallApprovalRequired {
		return consume.Permanent(fmt.Errorf("orchestrator: unexpected event type %q on %s", d.Event.Type(), d.Subject))
	}
	return s.applyApproval(ctx, subj.RunID, subj.CallID, events.VerbApprovalRequired, d.Attempt > 1)
}

// applyApproval records an approval event of a call (approval_required, or
// its approval) and publishes the suspension or resumption it causes.
func (s *Service) applyApproval(ctx context.Context, runID, callID string, verb events.Verb, again bool) error {
	changed := false
	st, known, err := s.withCall(ctx, runID, callID, func(st *RunState, c *PendingCall) bool {
		changed = false
		switch {
		case st.Done():
		case verb == events.VerbApprovalRequired && c.Approval == "" && !c.Done:
			c.Approval, changed = ApprovalWaiting, true
		case verb == events.VerbApproved && c.Approval == ApprovalWaiting:
			c.Approval, c.ResumedBy, changed = ApprovalResumed, fmt.Sprintf("call %s (%s) approved", c.CallID, c.ref()), true
		}
		return changed
	})
	if err != nil {
		return err
	}
	if !known {
		if verb == events.VerbApprovalRequired && st != nil && !st.Done() && st.Iteration > 0 {
			s.Log.Debug("approval required for a call the run's state does not hold", "run_id", runID, "call_id", callID)
		}
		return nil
	}
	c := st.call(callID)
	if c == nil || c.Approval == "" || (!changed && !again) {
		return nil
	}
	reason := fmt.Sprintf("waiting for approval of call %s (%s)", c.CallID, c.ref())
	if err := s.publishStatus(ctx, st, events.StatusSuspended, reason, c.CallID); err != nil {
		return err
	}
	if c.Approval == ApprovalResumed {
		return s.publishStatus(ctx, st, events.StatusResumed, c.ResumedBy, c.CallID)
	}
	return nil
}

// watchApprovals follows the guard's approval records and resumes a run when
// an operator's approval of its waiting call has been sent on to the
// executor (the record is approved and settled). Watching the records, rather
// than consuming every approved call, costs nothing for the calls that need
// no approval. On start the watch goes through the records there are, so an
// approval given while no orchestrator ran is seen too; a run whose approval
// is missed anyway resumes when the call completes.
//
// ctx bounds the start only: the watch follows the records until Stop, with
// life (the service's lifetime) as the context of the run-state writes.
func (s *Service) watchApprovals(ctx, life context.Context) error {
	kv, err := s.JS.KeyValue(ctx, events.BucketApprovals)
	if err != nil {
		return fmt.Errorf("orchestrator: open approvals: %w", err)
	}
	// The records there are now are applied in the background, as later
	// changes are: a start need not wait for them. The writes' context ends
	// before the watch stops, so that Stop does not wait for a write that
	// cannot finish.
	actx, cancel := context.WithCancel(life)
	w, err := kvwatch.WatchKV(ctx, kv, false, func(e jetstream.KeyValueEntry) { s.onApprovalRecord(actx, e) })
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
		s.Log.Warn("unreadable approval record", "key", e.Key(), "err", err)
		return
	}
	if rec.State != events.ApprovalApproved || !rec.Settled {
		return
	}
	if err := s.applyApproval(ctx, rec.Call.RunID, rec.Call.CallID, events.VerbApproved, false); err != nil && ctx.Err() == nil {
		s.Log.Warn("approval not applied; the call's completion resumes the run", "key", e.Key(), "err", err)
	}
}

// publishStatus publishes a suspension or resumption of the run about one
// of its calls.
func (s *Service) publishStatus(ctx context.Context, st *RunState, status, reason, callID string) error {
	o, err := events.NewRunStatus(s.cfg.Source, s.status(st, status, reason), callID, st.Trace)
	if err != nil {
		return consume.Permanent(err)
	}
	return s.Pub.Publish(events.ContextWithRunTrace(ctx, st.Trace), o)
}

// resumedByCompletion is the reason of a resumption by the call's envelope.
func resumedByCompletion(c *PendingCall, env *envelope.ToolEnvelope) string {
	if env.Error != nil {
		return fmt.Sprintf("call %s (%s) completed without approval: %s: %s", c.CallID, c.ref(), env.Error.Code, env.Error.Message)
	}
	return fmt.Sprintf("call %s (%s) completed", c.CallID, c.ref())
}

// mayWaitForApproval reports whether a call of a run under p may have to wait
// for an operator's approval (envelope.ApprovalPolicy). The approval events
// of such a call change its state beside its envelope (approval_required
// marks it waiting, and can be handled after the envelope that answers it),
// so its envelope takes the usual way, whose write orders the two.
func mayWaitForApproval(p envelope.Policy) bool {
	ra := p.RequireApproval
	return ra != nil && (ra.Writes || len(ra.Tools) > 0)
}

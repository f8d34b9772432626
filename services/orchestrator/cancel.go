package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/timers"
)

// Cancellation (docs/agent-loop.md, Cancellation; the contract is
// pkg/events/cancel.go).
//
// A cancel request reaches the orchestrators twice. Every replica hears it
// live (a core subscription; pkg/jetstream/cancels keeps what it heard): a
// model call of the run in flight here is stopped and its answer dropped,
// and no model call of the run starts here again. One replica takes it from the runs stream
// (DurableCancels, handleCancel) and writes it into the run's state
// (RunState.Cancel): a run whose model was due ends at once; a run
// awaiting its calls ends once the last of them has its envelope (advance,
// turns.go), which the guard, the executors and the workers send as they
// stop them, or when the grace (Config.CancelGrace) has passed, when the
// orchestrator answers what is still unanswered itself (onCancelGrace).
// The end is toolwire.run.<run_id>.cancelled, with the outputs of every
// call the run made, those cut short included; like every end its id is
// the run's end id, so a run ends once.

// DurableCancels is the orchestrator's consumer of cancel requests.
const DurableCancels = "orchestrator-cancels"

// The grace timers of cancelled runs (toolwire.timer.cancel.<run_id>), fired
// on DurableCancelGrace.
const (
	timerCancel        = "cancel"
	DurableCancelGrace = "orchestrator-cancel-grace"
)

// Cancel is what a run's state keeps of the request to stop it.
type Cancel struct {
	// Reason is the request's events.CancelRequest.Said: the reason of the
	// run's end.
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	// Through is the last turn whose calls the run's outputs hold, set
	// when the run ends: the current turn when it was awaiting its calls,
	// the one before when its model was due.
	Through int `json:"through,omitempty"`
}

// cancelled ends the run on its cancel request; the outputs hold the calls
// of turns 1..through.
func (s *RunState) cancelled(through int) {
	s.Phase, s.Reason, s.Code = PhaseCancelled, s.Cancel.Reason, ""
	s.Cancel.Through = max(through, 0)
}

// cancelledReason is the reason a call's cancelled envelope gives.
func cancelledReason(e *envelope.ToolError) string {
	if d, ok := e.Details.(map[string]any); ok {
		if r, ok := d["reason"].(string); ok && r != "" {
			return r
		}
	}
	return "cancelled"
}

// cancelOf is the run's cancel request, from its state or heard live.
func (s *Service) cancelOf(st *RunState) *Cancel {
	if st.Cancel != nil {
		return st.Cancel
	}
	if said, ok := s.cancels.Said(st.RunID, st.Tenant); ok {
		return &Cancel{Reason: said, At: time.Now().UTC()}
	}
	return nil
}

// watchModelCall has a cancel of the run heard here stop its model call
// (stop), until the returned func is called.
func (s *Service) watchModelCall(st *RunState, stop context.CancelFunc) func() {
	untrack, said := s.cancels.Track(st.RunID, st.Tenant, func(error) { stop() })
	if said != "" {
		stop() // cancelled meanwhile
		return func() {}
	}
	return untrack
}

// cancelOfRequest is the state's Cancel of a request.
func cancelOfRequest(c events.CancelRequest) Cancel {
	at := c.RequestedAt
	if at.IsZero() {
		at = time.Now().UTC()
	}
	return Cancel{Reason: c.Said(), At: at}
}

// listenCancels subscribes this replica to the cancel requests, live.
func (s *Service) listenCancels() error {
	stop, err := cancels.Listen(s.JS.Conn(), s.cancels, nil, func(subject string, err error) {
		s.Log.Warn("cancel request refused", "subject", subject, "err", err)
	})
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	s.OnStopFunc(stop)
	return nil
}

// cancelSpec is the consumer of the cancel requests.
func (s *Service) cancelSpec() consume.RunnerConfig {
	return consume.RunnerConfig{
		Spec: provision.ConsumerSpec{Stream: events.StreamRuns, Durable: DurableCancels,
			Filters: events.Filters(events.FilterRunCancelRequested), MaxAckPending: 1024, AckWait: s.cfg.shortAckWait()},
		Handler: s.handleCancel,
	}
}

// settleHorizon is how long after its request a live run's state may still
// be only in the memory of the replica making its first turn
// (stateStore.stash): until its deadline timer is stored.
func (s *Service) settleHorizon() time.Duration { return max(s.cfg.TimerAfter, 0) + 2*time.Second }

// handleCancel writes a cancel request into its run's state and ends the
// run when nothing is left running; what is running gets the grace.
func (s *Service) handleCancel(ctx context.Context, d *consume.Delivery) error {
	req, err := events.DecodeCancel(d.Event, d.Subject)
	if err != nil {
		return consume.Permanent(fmt.Errorf("orchestrator: %w", err))
	}
	runID, c := req.RunID, cancelOfRequest(req)
	refuse := func(why string) error {
		s.Log.Warn("cancel refused", "run_id", runID, "reason", why)
		return consume.Permanent(fmt.Errorf("orchestrator: cancel of run %s refused: %s", runID, why))
	}
	s.cancels.Cancel(req)
	if ended, err := s.endRecorded(ctx, runID); err != nil || ended {
		return err
	}
	st, _, err := s.states.get(ctx, runID)
	if err != nil {
		return err
	}
	if st == nil {
		if st, err = s.stateFromStream(ctx, runID); err != nil {
			return err
		}
	}
	if st == nil {
		r, at, err := s.history.requestAt(ctx, runID)
		if errors.Is(err, errNotRecorded) {
			s.Log.Warn("cancel of a run never requested", "run_id", runID)
			return nil
		}
		if err != nil {
			return err
		}
		if !req.Covers(r.Tenant) {
			return refuse("the run is another tenant's")
		}
		if time.Since(at) < s.settleHorizon() {
			// Its first model call is being made by a replica that heard
			// the cancel too and stops it; the state is written soon.
			return consume.Transient(fmt.Errorf("run %s: its first turn is being made, its state is not stored yet", runID))
		}
		// Never taken up (its request dead-lettered, say): it ends here.
		st = newRunState(r, events.RunTrace{})
		st.Deadline = at.Add(s.deadlineFor(r))
		return s.cancelRun(ctx, st, fromRequest, &c)
	}
	if !req.Covers(st.Tenant) {
		return refuse("the run is another tenant's")
	}
	if st.Done() {
		_, err := s.publishEnd(ctx, st, nil)
		return err
	}
	if st.Phase == PhaseCalling {
		// Its turn may be published and not yet recorded: then its calls
		// are out, and the run waits for their envelopes.
		t, _, err := s.history.turn(ctx, runID, st.Iteration)
		switch {
		case errors.Is(err, errRunEnded):
			return s.followEnd(ctx, runID)
		case errors.Is(err, errNotRecorded):
		case err != nil:
			return err
		default:
			if st, _, err = s.states.update(ctx, runID, func(cur *RunState) (bool, error) {
				return cur.recordTurn(t), nil
			}); err != nil {
				return err
			}
		}
	}
	return s.cancelRun(ctx, st, fromStore, &c)
}

// cancelRun writes c into the run's state (from says where st comes from,
// as for failRun) and ends the run when nothing of it runs: its model was
// due, or every call of its turn has its envelope. Otherwise the grace
// timer is armed.
func (s *Service) cancelRun(ctx context.Context, st *RunState, from stateSource, c *Cancel) error {
	if from == fromRequest {
		x := *c
		st.Cancel = &x
		if st.Phase == PhaseCalling || st.Iteration == 0 {
			st.cancelled(st.Iteration - 1)
		}
		if err := s.createOrGet(ctx, st); err != nil {
			return err
		}
		if st.Done() {
			_, err := s.publishEnd(ctx, st, nil)
			return err
		}
	}
	cur, _, err := s.states.update(ctx, st.RunID, func(cur *RunState) (bool, error) {
		if cur.Done() {
			return false, nil
		}
		changed := cur.Cancel == nil
		if changed {
			x := *c
			cur.Cancel = &x
		}
		switch {
		case cur.Phase == PhaseCalling:
			cur.cancelled(cur.Iteration - 1)
			return true, nil
		case cur.Phase == PhaseAwaitingTools && cur.allDone():
			cur.cancelled(cur.Iteration)
			return true, nil
		}
		return changed, nil
	})
	if err != nil {
		return err
	}
	if !cur.Done() {
		s.Log.Info("run cancelled; waiting for its calls to stop", "run_id", st.RunID, "grace", s.cfg.CancelGrace)
		return timers.ArmTimer(ctx, s.JS, timerCancel, st.RunID, time.Now().Add(s.cfg.CancelGrace))
	}
	if _, err := s.publishEnd(ctx, cur, nil); err != nil {
		return err
	}
	s.Log.Info("run cancelled", "run_id", st.RunID, "reason", cur.Reason)
	return nil
}

// startCancelGrace starts the consumer of the cancelled runs' grace timers.
func (s *Service) startCancelGrace(ctx context.Context) error {
	return s.startTimers(ctx, DurableCancelGrace, timerCancel, s.onCancelGrace)
}

// onCancelGrace answers the calls of a cancelled run that have no envelope
// when its grace has passed: each gets a TIMEOUT envelope saying its
// outcome was not reported, and the last of them ends the run (advance).
func (s *Service) onCancelGrace(ctx context.Context, _, runID string) error {
	st, _, err := s.states.get(ctx, runID)
	if err != nil || st == nil {
		return err
	}
	if st.Done() {
		_, err := s.publishEnd(ctx, st, nil)
		return err
	}
	if st.Cancel == nil {
		return nil
	}
	if st.Phase != PhaseAwaitingTools {
		return s.cancelRun(ctx, st, fromStore, st.Cancel)
	}
	t, tr, err := s.history.turn(ctx, runID, st.Iteration)
	if errors.Is(err, errRunEnded) {
		return s.followEnd(ctx, runID)
	}
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	var outs []events.Outgoing
	for _, call := range t.Calls {
		p := st.call(call.CallID)
		if p == nil || p.Done {
			continue
		}
		env := envelope.ToolEnvelope{CallID: call.CallID, Name: call.Name, Version: call.Version, Input: call.Input,
			TStart: now, TEnd: now,
			Error: envelope.NewToolError(envelope.CodeTimeout,
				"no outcome was reported within %s of the run's cancellation (%s): the call may have run", s.cfg.CancelGrace, st.Cancel.Reason).
				WithDetails(map[string]any{"cancelled": true, "reason": st.Cancel.Reason})}
		o, err := events.NewCallCompleted(s.cfg.Source, runID, env, st.Tenant, tr)
		if err != nil {
			return consume.Permanent(err)
		}
		outs = append(outs, o)
	}
	s.Log.Warn("cancelled run's calls unanswered after the grace: answered here", "run_id", runID, "calls", len(outs))
	for _, o := range outs {
		if _, err := s.Pub.PublishFirst(events.ContextWithRunTrace(ctx, tr), o); err != nil {
			return err
		}
	}
	return nil
}

// cancelledOutputs fills a cancelled run's end with its outputs: every
// envelope of its turns through Cancel.Through, the calls cut short
// included, and the pins they resolve (a pin that cannot be resolved is
// left out: the run is cancelled, not failed).
func (s *Service) cancelledOutputs(ctx context.Context, st *RunState, end *events.RunStatus) error {
	through := st.Iteration
	if st.Cancel != nil {
		through = st.Cancel.Through
		end.Reason = st.Cancel.Reason
	}
	req, _, ids, err := s.conversationThrough(ctx, st.RunID, through)
	if err != nil {
		return err
	}
	envs, err := s.envelopes(ctx, st.RunID, ids)
	if err != nil {
		return err
	}
	out := envelope.NewAgentOutputs("", envs, events.TracesURL(s.cfg.TracesURLTemplate, traceIDOf(st.Trace)))
	if pinned, perr := envelope.ResolvePins(out, req.Agent.PinnedHandles); perr == nil {
		end.Pinned = pinned
	}
	end.Outputs = &out
	return nil
}

package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Deadlines. Every run has one: its request's arrival in the stream plus
// the request's deadline_s, or Config.RunDeadline. It lives in two places,
// both bounded: the run state (RunState.Deadline, which the loop checks
// before and after each model call, and bounds the call by) and a timer in
// the timer stream (events.ArmTimer: one small message per run, with the
// deadline as its TTL). When a timer runs out, the server leaves a marker
// that the orchestrators' one durable timer consumer hands to exactly one
// replica, whichever is alive, also after a restart of all of them; that
// replica's reaper fails the run if it has not ended. Finding the runs due
// thus costs nothing until they are due: no scan of the run state.

// The orchestrator's timers: a run's deadline, fired on DurableDeadlines.
const (
	timerRun         = "run"
	DurableDeadlines = "orchestrator-deadlines"
)

// reapGrace is how long after a run's deadline its timer fires. The loop
// stops a run at its deadline itself (no model call, no completion past
// it); the reaper, a moment later, ends what the loop cannot: a run whose
// events are stuck, dead-lettered or unanswered. The grace keeps the two
// from racing when the clocks of the replicas agree to within it.
const reapGrace = 2 * time.Second

// deadlineFor is how long req's run may take: its deadline_s, else the
// server's default, lengthened by the approval timeout when the run's
// policy asks for approvals (an operator may take all of it, and the
// guard's own deadline then answers the call).
func (s *Service) deadlineFor(req *envelope.RunRequest) time.Duration {
	if req.DeadlineS > 0 {
		return time.Duration(req.DeadlineS) * time.Second
	}
	d := s.cfg.RunDeadline
	if mayWaitForApproval(req.Agent.Policy) {
		d += req.Agent.Policy.ApprovalTimeout()
	}
	return d
}

// deadlineOf is the deadline of req's run, from the request's arrival in the
// stream (the same for every delivery of it).
func (s *Service) deadlineOf(req *envelope.RunRequest, meta *jetstream.MsgMetadata) time.Time {
	at := time.Now()
	if meta != nil && !meta.Timestamp.IsZero() {
		at = meta.Timestamp
	}
	return at.Add(s.deadlineFor(req)).UTC()
}

// armDeadline sets the timer of the run's deadline.
func (s *Service) armDeadline(ctx context.Context, runID string, deadline time.Time) error {
	if err := events.ArmTimer(ctx, s.JS, timerRun, runID, deadline.Add(reapGrace)); err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	return nil
}

// armDeadlineWithin bounds how long a run request's handler may run before
// the run's deadline timer is sent (deadlineTimer). The timer goes out once
// the handler has published the run's first turn, so that the server does
// not store it ahead of the turn on the hop every run waits for (a quarter of
// that hop's time on two CPUs); a model call still going after this long
// sends it from a timer, so that a handler that hangs leaves its run without
// a deadline for no longer than this.
const armDeadlineWithin = 100 * time.Millisecond

// deadlineTimer sends the timer of one run's deadline once, when send is
// called or armDeadlineWithin after it was made, whichever comes first;
// armed sends it if it has not gone yet and waits until it is stored.
type deadlineTimer struct {
	js    jetstream.JetStream
	runID string
	at    time.Time
	late  *time.Timer
	once  sync.Once
	a     *events.ArmingTimer
	err   error
}

// startDeadline makes the run's deadline timer, to be sent at the latest
// armDeadlineWithin from now.
func (s *Service) startDeadline(runID string, deadline time.Time) *deadlineTimer {
	t := &deadlineTimer{js: s.JS, runID: runID, at: deadline.Add(reapGrace)}
	t.late = time.AfterFunc(armDeadlineWithin, t.send)
	return t
}

// send sends the timer, once.
func (t *deadlineTimer) send() {
	t.once.Do(func() {
		if t.a, t.err = events.StartTimer(t.js, timerRun, t.runID, t.at); t.err != nil {
			t.err = fmt.Errorf("run %s: %w", t.runID, t.err)
		}
	})
}

// armed sends the run's deadline timer, waits until it is stored and
// returns what the handler that armed it returns: herr, its own outcome,
// when the timer is stored; else the timer's failure, which is never
// permanent, so that the event is handled again (and the timer armed)
// rather than dead-lettered without a deadline.
func (t *deadlineTimer) armed(ctx context.Context, herr error) error {
	t.late.Stop()
	t.send()
	err := t.err
	if err == nil {
		if err = t.a.Wait(ctx); err != nil {
			err = fmt.Errorf("run %s: %w", t.runID, err)
		}
	}
	switch {
	case err == nil:
		return herr
	case herr == nil:
		return err
	}
	return fmt.Errorf("%w (and the handler failed: %v)", err, herr)
}

// withDeadline bounds ctx by a run's deadline, when it has one.
func withDeadline(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if deadline.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline)
}

// startReaper starts the consumer of the deadline timers.
func (s *Service) startReaper(ctx context.Context) error {
	tr, err := events.NewTimerRunner(s.JS, events.TimerConfig{
		Durable: DurableDeadlines, Kind: timerRun, Handler: s.onDeadline, Logger: s.Log,
	})
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	if err := tr.Start(ctx); err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	s.OnStop(tr.Stop)
	return nil
}

// onDeadline ends a run whose deadline timer fired, unless it has ended:
// its state is failed (TIMEOUT, with what it was waiting for) and its failed
// event published. A run whose end is in the stream already is left as it
// is; a timer that fired early (a stream limit removed it) is set again.
func (s *Service) onDeadline(ctx context.Context, _, runID string) error {
	st, _, err := s.states.get(ctx, runID)
	if err != nil {
		return err
	}
	if st == nil {
		return s.reapUnstarted(ctx, runID)
	}
	if st.Done() {
		_, err := s.publishEnd(ctx, st, nil) // makes sure its end is out
		return err
	}
	if !st.Deadline.IsZero() && time.Now().Before(st.Deadline) {
		return s.armDeadline(ctx, runID, st.Deadline)
	}
	if ended, err := s.endRecorded(ctx, runID); err != nil || ended {
		return err
	}
	failed, _, err := s.states.update(ctx, runID, func(cur *RunState) (bool, error) {
		if cur.Done() {
			return false, nil
		}
		cur.fail(envelope.CodeTimeout, deadlineReason(cur, s.catalogQueues(cur)))
		cur.Pending = pendingOnly(cur.Pending)
		return true, nil
	})
	if err != nil {
		return err
	}
	return s.reaped(ctx, runID, failed)
}

// reaped publishes the end of st, run runID failed at its deadline, and counts
// and logs it.
func (s *Service) reaped(ctx context.Context, runID string, st *RunState) error {
	if _, err := s.publishEnd(ctx, st, nil); err != nil {
		return err
	}
	s.metrics.reaped.Inc()
	s.Log.Warn("run failed at its deadline", "run_id", runID, "reason", st.Reason)
	return nil
}

// pendingOnly keeps the calls still pending (what the run waited for); the
// state of an ended run needs no more.
func pendingOnly(cs []PendingCall) []PendingCall {
	var out []PendingCall
	for _, c := range cs {
		if !c.Done {
			out = append(out, c)
		}
	}
	return out
}

// reapUnstarted ends a run that has no state at its deadline: its request
// was never taken up (its delivery dead-lettered, say). Nothing is done
// when the stream holds no request of it (a run of no orchestrator's) or
// its end already.
func (s *Service) reapUnstarted(ctx context.Context, runID string) error {
	if ended, err := s.endRecorded(ctx, runID); err != nil || ended {
		return err
	}
	req, _, err := s.history.requestAt(ctx, runID)
	if errors.Is(err, errNotRecorded) {
		return nil
	}
	if err != nil {
		return err
	}
	st := newRunState(req, events.RunTrace{})
	st.fail(envelope.CodeTimeout, "run "+runID+" passed its deadline before its request was taken up: no model turn was made. "+
		"Check `toolwire dlq list` for its request (replay it with `toolwire dlq replay`) and the orchestrators' logs; "+
		"raise the request's deadline_s (or "+EnvRunDeadline+") if the run needs longer")
	if err := s.createOrGet(ctx, st); err != nil {
		return err
	}
	return s.reaped(ctx, runID, st)
}

// endRecorded reports whether the run's end (completed or failed) is in its
// stream.
func (s *Service) endRecorded(ctx context.Context, runID string) (bool, error) {
	for _, verb := range []events.Verb{events.VerbCompleted, events.VerbFailed} {
		subj, err := events.RunSubject(runID, verb)
		if err != nil {
			return false, err
		}
		_, err = last(ctx, s.history.runs, subj)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, errNotRecorded) {
			return false, err
		}
	}
	return false, nil
}

// catalogQueues names the queue of each pending call's tool, as the
// registry has it ("" when it does not know the tool).
func (s *Service) catalogQueues(st *RunState) map[string]string {
	out := map[string]string{}
	if s.catalog == nil {
		return out
	}
	for _, c := range st.Pending {
		if c.Done || c.Version == "" {
			continue
		}
		ref, err := envelope.ParseToolRef(c.ref())
		if err != nil {
			continue
		}
		if e, ok := s.catalog.Lookup(ref); ok {
			out[c.CallID] = e.Definition.QueueName()
		}
	}
	return out
}

// deadlineReason says what a run was waiting for at its deadline and what
// to do about it. queues maps a pending call to its tool's queue, when
// known.
func deadlineReason(st *RunState, queues map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s passed its deadline (%s) ", st.RunID, st.Deadline.UTC().Format(time.RFC3339))
	switch {
	case st.Phase == PhaseCalling || st.Iteration == 0:
		fmt.Fprintf(&b, "while waiting for the model (%s/%s, iteration %d). Check the model provider and the orchestrators' logs "+
			"(TOOLWIRE_MODEL_TIMEOUT bounds one model call)", st.Model.Provider, st.Model.Name, st.Iteration)
	default:
		var approvals, calls []string
		for _, c := range st.Pending {
			switch {
			case c.Done:
			case c.Approval == ApprovalWaiting:
				approvals = append(approvals, fmt.Sprintf("call %s (%s)", c.CallID, c.ref()))
			default:
				q := queues[c.CallID]
				if q == "" {
					q = envelope.DefaultQueue
				}
				calls = append(calls, fmt.Sprintf("call %s (%s, queue %s)", c.CallID, c.ref(), q))
			}
		}
		fmt.Fprintf(&b, "in iteration %d", st.Iteration)
		if len(approvals) > 0 {
			fmt.Fprintf(&b, ", waiting for an operator's decision on %s: decide sooner with `toolwire approve`",
				strings.Join(approvals, ", "))
		}
		if len(calls) > 0 {
			fmt.Fprintf(&b, ", waiting for %s: check `toolwire dlq list` for its events (replay them with `toolwire dlq replay`) "+
				"and that a worker serves the queue (`toolwire tools list` shows the live ones)", strings.Join(calls, ", "))
		}
	}
	b.WriteString("; raise the request's deadline_s (or " + EnvRunDeadline + ") if the run needs longer")
	return b.String()
}

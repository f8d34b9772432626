package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/pkg/jetstream/timers"
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
	if err := timers.ArmTimer(ctx, s.JS, timerRun, runID, deadline.Add(reapGrace)); err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	return nil
}

// A run's deadline timer is stored only for a run still going
// Config.TimerAfter after its request's handler started (or at its deadline,
// if that comes sooner). Until then the request stays unacknowledged: its
// handler holds it (events.Delivery.Hold) once it has returned, and a crash
// of this replica redelivers it, whose handler arms the timer. So at every
// moment a run has a stored timer, or a request that will be handled again;
// and a run that ends sooner (most do) costs no timer at all: no message to
// store beside its first turn, none to fire and clear after its deadline.
// A handler that fails, or is still at work then (a slow model call, or one
// that hangs), has the timer sent meanwhile and waited for before its
// request is settled, as every handler did before.

// deadlineTimer is the deadline timer of one run, on the replica that
// handles its request: sent once (send) when Config.TimerAfter has passed,
// when its handler failed, or at Stop; not at all when the run ended first
// (runEnded). The request is acknowledged once the timer is stored or the
// run has ended.
type deadlineTimer struct {
	s     *Service
	runID string
	at    time.Time
	late  *time.Timer

	mu    sync.Mutex
	sent  bool
	a     *timers.ArmingTimer
	err   error
	ended bool          // the run's end is stored
	held  *consume.Held // the request, when its handler returned and held it
	// always: TimerAfter is negative, the timer goes out at once whether
	// the run ends or not, and the request is never held.
	always bool
}

// startDeadline makes the run's deadline timer, to be sent
// Config.TimerAfter from now (at once when it is negative), or at the
// deadline if that is sooner, unless the run ends first.
func (s *Service) startDeadline(runID string, deadline time.Time) *deadlineTimer {
	t := &deadlineTimer{s: s, runID: runID, at: deadline.Add(reapGrace), always: s.cfg.TimerAfter < 0}
	after := min(s.cfg.TimerAfter, time.Until(deadline))
	t.late = time.AfterFunc(max(after, 0), func() { t.fire(context.Background()) })
	s.deadlines.add(t) // with late set: runEnded and Stop may stop it from now on
	return t
}

// send sends the timer, once; t.mu is held.
func (t *deadlineTimer) send() {
	if t.sent {
		return
	}
	t.sent = true
	if t.a, t.err = timers.StartTimer(t.s.JS, timerRun, t.runID, t.at); t.err != nil {
		t.err = fmt.Errorf("run %s: %w", t.runID, t.err)
	}
}

// stored waits until the sent timer is stored, having written the run's
// state if it is still a stash: the request is acknowledged next, and a run
// whose request is settled has its state in KV.
func (t *deadlineTimer) stored(ctx context.Context) error {
	if err := t.s.states.flush(ctx, t.runID); err != nil {
		return fmt.Errorf("run %s: %w", t.runID, err)
	}
	t.mu.Lock()
	a, err := t.a, t.err
	t.mu.Unlock()
	if err != nil {
		return err
	}
	if err := a.Wait(ctx); err != nil {
		return fmt.Errorf("run %s: %w", t.runID, err)
	}
	return nil
}

// fire sends the timer when TimerAfter has passed (or at Stop); a request
// held by now is acknowledged once the timer is stored, bounded by ctx.
func (t *deadlineTimer) fire(ctx context.Context) {
	t.mu.Lock()
	if t.ended && !t.always {
		t.mu.Unlock()
		return
	}
	t.send()
	held := t.held
	t.mu.Unlock()
	if held != nil {
		t.settle(ctx, held)
	}
}

// settle acknowledges the held request once the timer is stored, else
// hands it back, so that a redelivery arms it.
func (t *deadlineTimer) settle(ctx context.Context, held *consume.Held) {
	defer t.s.deadlines.remove(t)
	err := t.stored(ctx)
	if err == nil {
		err = held.Ack()
	} else {
		err = errors.Join(err, held.Nak(time.Second))
	}
	if err != nil {
		t.s.Log.Warn("run request settled late: it is handled again, which arms the run's deadline", "run_id", t.runID, "err", err)
	}
}

// armed ends the request's handler: it returns herr, the handler's own
// outcome, after which the runner settles the request. A handler that
// succeeded holds the request (d.Hold) until the timer is stored or the run
// ends, unless either has happened. A handler that failed, or one whose
// timer is sent, waits for the timer to be stored; a timer that could not
// be stored is returned in place of herr, never as a permanent failure, so
// that the request is handled again (and the timer armed) rather than
// dead-lettered without a deadline.
func (t *deadlineTimer) armed(ctx context.Context, herr error, d *consume.Delivery) error {
	t.mu.Lock()
	if herr == nil && !t.sent && !t.always {
		if t.ended {
			t.mu.Unlock()
			t.late.Stop()
			t.s.deadlines.remove(t)
			return nil
		}
		if d != nil {
			t.held = d.Hold()
		}
		if t.held != nil {
			t.mu.Unlock()
			return nil
		}
	}
	t.late.Stop()
	t.send()
	t.mu.Unlock()
	defer t.s.deadlines.remove(t)
	err := t.stored(ctx)
	switch {
	case err == nil:
		return herr
	case herr == nil:
		return err
	}
	return fmt.Errorf("%w (and the handler failed: %v)", err, herr)
}

// runEnded says that the run's end is stored: it needs no deadline, and its
// request, when held, is acknowledged.
func (t *deadlineTimer) runEnded() {
	t.mu.Lock()
	t.ended = true
	held := t.held
	sent := t.sent
	t.mu.Unlock()
	if held == nil {
		return // the handler sees ended when it returns
	}
	if sent {
		return // fire acknowledges it once the timer is stored
	}
	t.late.Stop()
	if err := held.Ack(); err != nil {
		t.s.Log.Warn("run request not acknowledged after its run ended; a redelivery finds the run ended", "run_id", t.runID, "err", err)
	}
	t.s.deadlines.remove(t)
}

// deadlines are the deadline timers of the run requests this replica
// handles, by run id.
type deadlines struct {
	mu sync.Mutex
	m  map[string]map[*deadlineTimer]struct{}
}

func newDeadlines() *deadlines { return &deadlines{m: map[string]map[*deadlineTimer]struct{}{}} }

func (ds *deadlines) add(t *deadlineTimer) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.m[t.runID] == nil {
		ds.m[t.runID] = map[*deadlineTimer]struct{}{}
	}
	ds.m[t.runID][t] = struct{}{}
}

func (ds *deadlines) remove(t *deadlineTimer) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	delete(ds.m[t.runID], t)
	if len(ds.m[t.runID]) == 0 {
		delete(ds.m, t.runID)
	}
}

// of is the timers of runID: looked up, not searched for, as every run's
// end asks while this replica may hold thousands of requests.
func (ds *deadlines) of(runID string) []*deadlineTimer {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return slices.Collect(maps.Keys(ds.m[runID]))
}

// all is the timers of every run.
func (ds *deadlines) all() []*deadlineTimer {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	var out []*deadlineTimer
	for _, ts := range ds.m {
		out = slices.AppendSeq(out, maps.Keys(ts))
	}
	return out
}

// runEnded releases the run's timers on this replica (publishEnd).
func (s *Service) runEnded(runID string) {
	for _, t := range s.deadlines.of(runID) {
		t.runEnded()
	}
}

// stopDeadlines, at Stop once the consumers have stopped, fires at once
// the timers not fired yet: the requests still held get theirs and are
// settled, as past Stop nothing keeps them alive.
func (s *Service) stopDeadlines(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, t := range s.deadlines.all() {
		if t.late.Stop() {
			wg.Go(func() { t.fire(ctx) })
		}
	}
	wg.Wait()
	return nil
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
	return s.startTimers(ctx, DurableDeadlines, timerRun, s.onDeadline)
}

// startTimers starts the durable consumer of the timers of a kind, stopped
// with the service.
func (s *Service) startTimers(ctx context.Context, durable, kind string, h timers.TimerHandler) error {
	tr, err := timers.NewTimerRunner(s.JS, timers.TimerConfig{Durable: durable, Kind: kind, Handler: h, Logger: s.Log})
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
		// A run whose state was never written (its replica died before its
		// request was settled): rebuilt from its first turn, if it has one.
		if st, err = s.stateFromStream(ctx, runID); err != nil {
			return err
		}
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
	e, err := s.endStored(ctx, runID)
	return e != nil, err
}

// endStored reads the run's end event from the runs stream's leader, which
// has every end that was acknowledged (a direct get may be answered by a
// replica behind it, just back from an outage): nil when the run has not
// ended.
func (s *Service) endStored(ctx context.Context, runID string) (*storedEvent, error) {
	m, err := direct.RunEnd(ctx, s.JS, runID)
	if err != nil || m == nil {
		return nil, err
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w: %w", m.Subject, errUnreadable, err)
	}
	return &storedEvent{subject: m.Subject, trace: events.TraceOf(ev), data: ev}, nil
}

// adoptEnd makes the run's state say what its stored end e says, when it
// says something else: the first end stored is the run's, and a handler
// that decided another (a failure at the deadline racing a completion
// whose state was not written yet) gives way to it. It reports whether the
// state was changed.
func (s *Service) adoptEnd(ctx context.Context, runID string, e *storedEvent) (bool, error) {
	var end events.RunStatus
	if err := events.DecodeData(e.data, &end); err != nil {
		return false, fmt.Errorf("run %s: its end event: %w: %w", runID, errUnreadable, err)
	}
	phase := PhaseComplete
	switch end.Status {
	case events.StatusFailed:
		phase = PhaseFailed
	case events.StatusCancelled:
		phase = PhaseCancelled
	}
	changed := false
	_, _, err := s.states.update(ctx, runID, func(cur *RunState) (bool, error) {
		changed = false
		if cur.Phase == phase && cur.Code == end.Code {
			return false, nil
		}
		s.Log.Warn("a second end of a run refused: its state now says how it ended first", "run_id", runID,
			"stored", end.Status, "stored_code", end.Code, "state", cur.Phase, "state_code", cur.Code)
		cur.Phase, cur.Code, cur.Reason = phase, end.Code, end.Reason
		cur.Pending = pendingOnly(cur.Pending)
		changed = true
		return true, nil
	})
	if errors.Is(err, errNoRunState) {
		return false, nil
	}
	if changed {
		s.metrics.endsRefused.Inc()
	}
	return changed, err
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

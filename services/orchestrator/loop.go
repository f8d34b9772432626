package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	fastjson "github.com/segmentio/encoding/json"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

// The agent loop on contract v2, as a state machine.
//
// A run's state (RunState, state.go) is in the run-state KV bucket, changed
// only by compare-and-set (stateStore, store.go); its record is the run's
// stream: its request, each turn, each call's envelope, its end. The state
// says what comes next, the stream what has happened, so any replica can
// handle any event of any run. The events arrive on the consumers Start sets
// up (orchestrator.go): run requests (handleRun), call completions
// (handleCallCompleted), approval_required (handleApproval), the guard's
// approval records (watchApprovals) and the deadline timers (onDeadline,
// reaper.go).
//
// The states are the run's phases (RunState.Phase), n its iteration:
//
//	(none)              requested; no state yet
//	calling n           model call n is due, or running
//	awaiting_tools n    turn n is recorded; its calls are pending
//	completed, failed   ended; the end event is published once
//
// The transitions, the events that make them, and where they are made:
//
//	(none) -> calling 1
//	    the run is requested: onRunRequested, then startRun. An invalid
//	    request gets a failed event and no state (failUnstarted).
//	(none) -> failed
//	    the loop rules refuse iteration 1: onRunRequested.
//	calling n -> awaiting_tools n
//	    the model answers with tool calls: takeTurn publishes the turn,
//	    RunState.recordTurn (state.go) records it.
//	calling n -> completed
//	    the model answers without calls: takeTurn, publishFinal.
//	calling n -> failed
//	    the model fails, or the deadline passes before or during its call:
//	    takeTurn, failRun.
//	awaiting_tools n -> awaiting_tools n
//	    a call's envelope, not the turn's last (handleCallCompleted,
//	    withCall); an approval event of a call, which suspends or resumes
//	    the run without changing its phase (approvals.go).
//	awaiting_tools n -> calling n+1
//	    the envelope of the turn's last pending call: Service.advance
//	    (turns.go), which makes that envelope the trigger of call n+1. A
//	    turn whose calls the orchestrator answered all itself (no tool can
//	    take them) goes on at once, with the same trigger (goOn).
//	awaiting_tools n -> failed
//	    the same, when the loop rules (iteration cap, budget) refuse model
//	    call n+1: Service.advance.
//	calling n, awaiting_tools n -> failed
//	    the deadline timer fires: onDeadline (reaper.go).
//	completed, failed
//	    the end event (the outputs, or the failure) is published, unless
//	    the stream has it: publishEnd.
//
// Only one handler makes model call n: the trigger's (RunState.Trigger), the
// run request's for n = 1 and the handler of the envelope that answered turn
// n-1's last call after that, or the same event redelivered when that
// handler died. Any other handler that finds the run calling leaves it
// (goOn). A model call starts from one of three entry points, by where its
// state comes from (stateSource): startRun (a new run's state, in no store),
// continueRun (the stored state, from goOn) and continueEarly (a snapshot
// ahead of the store, when earlyTurn allows it); all three run takeTurn. A
// redelivered request reads the state, or rebuilds it from the first turn in
// the stream (stateFromStream), and goes on from it (goOn).
//
// What is written when. Every publish has a deterministic event id, and the
// turns and the end go only onto an empty subject, so that a redelivered
// event publishes exactly what is missing. The order of the writes makes a
// crash at any point (faults.go names them) safe:
//
//   - A turn of calls: its turn event first (publishTurn), then the state
//     records it. The trigger redelivered between the two reads the turn
//     back (history.turn) instead of calling the model again; the turn is
//     the first one published, whichever replica's model call made it.
//   - The model's final answer: the completed event, which carries the turn,
//     first (publishFinal), then the state records it.
//   - A failure (the model's, the deadline's, the loop rules'): the state
//     first, then the failed event (publishEnd), which a redelivery
//     publishes from the state (goOn) when the first attempt did not.
//   - An envelope: the state first (withCall), then what it drives (goOn).
//     The first delivery of a turn's last envelope, in a run none of whose
//     calls may wait for an approval, drives the next model call from this
//     replica's snapshot before it is written (earlyTurn): the envelope is
//     then written in one compare-and-set with the turn that ends the run,
//     or on its own before a turn of calls is published.
//   - A new run's state is not written with its first turn: this replica
//     keeps it (stateStore.stash) until a change of it is written, or its
//     request is acknowledged (flush, called by the deadline timer in
//     reaper.go). A run that ends sooner is not written at all (store.go
//     says when it is): its end in the stream is all a later delivery
//     needs.

// handleRun handles the run requests.
func (s *Service) handleRun(ctx context.Context, d *consume.Delivery) error {
	if d.Event.Type() != events.TypeRunRequested {
		return consume.Permanent(fmt.Errorf("orchestrator: unexpected event type %q on %s", d.Event.Type(), d.Subject))
	}
	return s.onRunRequested(withAttempt(ctx, d.Attempt), d)
}

type attemptKey struct{}

// withAttempt marks ctx with the delivery attempt of the event its handler
// handles.
func withAttempt(ctx context.Context, n uint64) context.Context {
	return context.WithValue(ctx, attemptKey{}, n)
}

// firstDelivery reports whether ctx's handler handles the first delivery of
// its event. Only the handler of the event that drives a model call (the
// run's trigger) makes it; when that is the event's first delivery, no
// earlier one can have made the call and published its turn or the run's
// end, and the stream need not be asked.
func firstDelivery(ctx context.Context) bool {
	n, ok := ctx.Value(attemptKey{}).(uint64)
	return ok && n == 1
}

// onRunRequested validates a run request, calls the model for its first turn
// and publishes it.
func (s *Service) onRunRequested(ctx context.Context, d *consume.Delivery) (err error) {
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return consume.Permanent(err)
	}
	var req envelope.RunRequest
	reject := func(reason string) error {
		s.Log.Warn("run request rejected", "run_id", subj.RunID, "reason", reason)
		return s.failUnstarted(ctx, subj.RunID, req, reason)
	}
	if err := s.schemas.Validate(envelope.SchemaRunRequest, d.Event.Data()); err != nil {
		return reject("invalid run request: " + err.Error())
	}
	if err := events.DecodeData(d.Event, &req); err != nil {
		return reject("invalid run request: " + err.Error())
	}
	if req.RunID != subj.RunID {
		return reject(fmt.Sprintf("invalid run request: run_id %q does not match the subject's %q", req.RunID, subj.RunID))
	}
	if err := req.Validate(); err != nil {
		return reject(err.Error())
	}
	if _, err := s.cfg.Providers.Get(req.Agent.Model.Provider); err != nil {
		return reject("invalid run request: agent.model.provider: " + err.Error() + providerHint(req.Agent.Model.Provider))
	}
	if req.Agent.Model.Provider == scripted.Name {
		if _, err := scripted.Parse(req.Agent.Model.Options); err != nil {
			return reject("invalid run request: " + err.Error())
		}
	} else if strings.TrimSpace(req.Agent.Model.Name) == "" {
		return reject("invalid run request: agent.model.name is required for provider " + req.Agent.Model.Provider)
	}
	var warnings, problems []string
	for _, ref := range mustRefs(req.Agent) {
		e, ok, err := s.catalog.Resolve(ctx, s.reg, ref)
		if err != nil {
			return err
		}
		switch {
		case !ok:
			problems = append(problems, "unknown tool "+ref.String())
		case e.State == registry.StateBlocked:
			problems = append(problems, "tool "+ref.String()+" is blocked")
		case !e.State.Executable():
			problems = append(problems, fmt.Sprintf("tool %s is %s: it does not run until it is published", ref, e.State))
		case e.State == registry.StateDeprecated:
			warnings = append(warnings, "tool "+ref.String()+" is deprecated")
		}
	}
	if len(problems) > 0 {
		return reject("invalid run request: agent.enabled_tools: " + strings.Join(problems, "; "))
	}
	m := req.Agent.Model
	if _, priced := s.cfg.Prices.For(m.Provider, m.Name); !priced && req.Agent.Policy.MaxBudget > 0 {
		warnings = append(warnings, fmt.Sprintf("model %s/%s has no price in the price table (%s): its tokens add nothing to the spend that max_budget limits",
			m.Provider, m.Name, EnvPrices))
	}

	// The run's deadline counts from its request's arrival in the stream,
	// the same for every delivery. The request is acknowledged only once
	// the run has ended or its deadline timer is stored (whatever the
	// handler's outcome), so that a run whose events go nowhere is still
	// ended: a crash before then redelivers the request, which arms the
	// timer. A run that ends within Config.TimerAfter stores none
	// (reaper.go).
	deadline := s.deadlineOf(&req, d.Meta)
	timer := s.startDeadline(req.RunID, deadline)
	defer func() { err = timer.armed(ctx, err, d) }()
	// A redelivered request: the run exists, or got as far as its first turn
	// before its replica died. So may a request submitted again under a run
	// id that has begun, unless the stream stored this one on the condition
	// that its subject held none (client.Submit and the intake publish so):
	// then the first delivery's run is new, and its state is not read.
	var st *RunState
	again := !firstDelivery(ctx) || d.Msg == nil || !publish.FirstOnSubject(d.Msg.Headers())
	if again {
		if st, _, err = s.states.get(ctx, req.RunID); err != nil {
			return err
		}
	}
	if st != nil {
		return s.goOn(ctx, st, triggerRequest)
	}
	if again {
		// A run need not have its state in KV: one that ended before any
		// write of it has none (stateStore.stash), and its end says all;
		// one whose replica died before its request was settled has its
		// first turn in the stream.
		if ended, err := s.endRecorded(ctx, req.RunID); err != nil {
			return err
		} else if ended {
			s.runEnded(req.RunID)
			return nil
		}
		if st, err = s.stateFromStream(ctx, req.RunID); err != nil {
			return err
		}
		if st != nil {
			return s.goOn(ctx, st, triggerRequest)
		}
	}

	// A new run's request has its run's id (events.RunRequestedID), whoever
	// published it: an id of a producer's choosing could be another event's.
	if want := events.RunRequestedID(subj.RunID); d.Event.ID() != want {
		return reject(fmt.Sprintf("invalid run request: its id %q is not the run's request id %q", d.Event.ID(), want))
	}

	// The run's trace starts here: invoke_agent is the parent of every span of
	// the run, carried by its events in the distributed-tracing extension.
	ctx, span := s.Tracer.Start(ctx, "invoke_agent "+req.Agent.Name, trace.WithAttributes(
		attribute.String("gen_ai.operation.name", "invoke_agent"),
		attribute.String("gen_ai.agent.name", req.Agent.Name),
		attribute.String("gen_ai.request.model", req.Agent.Model.Name),
		attribute.String("toolwire.run_id", req.RunID),
	))
	defer span.End()
	st = newRunState(&req, events.RunTraceFrom(ctx))
	st.Iteration, st.Trigger, st.Deadline = 1, triggerRequest, deadline
	if v := s.loopVerdict(st, 1); !v.Allowed {
		st.Denied = &v
		st.fail(v.Code, "policy denied iteration 1: "+v.Reason)
		if err := s.createOrGet(ctx, st); err != nil {
			return err
		}
		_, err := s.publishEnd(ctx, st, nil)
		return err
	}
	st.Phase = PhaseCalling
	s.convs.get(req.RunID).start(&req)
	return s.startRun(ctx, st, warnings)
}

// Triggers: the events whose handlers drive a model call (RunState.Trigger).
const triggerRequest = "request"

func triggerCall(callID string) string { return "call/" + callID }

// newRunState is the state of a run that has just been requested.
func newRunState(req *envelope.RunRequest, tr events.RunTrace) *RunState {
	return &RunState{
		V: stateVersion, RunID: req.RunID, Tenant: req.Tenant, Agent: req.Agent.Name,
		Model:  events.ModelRef{Provider: req.Agent.Model.Provider, Name: req.Agent.Model.Name},
		Policy: req.Agent.Policy, EnabledTools: req.Agent.EnabledTools, Trace: tr, StartedAt: time.Now().UTC(),
		StopAt: req.Agent.StopAtTools,
	}
}

// createOrGet creates the run's state; when another delivery created it
// first, st becomes that one.
func (s *Service) createOrGet(ctx context.Context, st *RunState) error {
	if _, err := s.states.create(ctx, st); err == nil {
		return nil
	} else if !errors.Is(err, errStateExists) {
		return err
	}
	existing, _, err := s.states.get(ctx, st.RunID)
	if err != nil {
		return err
	}
	if existing == nil {
		return fmt.Errorf("run %s: its state vanished", st.RunID)
	}
	*st = *existing
	return nil
}

// stateFromStream makes the state of a run whose first turn is in the stream
// but whose state is not in KV (its replica died between the two): from its
// request and that turn. It returns nil when the stream holds no turn of the
// run.
func (s *Service) stateFromStream(ctx context.Context, runID string) (*RunState, error) {
	t, tr, err := s.history.turn(ctx, runID, 1)
	if errors.Is(err, errNotRecorded) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	req, at, err := s.history.requestAt(ctx, runID)
	if err != nil {
		return nil, err
	}
	st := newRunState(req, tr)
	st.Iteration, st.Phase, st.Trigger = 1, PhaseCalling, triggerRequest
	st.Deadline = at.Add(s.deadlineFor(req))
	st.recordTurn(t)
	if err := s.createOrGet(ctx, st); err != nil {
		return nil, err
	}
	return st, nil
}

// goOn takes a run on from its state, for the handler of trigger: it
// publishes what the run's end implies, or, when trigger drives the run's
// next model call, makes it (and goes on from a turn whose calls the
// orchestrator answered all itself). Another event's handler leaves the
// model call to the trigger's, which is redelivered if it died.
func (s *Service) goOn(ctx context.Context, st *RunState, trigger string) error {
	for {
		switch {
		case st.Done():
			_, err := s.publishEnd(ctx, st, nil)
			return err
		case st.Cancel != nil && st.Phase == PhaseCalling:
			// Asked to stop while its model was due: no model call.
			return s.cancelRun(ctx, st, fromStore, st.Cancel)
		case st.Trigger != trigger:
			return nil
		case st.Phase == PhaseCalling:
			return s.continueRun(ctx, st, trigger)
		case st.Phase == PhaseAwaitingTools && st.allDone():
			next, _, err := s.states.update(ctx, st.RunID, func(cur *RunState) (bool, error) {
				if cur.Iteration != st.Iteration || cur.Trigger != trigger || cur.Phase != PhaseAwaitingTools || !cur.allDone() {
					return false, nil
				}
				s.advance(cur, trigger)
				return true, nil
			})
			if err != nil {
				return err
			}
			if next.Iteration == st.Iteration && !next.Done() {
				return nil // another handler moved it on
			}
			st = next
		default:
			return nil
		}
	}
}

// Where the state a model call starts from comes from. It says how that
// state is written once the turn is in the stream, or the run has failed.
type stateSource int

const (
	// fromRequest: a new run's state, just made from its request by the
	// handler of the request's first delivery, and in no store. The first
	// turn is recorded on it, which is then kept here unwritten
	// (stateStore.stash), or created in KV when this replica knows a state
	// of the run already (createOrGet); a failure creates it failed.
	fromRequest stateSource = iota
	// fromStore: the run's state as the store holds it (in KV, or this
	// replica's stash). The turn, or the failure, is applied to it through
	// stateStore.update, by compare-and-set.
	fromStore
	// fromSnapshot: this replica's last snapshot of the run with the
	// trigger's envelope applied in memory only (earlyTurn); the store does
	// not have that change (turnStart.unwritten) yet. It is written in the
	// same compare-and-set as a turn that ends the run, or on its own
	// (catchUp) before a turn of calls is published or a failure written,
	// after which the state is fromStore.
	fromSnapshot
)

// turnStart is what a model call starts from: the run's state, the trigger
// whose handler makes the call, and where the state comes from.
type turnStart struct {
	st      *RunState
	trigger string
	from    stateSource
	// warnings are the request's, for the started event and turn 1
	// (fromRequest).
	warnings []string
	// unwritten is the change of the trigger's event that the stored state
	// does not have yet (fromSnapshot), nil otherwise.
	unwritten func(*RunState) bool
}

// startRun makes the first model call of a new run, whose state st
// (iteration 1, calling) is in no store yet: onRunRequested, on the
// request's first delivery.
func (s *Service) startRun(ctx context.Context, st *RunState, warnings []string) error {
	return s.takeTurn(ctx, turnStart{st: st, trigger: triggerRequest, from: fromRequest, warnings: warnings})
}

// continueRun makes model call st.Iteration of a run whose state st is
// stored and calling, for the handler of trigger (goOn).
func (s *Service) continueRun(ctx context.Context, st *RunState, trigger string) error {
	return s.takeTurn(ctx, turnStart{st: st, trigger: trigger, from: fromStore})
}

// continueEarly makes model call st.Iteration for the last envelope of a
// turn before the store records it (handleCallCompleted, when earlyTurn
// allows it): st is the snapshot with the envelope applied, unwritten the
// change that applies it to the stored state.
func (s *Service) continueEarly(ctx context.Context, st *RunState, trigger string, unwritten func(*RunState) bool) error {
	return s.takeTurn(ctx, turnStart{st: st, trigger: trigger, from: fromSnapshot, unwritten: unwritten})
}

// takeTurn makes model call ts.st.Iteration (the entry points above set ts
// up): it reads the turn from the stream when a crashed delivery published
// it already, else calls the model with the conversation so far and
// publishes the turn; then it records the turn in the run's state, written
// as ts.from says, and publishes what follows.
func (s *Service) takeTurn(ctx context.Context, ts turnStart) error {
	st, trigger, warnings := ts.st, ts.trigger, ts.warnings
	n := st.Iteration
	// Before the run fails here, or goes on to a turn of calls, its state
	// catches up with the trigger: the envelopes of that turn's calls must
	// find it calling the model (withCall), and a failure is written on it.
	// Only a turn that ends the run is written with the trigger.
	catchUp := func() (*RunState, error) {
		if ts.from != fromSnapshot {
			return st, nil
		}
		cur, _, err := s.states.update(ctx, st.RunID, func(cur *RunState) (bool, error) { return ts.unwritten(cur), nil })
		ts.from, ts.unwritten = fromStore, nil
		return cur, err
	}
	var t *events.Turn
	err := fmt.Errorf("run %s: turn %d: %w", st.RunID, n, errNotRecorded)
	// A new run's caller has just looked; a first delivery need not.
	if ts.from != fromRequest && !firstDelivery(ctx) {
		t, _, err = s.history.turn(ctx, st.RunID, n)
	}
	ended := false
	switch {
	case err == nil:
	case errors.Is(err, errRunEnded):
		// The run ended before this turn (another handler's end, whose
		// state was not written): nothing follows an end.
		return s.followEnd(ctx, st.RunID)
	case !errors.Is(err, errNotRecorded):
		return err
	case st.pastDeadline(time.Now()):
		// No model call past the deadline: the run ends here (the reaper
		// would end it too, a moment later).
		if _, err := catchUp(); err != nil {
			return err
		}
		return s.failRun(ctx, st, ts.from, envelope.CodeTimeout, deadlineReason(st, nil))
	case s.cancelOf(st) != nil:
		// Asked to stop (cancel.go): no model call.
		if _, err := catchUp(); err != nil {
			return err
		}
		return s.cancelRun(ctx, st, ts.from, s.cancelOf(st))
	default:
		if err := s.fault(ctx, FaultBeforeModel, st.RunID, n); err != nil {
			return err
		}
		req, msgs, prev, err := s.conversationThrough(ctx, st.RunID, n-1)
		if err != nil {
			return err
		}
		results := make([]events.TurnResult, 0, len(st.Pending))
		for _, c := range st.Pending {
			if n > 1 && c.Done {
				results = append(results, events.TurnResult{CallID: c.CallID, ProviderCallID: c.ProviderCallID, IsError: c.Error})
			}
		}
		_ = prev
		stopStarted := func() {}
		if n == 1 {
			stopStarted = s.startedAfter(ctx, st, warnings)
		}
		mctx, cancel := withDeadline(ctx, st.Deadline)
		unwatch := s.watchModelCall(st, cancel) // a cancel stops the model call
		t, err = s.callModel(mctx, st, req, msgs, results)
		unwatch()
		cancel()
		stopStarted()
		if c := s.cancelOf(st); c != nil && ctx.Err() == nil {
			// Cancelled during the model call: its answer is dropped, and
			// nothing of it is published.
			if _, err := catchUp(); err != nil {
				return err
			}
			return s.cancelRun(ctx, st, ts.from, c)
		}
		if err == nil && st.pastDeadline(time.Now()) {
			// The answer came too late: the run has ended at its
			// deadline, and a completion now would contradict the end
			// the reaper publishes.
			err = context.DeadlineExceeded
		}
		if err != nil {
			if ctx.Err() != nil {
				// Shutting down, not a model failure: the event is
				// redelivered to whichever replica gets it.
				return fmt.Errorf("model call of run %s iteration %d interrupted: %w", st.RunID, n, ctx.Err())
			}
			if _, err := catchUp(); err != nil {
				return err
			}
			if st.pastDeadline(time.Now()) {
				return s.failRun(ctx, st, ts.from, envelope.CodeTimeout, deadlineReason(st, nil))
			}
			var oe *outputError
			if errors.As(err, &oe) {
				// The answer failed the output schema once too often.
				return s.failRun(ctx, st, ts.from, envelope.CodeValidation, oe.Error())
			}
			// A model failure ends the run with a clear reason; the
			// adapter's retries already happened.
			return s.failRun(ctx, st, ts.from, envelope.CodeProviderError, "model call failed: "+err.Error())
		}
		if n == 1 {
			t.Warnings = warnings
		}
		if err := s.fault(ctx, FaultAfterModel, st.RunID, n); err != nil {
			return err
		}
		if (len(t.Calls) > 0 || t.Rejected != nil) && ts.from == fromSnapshot {
			cur, err := catchUp()
			if err != nil {
				return err
			}
			if cur.Iteration != n || cur.Phase != PhaseCalling || cur.Trigger != trigger {
				// Not this handler's model call after all (a replica
				// changed the run since this one's snapshot): its answer
				// is dropped and the run goes on from its state.
				s.Log.Warn("model answer dropped: the run's state moved on meanwhile", "run_id", st.RunID, "iteration", n)
				return s.goOn(ctx, cur, trigger)
			}
		}
		if len(t.Calls) == 0 && t.Rejected == nil {
			// The model's final answer rides on the run's end event.
			if t, err = s.publishFinal(ctx, st, t); err != nil {
				return err
			}
			ended = true
		} else if t, err = s.publishTurn(ctx, st, t); err != nil {
			return err
		}
		s.metrics.spend.Add(t.Cost)
	}
	if !ended {
		s.convs.rememberTurn(st.RunID, t)
	}
	if err := s.fault(ctx, FaultAfterPublishTurn, st.RunID, n); err != nil {
		return err
	}
	// The turn is recorded: the run's state follows it.
	var recorded *RunState
	if ts.from != fromRequest {
		recorded, _, err = s.states.update(ctx, st.RunID, func(cur *RunState) (bool, error) {
			caught := ts.from == fromSnapshot && ts.unwritten(cur)
			return cur.recordTurn(t) || caught, nil
		})
	} else {
		// A new run: its state is kept here until a change of it is
		// written or its request is settled (stateStore.stash); a run
		// that ends sooner is never written.
		st.recordTurn(t)
		err = nil
		if !s.states.stash(st) {
			err = s.createOrGet(ctx, st)
		}
		recorded = st
	}
	if err != nil {
		return err
	}
	if ended && recorded.Done() {
		return nil
	}
	if err := s.publishAnswers(ctx, st.Trace, t); err != nil {
		return err
	}
	return s.goOn(ctx, recorded, trigger)
}

// publishFinal ends the run with t, the model's answer without calls: the
// completed event carries the turn (events.RunStatus.Turn). When another
// delivery ended the run first, it returns the turn that one stored.
func (s *Service) publishFinal(ctx context.Context, st *RunState, t *events.Turn) (*events.Turn, error) {
	done := *st
	done.Pending = slices.Clone(st.Pending)
	done.recordTurn(t)
	published, err := s.publishEnd(ctx, &done, t)
	if err != nil || published {
		return t, err
	}
	stored, _, err := s.history.turn(ctx, st.RunID, t.Iteration)
	if err != nil {
		return nil, fmt.Errorf("run %s: ended by another delivery, whose last turn cannot be read: %w", st.RunID, err)
	}
	return stored, nil
}

// publishTurn publishes turn t with the answers of the calls the orchestrator
// answered itself, unless the turn's subject holds one already (however long
// ago: the stream refuses a second, beyond its duplicate window too). When
// another delivery's turn got there first, it returns the stored one, which
// is the run's.
func (s *Service) publishTurn(ctx context.Context, st *RunState, t *events.Turn) (*events.Turn, error) {
	ctx = events.ContextWithRunTrace(ctx, st.Trace)
	out, err := events.NewTurnCompleted(s.cfg.Source, *t, st.Trace)
	if err != nil {
		return nil, consume.Permanent(err)
	}
	published, err := s.Pub.PublishFirst(ctx, out)
	if err != nil || published {
		return t, err
	}
	stored, _, err := s.history.turn(ctx, st.RunID, t.Iteration)
	if err != nil {
		return nil, fmt.Errorf("run %s: turn %d was published by another delivery, and cannot be read: %w", st.RunID, t.Iteration, err)
	}
	return stored, nil
}

// publishAnswers publishes the envelopes of the calls of t the orchestrator
// answered itself (nothing when there is none).
func (s *Service) publishAnswers(ctx context.Context, tr events.RunTrace, t *events.Turn) error {
	var outs []events.Outgoing
	for i := range t.Calls {
		c := &t.Calls[i]
		if !c.Answered {
			continue
		}
		env := answer(t, c)
		s.convs.remember(t.RunID, &env)
		o, err := events.NewCallCompleted(s.cfg.Source, t.RunID, env, t.Tenant, tr)
		if err != nil {
			return consume.Permanent(err)
		}
		outs = append(outs, o)
	}
	if len(outs) == 0 {
		return nil
	}
	return s.Pub.PublishAll(events.ContextWithRunTrace(ctx, tr), outs)
}

// startedAfter publishes the run's started event if its first model call is
// still running after Config.StartedAfter; the returned func stops it.
func (s *Service) startedAfter(ctx context.Context, st *RunState, warnings []string) func() {
	if s.cfg.StartedAfter < 0 {
		s.publishStarted(ctx, st, warnings)
		return func() {}
	}
	tm := time.AfterFunc(s.cfg.StartedAfter, func() { s.publishStarted(context.WithoutCancel(ctx), st, warnings) })
	return func() { tm.Stop() }
}

func (s *Service) publishStarted(ctx context.Context, st *RunState, warnings []string) {
	started := s.status(st, events.StatusStarted, "")
	started.Warnings = warnings
	out, err := events.NewRunStatus(s.cfg.Source, started, "", st.Trace)
	if err == nil {
		err = s.Pub.Publish(events.ContextWithRunTrace(ctx, st.Trace), out)
	}
	if err != nil {
		s.Log.Warn("run started event not published", "run_id", st.RunID, "err", err)
	}
}

// failRun ends a run that cannot go on (its model failed, or its deadline
// passed): a new run's state (fromRequest) is created failed, a stored one
// failed by compare-and-set.
func (s *Service) failRun(ctx context.Context, st *RunState, from stateSource, code envelope.ErrorCode, reason string) error {
	if from == fromRequest {
		st.fail(code, reason)
		if err := s.createOrGet(ctx, st); err != nil {
			return err
		}
		_, err := s.publishEnd(ctx, st, nil)
		return err
	}
	failed, _, err := s.states.update(ctx, st.RunID, func(cur *RunState) (bool, error) {
		if cur.Done() || cur.Phase != PhaseCalling || cur.Iteration != st.Iteration {
			return false, nil
		}
		cur.fail(code, reason)
		return true, nil
	})
	if err != nil {
		return err
	}
	_, err = s.publishEnd(ctx, failed, nil)
	return err
}

// followEnd makes the state of a run whose end is stored say how it ended
// (adoptEnd), and releases what this replica holds of it.
func (s *Service) followEnd(ctx context.Context, runID string) error {
	e, err := s.endStored(ctx, runID)
	if err != nil || e == nil {
		return err
	}
	s.convs.forget(runID)
	s.runEnded(runID)
	_, err = s.adoptEnd(ctx, runID, e)
	return err
}

// status is a lifecycle event's data from the state.
func (s *Service) status(st *RunState, name, reason string) events.RunStatus {
	return events.RunStatus{RunID: st.RunID, Status: name, Agent: st.Agent, Tenant: st.Tenant, TraceID: traceIDOf(st.Trace),
		Iteration: st.Iteration, ToolCalls: st.Calls, Spend: st.Spend, Reason: reason}
}

// publishEnd publishes the end of a run that has ended in its state, unless
// the stream has it already: its outputs (built from its events) or its
// failure. final is the turn that ended it when the end carries it (the
// model's answer, not yet published); a turn the loop rules denied rides on
// the failed event too. It reports whether it published the end.
func (s *Service) publishEnd(ctx context.Context, st *RunState, final *events.Turn) (bool, error) {
	if !st.Done() {
		return false, nil
	}
	verb := events.VerbCompleted
	switch st.Phase {
	case PhaseFailed:
		verb = events.VerbFailed
	case PhaseCancelled:
		verb = events.VerbCancelled
	}
	subj, err := events.RunSubject(st.RunID, verb)
	if err != nil {
		return false, consume.Permanent(err)
	}
	// The model's answer, just made by the first delivery of its trigger,
	// cannot have ended the run before; another handler may have.
	// Whatever its kind: a run ends once, and the first end stored is its
	// end (the state follows it).
	ended := func(e *storedEvent) (bool, error) {
		s.convs.forget(st.RunID)
		s.runEnded(st.RunID)
		if e == nil || e.subject == subj {
			return false, nil
		}
		_, err := s.adoptEnd(ctx, st.RunID, e)
		return false, err
	}
	if final == nil || !firstDelivery(ctx) {
		if e, err := s.endStored(ctx, st.RunID); err != nil {
			return false, err
		} else if e != nil {
			return ended(e) // published by an earlier delivery, or another end
		}
	}
	if err := s.fault(ctx, FaultBeforePublishOutputs, st.RunID, st.Iteration); err != nil {
		return false, err
	}
	end := s.status(st, events.StatusCompleted, st.Reason)
	end.Turn = final
	switch st.Phase {
	case PhaseFailed:
		end.Status, end.Code = events.StatusFailed, st.Code
		if st.Denied != nil {
			d := deniedTurn(st)
			end.Turn = &d
		}
	case PhaseCancelled:
		end.Status = events.StatusCancelled
		if err := s.cancelledOutputs(ctx, st, &end); err != nil {
			return false, err
		}
	default:
		if err := s.outputs(ctx, st, &end, final); err != nil {
			return false, err
		}
	}
	o, err := events.NewRunStatus(s.cfg.Source, end, "", st.Trace)
	if err != nil {
		return false, consume.Permanent(err)
	}
	if end.Outputs != nil && len(o.Event.Data()) > maxInlineOutputs {
		// Too large to carry: the outputs go to a blob the event names.
		if err := s.outputsToBlob(ctx, st.RunID, &end); err != nil {
			return false, err
		}
		if o, err = events.NewRunStatus(s.cfg.Source, end, "", st.Trace); err != nil {
			return false, consume.Permanent(err)
		}
	}
	// One end of each kind: a second is refused, within the stream's
	// duplicate window or after it; an end of the other kind within the
	// window too (every end has the id events.EndEventID), and after it by
	// the read above.
	published, err := s.Pub.PublishFirst(events.ContextWithRunTrace(ctx, st.Trace), o)
	if err != nil {
		return false, err
	}
	if !published {
		e, err := s.endStored(ctx, st.RunID)
		if err != nil {
			return false, err
		}
		return ended(e)
	}
	s.convs.forget(st.RunID)
	s.runEnded(st.RunID)
	s.metrics.runs.WithLabelValues(st.Phase).Inc()
	return true, nil
}

// maxInlineOutputs bounds the data of a completed event that carries its
// run's outputs; when they would make it larger, they are a blob the event
// names, so that no event grows with the number of calls a run made.
const maxInlineOutputs = 64 << 10

// outputs fills the completed event's AgentOutputs and pinned handles: the
// final turn's answer and every envelope of the run, in call order
// (publishEnd moves them to a blob when they make the event too large).
func (s *Service) outputs(ctx context.Context, st *RunState, end *events.RunStatus, final *events.Turn) error {
	if final == nil {
		t, _, err := s.history.turn(ctx, st.RunID, st.Iteration)
		if err != nil {
			return err
		}
		final = t
	}
	through := st.Iteration - 1
	if st.StopCall != "" {
		through = st.Iteration // the stopping call's turn is a turn of calls
	}
	req, _, ids, err := s.conversationThrough(ctx, st.RunID, through)
	if err != nil {
		return err
	}
	envs, err := s.envelopes(ctx, st.RunID, ids)
	if err != nil {
		return err
	}
	response := ""
	var value json.RawMessage
	switch {
	case st.StopCall != "":
		// The first successful call of a stop_at_tools tool is the answer.
		for _, env := range envs {
			if env.CallID == st.StopCall {
				value = env.Output
				response = string(env.Output)
			}
		}
	case final.Response != nil:
		response, value = final.Response.Content, final.Output
	}
	out := envelope.NewAgentOutputs(response, envs, events.TracesURL(s.cfg.TracesURLTemplate, traceIDOf(st.Trace)))
	out.Output = value
	pinned, perr := envelope.ResolvePins(out, req.Agent.PinnedHandles)
	if perr != nil {
		// A pin with on_missing error fails the run, with its reason.
		end.Status, end.Reason = events.StatusFailed, perr.Error()
		return nil
	}
	end.Outputs, end.Pinned = &out, pinned
	return nil
}

// outputsToBlob stores end's outputs and pinned handles as the run's outputs
// blob (an events.OutputsDocument), which end then names instead.
func (s *Service) outputsToBlob(ctx context.Context, runID string, end *events.RunStatus) error {
	doc, err := fastjson.Marshal(events.OutputsDocument{Outputs: end.Outputs, Pinned: end.Pinned})
	if err != nil {
		return consume.Permanent(err)
	}
	att, err := blobs.Put(ctx, s.JS, runID+".outputs", doc, "application/json")
	if err != nil {
		return err
	}
	end.Outputs, end.Pinned, end.OutputsBlob = nil, nil, &att
	return nil
}

// failUnstarted reports a rejected run request as a failed run when its run id
// is safe; an unsafe id cannot name a subject and goes to the dead letters.
// What the request says of its agent and tenant is kept only when it is fit
// for every store.
func (s *Service) failUnstarted(ctx context.Context, runID string, req envelope.RunRequest, reason string) error {
	if events.ValidateRunID(runID) != nil {
		return consume.Permanent(errors.New(reason))
	}
	if existing, _, err := s.states.get(ctx, runID); err != nil {
		return err
	} else if existing != nil {
		// Never let a bad request fail a run that already exists under its id.
		return consume.Permanent(fmt.Errorf("run %s exists; ignoring a second, invalid request: %s", runID, reason))
	}
	st := events.RunStatus{RunID: runID, Status: events.StatusFailed, Agent: req.Agent.Name, Tenant: req.Tenant, Reason: reason}
	if envelope.ValidateName("agent.name", st.Agent) != nil {
		st.Agent = ""
	}
	for _, id := range []string{st.Tenant.OrgID, st.Tenant.WorkspaceID, st.Tenant.UserID} {
		if envelope.ValidateName("tenant", id) != nil {
			st.Tenant = envelope.Tenant{} // no store would take it
		}
	}
	out, err := events.NewRunStatus(s.cfg.Source, st, "", events.RunTrace{})
	if err != nil {
		return consume.Permanent(err)
	}
	s.metrics.runs.WithLabelValues("rejected").Inc()
	return s.Pub.Publish(ctx, out)
}

// undecodableRequest answers a run request (direct, or on a tenant's
// intake) whose event cannot be decoded (not JSON, nested too deep, not a
// CloudEvent) with its run's failed event saying why, so that its producer
// does not wait until its own timeout. A run that exists or has ended under
// that id is left as it is.
func (s *Service) undecodableRequest(ctx context.Context, subject string, cause error) error {
	var (
		runID  string
		tenant envelope.Tenant
	)
	if in, err := events.ParseIntakeSubject(subject); err == nil {
		runID, tenant = in.RunID, envelope.Tenant{OrgID: in.Org, WorkspaceID: in.Workspace}
	} else if p, err := events.ParseSubject(subject); err == nil && p.Kind == "run" && p.Verb == events.VerbRequested {
		runID = p.RunID
	} else {
		return nil // no run to answer
	}
	ended, err := s.endRecorded(ctx, runID)
	if err != nil || ended {
		return err
	}
	err = s.failUnstarted(ctx, runID, envelope.RunRequest{Tenant: tenant}, "invalid run request: it cannot be decoded: "+cause.Error())
	if consume.IsPermanent(err) {
		return nil // a run exists under that id: nothing to answer
	}
	return err
}

// handleCallCompleted records a call's envelope in its run; when it is the
// turn's last, the run goes on to its next model call (or its end).
func (s *Service) handleCallCompleted(ctx context.Context, d *consume.Delivery) error {
	ctx = withAttempt(ctx, d.Attempt)
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return consume.Permanent(err)
	}
	var env envelope.ToolEnvelope
	if err := events.DecodeData(d.Event, &env); err != nil {
		return consume.Permanent(err)
	}
	if env.CallID != subj.CallID {
		return consume.Permanent(fmt.Errorf("envelope call_id %s does not match subject %s", env.CallID, d.Subject))
	}
	if env.Cost < 0 {
		return consume.Permanent(fmt.Errorf("envelope of call %s has a negative cost", env.CallID))
	}
	var resumed bool
	var iteration int
	trigger := triggerCall(env.CallID)
	complete := func(st *RunState, c *PendingCall) bool {
		// The call's turn: the pending calls are the current turn's, or the
		// previous one's while the run calls the model.
		resumed, iteration = false, st.Iteration
		if st.Phase == PhaseCalling {
			iteration--
		}
		if c.Done || st.Done() {
			return false // a duplicate
		}
		c.Done, c.Error = true, env.Error != nil
		st.Spend += env.Cost
		if st.Cancel == nil && events.IsCancelledCall(env.Error) {
			// Only a cancel cuts a call so (events.CancelledCallError), and
			// only the services may complete a call: its envelope can come
			// before the cancel request is handled here, and the run
			// stops all the same.
			st.Cancel = &Cancel{Reason: cancelledReason(env.Error), At: time.Now().UTC()}
		}
		if c.Approval == ApprovalWaiting {
			c.Approval, c.ResumedBy = ApprovalResumed, resumedByCompletion(c, &env)
			resumed = true
		}
		// The last result: this completion drives the next model call.
		s.advance(st, trigger)
		return true
	}
	if env.Error != nil && env.Error.Code == envelope.CodeUnknown {
		// The model sees the code and message only; the internals are
		// here, logged before the envelope is recorded (and so before the
		// run can end).
		s.Log.WarnContext(ctx, "tool call failed with an internal error", "run_id", subj.RunID, "call_id", env.CallID,
			"tool", env.Name+"@"+env.Version, "message", env.Error.Message, "details", env.Error.Details)
	}
	st, unwritten := s.earlyTurn(ctx, subj.RunID, env.CallID, trigger, complete)
	if st == nil {
		var known bool
		if st, known, err = s.withCall(ctx, subj.RunID, env.CallID, complete); err != nil || !known {
			return err
		}
	}
	s.convs.remember(subj.RunID, &env)
	if err := s.fault(ctx, FaultAfterRecordEnvelope, subj.RunID, iteration); err != nil {
		return err
	}
	if unwritten != nil {
		resumed = false
		if err := s.continueEarly(ctx, st, trigger, unwritten); err != nil || !resumed {
			return err
		}
		// The state had the call waiting for an approval after all (written
		// by another replica since this one's snapshot): its resumption.
		c := st.call(env.CallID)
		return s.publishStatus(ctx, st, events.StatusResumed, resumedByCompletion(c, &env), c.CallID)
	}
	if c := st.call(env.CallID); c != nil && c.Approval == ApprovalResumed && (resumed || d.Attempt > 1) {
		if err := s.publishStatus(ctx, st, events.StatusResumed, c.ResumedBy, c.CallID); err != nil {
			return err
		}
	}
	return s.goOn(ctx, st, trigger)
}

// earlyTurn lets the last envelope of a turn drive the run's next model call
// before the state records it, when this replica's own last write of the
// state says that nothing else can: the first delivery of the envelope of
// the turn's only call still pending, in a run that has not ended and whose
// policy makes no call wait for an approval. When the model then answers without calls, the run's
// end is published first and the state records the envelope with it in one
// write, instead of one write before the model call and one after the end;
// a turn of calls is preceded by the envelope's write as usual, so that the
// envelopes of its calls find the run calling the model. It returns the
// state as complete makes it and the change to write (unwritten), for
// continueEarly; nil when
// the envelope takes the usual way (withCall), as it does on a redelivery,
// so that a handler that died half way is taken up from the state in KV.
//
// The snapshot may be stale only if another replica wrote the run meanwhile:
// the calls it says are done are done (done is never undone), and what else
// could have changed (the run failed at its deadline) is what the model call
// and its turn are checked against anyway (takeTurn); the write that
// follows applies the envelope to the state as it then is.
func (s *Service) earlyTurn(ctx context.Context, runID, callID, trigger string,
	complete func(*RunState, *PendingCall) bool) (*RunState, func(*RunState) bool) {
	snap := s.states.peek(runID)
	if !firstDelivery(ctx) || snap == nil || snap.Done() || snap.Phase != PhaseAwaitingTools || mayWaitForApproval(snap.Policy) {
		return nil, nil
	}
	for _, c := range snap.Pending {
		if c.CallID == callID && (c.Done || c.Approval != "") || c.CallID != callID && !c.Done {
			return nil, nil
		}
	}
	next := snap.clone()
	c := next.call(callID)
	if c == nil || !complete(next, c) || next.Phase != PhaseCalling || next.Trigger != trigger {
		return nil, nil // not of this turn, or the loop rules end the run: the usual way
	}
	turn := snap.Iteration
	return next, func(cur *RunState) bool {
		c := cur.call(callID)
		if c == nil || cur.Phase != PhaseAwaitingTools || cur.Iteration != turn {
			return false
		}
		return complete(cur, c)
	}
}

// withCall applies change to the pending call callID of the run, under
// compare-and-set. It handles a run whose state lags its stream: no state
// yet (its first turn is published, its state not yet created, or its
// replica died between the two) or a turn published but not yet recorded.
// known is false for a call of no run of ours (a tool call made by `toolwire
// call`) or of an older turn.
func (s *Service) withCall(ctx context.Context, runID, callID string, change func(st *RunState, c *PendingCall) bool) (*RunState, bool, error) {
	for attempt := 0; ; attempt++ {
		lagging, found := 0, false
		st, _, err := s.states.update(ctx, runID, func(st *RunState) (bool, error) {
			lagging, found = 0, false
			c := st.call(callID)
			if c == nil {
				if st.Phase == PhaseCalling && !st.Done() {
					lagging = st.Iteration // this call may be of a turn not recorded yet
				}
				return false, nil
			}
			found = true
			return change(st, c), nil
		})
		switch {
		case errors.Is(err, errNoRunState):
			if attempt > 0 {
				return nil, false, nil
			}
			created, err := s.stateFromStream(ctx, runID)
			if err != nil {
				return nil, false, err
			}
			if created == nil {
				// A call outside any run of ours (a tool node run by
				// `toolwire call`): its envelope is for whoever asked.
				s.Log.Debug("envelope of a call outside any run", "run_id", runID, "call_id", callID)
				return nil, false, nil
			}
			continue
		case err != nil:
			return nil, false, err
		}
		// Whether change saw the call, not whether the state written has
		// it: a change applied in the same group after this one (the
		// recording of the call's turn) may have added the call after
		// this change found none, and then it is still to be done.
		if found {
			return st, true, nil
		}
		if lagging == 0 || attempt > 0 {
			return st, false, nil // a call of an earlier turn, or none of this run's
		}
		t, _, err := s.history.turn(ctx, runID, lagging)
		if errors.Is(err, errRunEnded) {
			// An envelope of a run that has ended: it changes nothing.
			return st, false, s.followEnd(ctx, runID)
		}
		if errors.Is(err, errNotRecorded) {
			// The run calls its model for turn lagging and no such turn is
			// stored (or this read did not see it yet): the envelope is
			// kept, and tried again, until the turn is in or the
			// delivery budget runs out.
			return nil, false, fmt.Errorf("run %s: call %s: turn %d is not recorded yet: %w", runID, callID, lagging, err)
		}
		if err != nil {
			return nil, false, err
		}
		if _, _, err := s.states.update(ctx, runID, func(cur *RunState) (bool, error) {
			return cur.recordTurn(t), nil
		}); err != nil {
			return nil, false, err
		}
	}
}

package storetest

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// runGateContract is the gate of Store.Write (store.Admit): a run's record
// holds only what the services accepted, however the events arrive.
func runGateContract(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("ForgedCallEventsChangeNoRun", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-forged", "weather", TenantA, Base)
		mustWrite(t, s, fx.Records(t)...)
		before := recordOf(t, s, fx.RunID)
		end := fx.Events[len(fx.Events)-1].Event.Time()
		// Every kind of call event, for a call no turn of the run made: both
		// before the run's end (a forger may date it so) and after it.
		for _, at := range []time.Time{end.Add(-time.Millisecond), end.Add(time.Hour)} {
			forged := ForgedCallEvents(t, fx, at)
			for _, rec := range Records(t, forged...) {
				mustWrite(t, s, rec)
			}
		}
		if after := recordOf(t, s, fx.RunID); !jsonEqual(mustJSON(t, before), mustJSON(t, after)) {
			t.Fatalf("forged call events changed the run:\nbefore %s\nafter  %s", mustJSON(t, before), mustJSON(t, after))
		}
		CheckRun(t, s, fx)
		// They are kept as received, for an operator to see.
		evs, err := s.Events(ctx(t), fx.RunID)
		if err != nil || len(evs) != len(fx.Events)+2*len(ForgedCallEvents(t, fx, end)) {
			t.Fatalf("events = %d (err %v); want the run's %d and every forged one", len(evs), err, len(fx.Events))
		}
	})

	t.Run("ForgedCallOfARunningRunWaitsForever", func(t *testing.T) {
		s := newStore(t)
		fx := StartedRun(t, "run-forged-running", "weather", TenantA, Base)
		mustWrite(t, s, fx.Records(t)...)
		mustWrite(t, s, Records(t, ForgedCallEvents(t, fx, Base.Add(time.Second))...)...)
		// Later turns of the run do not let it in: none requests that call.
		more := CompletedRun(t, fx.RunID, "weather", TenantA, Base)
		mustWrite(t, s, more.Records(t)[2:]...)
		calls, err := s.ToolCalls(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range calls {
			if c.CallID == forgedCallID(t) {
				t.Fatalf("the forged call is in the run: %+v", c)
			}
		}
		if len(calls) != len(more.Envelopes) {
			t.Fatalf("tool calls = %d, want the run's %d", len(calls), len(more.Envelopes))
		}
	})

	t.Run("PhantomRunHasNoRow", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-phantom", "weather", TenantA, Base)
		recs := fx.Records(t)
		// Everything but the run request, plus side events of its calls.
		mustWrite(t, s, recs[1:]...)
		mustWrite(t, s, Records(t, SideEvents(t, fx)...)...)
		if _, err := s.Run(ctx(t), fx.RunID); !errors.Is(err, store.ErrRunNotFound) {
			t.Fatalf("Run of a run never requested: err %v, want ErrRunNotFound", err)
		}
		if runs, err := s.ListRuns(ctx(t), store.RunFilter{}); err != nil || len(runs) != 0 {
			t.Fatalf("ListRuns = %v, %v; want no run", runIDs(runs), err)
		}
		rec := recordOf(t, s, fx.RunID)
		if len(rec.Calls) != 0 || len(rec.Turns) != 0 || len(rec.Verdicts) != 0 || len(rec.Tools) != 0 {
			t.Fatalf("a run never requested has rows: %s", mustJSON(t, rec))
		}
		if evs, err := s.Events(ctx(t), fx.RunID); err != nil || len(evs) != len(recs)-1+len(SideEvents(t, fx)) {
			t.Fatalf("events = %d (err %v); want every one received", len(evs), err)
		}
		// Its request, arriving last, makes the run of them all.
		mustWrite(t, s, recs[0])
		CheckRun(t, s, fx)
	})

	t.Run("EndedRunDoesNotChange", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-ended", "weather", TenantA, Base)
		mustWrite(t, s, fx.Records(t)...)
		before := recordOf(t, s, fx.RunID)
		late := AfterTheEnd(t, fx, time.Minute)
		for _, rec := range Records(t, late...) {
			mustWrite(t, s, rec)
		}
		if after := recordOf(t, s, fx.RunID); !jsonEqual(mustJSON(t, before), mustJSON(t, after)) {
			t.Fatalf("events after the end changed the run:\nbefore %s\nafter  %s", mustJSON(t, before), mustJSON(t, after))
		}
		CheckRun(t, s, fx)
		// In one batch with the end, after it: the same.
		fx = CompletedRun(t, "run-ended-batch", "weather", TenantA, Base)
		mustWrite(t, s, append(fx.Records(t), Records(t, AfterTheEnd(t, fx, time.Minute)...)...)...)
		CheckRun(t, s, fx)
	})

	t.Run("TheEarlierEndWins", func(t *testing.T) {
		s := newStore(t)
		for _, order := range []string{"in-order", "reversed"} {
			t.Run(order, func(t *testing.T) {
				fx := CompletedRun(t, "run-two-ends-"+order, "weather", TenantA, Base)
				recs := fx.Records(t)
				end := fx.Events[len(fx.Events)-1].Event.Time()
				failed, err := events.NewRunStatus(Source, events.RunStatus{RunID: fx.RunID, Status: events.StatusFailed,
					Tenant: fx.Tenant, Agent: fx.Agent, Reason: "a second end"}, "late", fx.Trace)
				if err != nil {
					t.Fatal(err)
				}
				// Under an id of its own, as a second end stored in a stream
				// of an earlier release could be (every end now has the id
				// <run_id>/end, so the stream refuses a second).
				failed.Event.SetID(fx.RunID + "/failed/late")
				failed.Event.SetTime(end.Add(time.Second))
				ends := append(recs[len(recs)-1:], Records(t, failed)...)
				if order == "reversed" {
					slices.Reverse(ends)
				}
				mustWrite(t, s, recs[:len(recs)-1]...)
				for _, rec := range ends {
					mustWrite(t, s, rec)
				}
				// (In reverse order the later end was applied while it was
				// the only one: the run's updated_at keeps its time.)
				run := mustRun(t, s, fx.RunID)
				if run.Status != events.StatusCompleted || run.Reason != "" || run.CompletedAt == nil ||
					!run.CompletedAt.Equal(end) || run.Outputs == nil {
					t.Fatalf("run = status %q reason %q completed_at %v outputs %s; want completed at %v, with outputs",
						run.Status, run.Reason, run.CompletedAt, run.Outputs, end)
				}
			})
		}
	})

	t.Run("ASecondRunRequestChangesNothing", func(t *testing.T) {
		s := newStore(t)
		fx := StartedRun(t, "run-twice", "weather", TenantA, Base)
		mustWrite(t, s, fx.Records(t)...)
		before := mustRun(t, s, fx.RunID)
		again := fx.Request
		again.Tenant, again.Agent.Name = TenantB, "impostor"
		o, err := events.NewRunRequested(Source, again, fx.Trace)
		if err != nil {
			t.Fatal(err)
		}
		o.Event.SetID(fx.RunID + "/requested-again")
		o.Event.SetTime(Base.Add(time.Second))
		mustWrite(t, s, Records(t, o)...)
		after := mustRun(t, s, fx.RunID)
		if !jsonEqual(mustJSON(t, before), mustJSON(t, after)) {
			t.Fatalf("a second run request changed the run:\nbefore %s\nafter  %s", mustJSON(t, before), mustJSON(t, after))
		}
	})

	t.Run("LegitimateEventsOutOfOrderAreAllRecorded", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-late-turn", "weather", TenantA, Base)
		recs := fx.Records(t)
		isTurn := func(r store.Record) bool { return r.Event.Type == events.TypeTurnCompleted }
		turn := recs[slices.IndexFunc(recs, isTurn)]
		rest := slices.DeleteFunc(slices.Clone(recs), isTurn)
		// The calls' approvals and completions, and the run's end, come
		// before the turn that made the calls, in batches of their own.
		for _, rec := range rest {
			mustWrite(t, s, rec)
		}
		if calls, err := s.ToolCalls(ctx(t), fx.RunID); err != nil || len(calls) != 0 {
			t.Fatalf("tool calls before their turn = %d (err %v); want none yet", len(calls), err)
		}
		mustWrite(t, s, turn)
		CheckRun(t, s, fx)
	})

	t.Run("ALateEventFromBeforeTheEndApplies", func(t *testing.T) {
		// An event of the run recorded after its end but dated before it: a
		// slow stream, or an operator's DLQ replay (`toolwire dlq replay`
		// publishes the dead letter with its original attributes).
		s := newStore(t)
		fx := CompletedRun(t, "run-replayed", "weather", TenantA, Base)
		recs := fx.Records(t)
		isDone := func(r store.Record) bool {
			return r.Event.Type == events.TypeCallCompleted && r.Event.CallID == fx.Envelopes[1].CallID
		}
		done := recs[slices.IndexFunc(recs, isDone)]
		mustWrite(t, s, slices.DeleteFunc(slices.Clone(recs), isDone)...)
		if c, err := s.ToolCall(ctx(t), fx.RunID, done.Event.CallID); err != nil || c.Status == store.CallCompleted {
			t.Fatalf("call before its completion: %+v, %v", c, err)
		}
		mustWrite(t, s, done)
		CheckRun(t, s, fx)
	})
}

// runRecord is what the store shows of one run beside its events.
type runRecord struct {
	Run       *store.Run
	Calls     []store.ToolCall
	Envelopes []json.RawMessage
	Turns     []store.TurnRow
	Verdicts  []store.VerdictRow
	Tools     []store.ToolDefRow
}

func recordOf(t testing.TB, s store.Store, runID string) runRecord {
	t.Helper()
	var rec runRecord
	run, err := s.Run(ctx(t), runID)
	switch {
	case err == nil:
		rec.Run = &run
	case !errors.Is(err, store.ErrRunNotFound):
		t.Fatal(err)
	}
	if rec.Calls, err = s.ToolCalls(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	if rec.Envelopes, err = s.Envelopes(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	if rec.Turns, err = s.Turns(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	if rec.Verdicts, err = s.Verdicts(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	if rec.Tools, err = s.RunTools(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	return rec
}

var forgedInput = json.RawMessage(`{"query":"forged"}`)

func forgedCallID(t testing.TB) string {
	t.Helper()
	id, err := envelope.CallID("web_search", "1.2.0", forgedInput, 9)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// ForgedCallEvents returns one event of every kind a call has (approved,
// approval required, decided, started, sandbox job and result, completed),
// at at, for a call that no turn of fx made. Their ids are new for each at.
func ForgedCallEvents(t testing.TB, fx *Run, at time.Time) []events.Outgoing {
	t.Helper()
	callID := forgedCallID(t)
	env := envelope.ToolEnvelope{CallID: callID, Name: "web_search", Version: "1.2.0", Input: forgedInput,
		Output: json.RawMessage(`{"results":["forged"]}`), TStart: at, TEnd: at.Add(time.Millisecond), Cost: 99}
	var outs []events.Outgoing
	add := func(o events.Outgoing, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		o.Event.SetTime(at)
		o.Event.SetID(o.Event.ID() + "/" + at.Format(time.RFC3339Nano))
		outs = append(outs, o)
	}
	add(events.NewCallApproved(Source, events.CallRequest{RunID: fx.RunID, CallID: callID, Seq: 9, Iteration: 1,
		Name: env.Name, Version: env.Version, Input: forgedInput, Tenant: fx.Tenant, Agent: fx.Agent,
		Queue: envelope.DefaultQueue}, fx.Trace))
	add(events.NewApprovalRequired(Source, events.ApprovalRequest{RunID: fx.RunID, CorrelationID: callID,
		ToolName: env.Name, ToolVersion: env.Version, AgentName: fx.Agent, Tenant: fx.Tenant, ArgsSummary: "{}",
		EffectDescription: "searches", Reason: "forged", ExpiresAt: at.Add(time.Hour)}, fx.Trace))
	add(events.NewDecided(Source, events.Decision{RunID: fx.RunID, CallID: callID, Decision: events.DecisionApprove,
		By: "forger"}, fx.Tenant, fx.Trace))
	add(events.NewCallStarted(Source, events.CallStarted{RunID: fx.RunID, CallID: callID, Name: env.Name,
		Version: env.Version, TStart: at}, fx.Tenant, fx.Trace))
	add(events.NewSandboxJob(Source, events.SandboxJob{RunID: fx.RunID, CallID: callID, Tool: "web_search@1.2.0",
		TenantID: fx.Tenant.ID(), Language: events.SandboxPython, Source: "print(1)", Input: json.RawMessage(`{}`),
		Stdout: events.SandboxStdoutJSON, TimeoutMS: 5000, Deadline: at.Add(time.Minute)}, fx.Trace))
	add(events.NewSandboxResult(Source, events.SandboxResult{RunID: fx.RunID, CallID: callID,
		Output: json.RawMessage(`1`)}, fx.Tenant.ID(), fx.Trace))
	add(events.NewCallCompleted(Source, fx.RunID, env, fx.Tenant, fx.Trace))
	return outs
}

// AfterTheEnd returns events of fx dated after after its end: a second end,
// a new turn, a status, a second completion of one of its calls with another
// envelope, side events of its calls.
func AfterTheEnd(t testing.TB, fx *Run, after time.Duration) []events.Outgoing {
	t.Helper()
	at := fx.Events[len(fx.Events)-1].Event.Time().Add(after)
	var outs []events.Outgoing
	add := func(o events.Outgoing, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Millisecond)
		o.Event.SetTime(at)
		o.Event.SetID(o.Event.ID() + "/late")
		outs = append(outs, o)
	}
	status := func(s string) events.RunStatus {
		return events.RunStatus{RunID: fx.RunID, Status: s, Tenant: fx.Tenant, Agent: fx.Agent, Reason: "late " + s,
			Iteration: 7, ToolCalls: 9, Spend: 100}
	}
	add(events.NewRunStatus(Source, status(events.StatusFailed), "late", fx.Trace))
	add(events.NewRunStatus(Source, status(events.StatusResumed), "late", fx.Trace))
	add(events.NewTurnCompleted(Source, events.Turn{RunID: fx.RunID, Iteration: 3, Tenant: fx.Tenant, Agent: fx.Agent,
		Verdict: events.LoopVerdict{Allowed: true}, Response: &envelope.ModelResponse{Content: "late"}, Spend: 100,
		Calls: []events.TurnCall{{CallID: forgedCallID(t), Seq: 9, Name: "web_search", Version: "1.2.0", Input: forgedInput}}}, fx.Trace))
	env := fx.Envelopes[1]
	env.Error, env.Output, env.Cost = nil, json.RawMessage(`"rewritten"`), 50
	add(events.NewCallCompleted(Source, fx.RunID, env, fx.Tenant, fx.Trace))
	for _, o := range SideEvents(t, fx) {
		add(o, nil)
	}
	add(events.NewCallCompleted(Source, fx.RunID, envelope.ToolEnvelope{CallID: forgedCallID(t), Name: "web_search",
		Version: "1.2.0", Input: forgedInput, Output: json.RawMessage(`1`), TStart: at, TEnd: at}, fx.Tenant, fx.Trace))
	return outs
}

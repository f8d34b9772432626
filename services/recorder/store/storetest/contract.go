// Package storetest is the contract suite of store.Store: every store
// (postgres.Store and sqlite.Store) runs RunStoreContract and so keeps the same
// rules. It also builds realistic runs from events, for these and other tests.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Tenants and agents used by the suite.
var (
	TenantA = envelope.Tenant{OrgID: "org-a", WorkspaceID: "ws-1", UserID: "user-1"}
	TenantB = envelope.Tenant{OrgID: "org-b", WorkspaceID: "ws-2", UserID: "user-2"}
)

// Base is the time the suite's runs start at.
var Base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// RunStoreContract runs the contract suite. newStore returns an empty store
// for one subtest, released by t.Cleanup.
func RunStoreContract(t *testing.T, newStore func(t *testing.T) store.Store) {
	runContractExtras(t, newStore)
	runGateContract(t, newStore)
	runIDContract(t, newStore)
	runApprovalContract(t, newStore)
	runTokenContract(t, newStore)
	t.Run("RecordsACompletedRun", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-complete", "weather", TenantA, Base)
		for _, rec := range fx.Records(t) {
			mustWrite(t, s, rec)
		}
		CheckRun(t, s, fx)
		evs, err := s.Events(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != len(fx.Events) {
			t.Fatalf("Events: %d, want %d", len(evs), len(fx.Events))
		}
		for i, e := range evs {
			want := fx.Events[i]
			if e.ID != want.Event.ID() || e.Type != want.Event.Type() || e.Subject != want.Subject ||
				e.Source != Source || !e.Time.Equal(want.Event.Time()) || e.RunID != fx.RunID {
				t.Errorf("event %d = %+v, want id %s type %s subject %s", i, e, want.Event.ID(), want.Event.Type(), want.Subject)
			}
			if !jsonEqual(e.Data, want.Event.Data()) {
				t.Errorf("event %d data = %s, want %s", i, e.Data, want.Event.Data())
			}
			if e.Extensions[events.ExtTraceParent] != fx.Trace.TraceParent || e.Extensions[events.ExtRunID] != fx.RunID {
				t.Errorf("event %d extensions = %v", i, e.Extensions)
			}
			if e.RecordedAt.IsZero() {
				t.Errorf("event %d has no recorded_at", i)
			}
		}
	})

	t.Run("BatchIsOneTransaction", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-batch", "weather", TenantA, Base)
		mustWrite(t, s, fx.Records(t)...)
		CheckRun(t, s, fx)
	})

	t.Run("RedeliveryChangesNothing", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-dup", "weather", TenantA, Base)
		recs := fx.Records(t)
		mustWrite(t, s, recs...)
		before := snapshot(t, s, fx.RunID)
		for _, rec := range recs {
			mustWrite(t, s, rec)
		}
		mustWrite(t, s, append(slices.Clone(recs), recs...)...) // duplicates within one batch too
		after := snapshot(t, s, fx.RunID)
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("redelivery changed the store:\nbefore %s\nafter  %s", before, after)
		}
		CheckRun(t, s, fx)
	})

	t.Run("AnyOrderConverges", func(t *testing.T) {
		s := newStore(t)
		orders := map[string]func([]store.Record){
			"reversed": func(r []store.Record) { slices.Reverse(r) },
		}
		for i := range 6 {
			rng := rand.New(rand.NewPCG(uint64(i), 42)) //nolint:gosec // G404: seeded, so that a failing order is reproducible
			orders[fmt.Sprintf("shuffled-%d", i)] = func(r []store.Record) {
				rng.Shuffle(len(r), func(a, b int) { r[a], r[b] = r[b], r[a] })
			}
		}
		for name, reorder := range orders {
			t.Run(name, func(t *testing.T) {
				fx := CompletedRun(t, "run-"+name, "weather", TenantA, Base)
				recs := fx.Records(t)
				reorder(recs)
				for _, rec := range recs {
					mustWrite(t, s, rec)
				}
				CheckRun(t, s, fx)
			})
		}
	})

	t.Run("RunStatusMovesForwardOnly", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-forward", "weather", TenantA, Base)
		completed := Records(t, fx.Event(t, events.TypeRunCompleted, ""))
		started := Records(t, fx.Event(t, events.TypeRunStarted, ""))
		requested := Records(t, fx.Event(t, events.TypeRunRequested, ""))
		mustWrite(t, s, completed...)
		mustWrite(t, s, started...)
		mustWrite(t, s, requested...)
		run := mustRun(t, s, fx.RunID)
		if run.Status != events.StatusCompleted || run.CompletedAt == nil {
			t.Fatalf("status %q completed_at %v after completed, started, requested; want completed", run.Status, run.CompletedAt)
		}
		if !run.CreatedAt.Equal(fx.Events[0].Event.Time()) {
			t.Errorf("created_at %v, want the request's time %v", run.CreatedAt, fx.Events[0].Event.Time())
		}
		if !jsonEqual(run.Request, mustJSON(t, fx.Request)) {
			t.Errorf("request = %s, want the run request", run.Request)
		}
	})

	t.Run("SuspendResumeLaterWins", func(t *testing.T) {
		s := newStore(t)
		for _, order := range []string{"in-order", "reversed"} {
			t.Run(order, func(t *testing.T) {
				runID := "run-suspend-" + order
				fx := StartedRun(t, runID, "weather", TenantA, Base)
				var outs []events.Outgoing
				for i, st := range []string{events.StatusSuspended, events.StatusResumed, events.StatusSuspended} {
					o, err := events.NewRunStatus(Source, events.RunStatus{RunID: runID, Status: st, Tenant: TenantA,
						Reason: "waiting for approval " + st}, fmt.Sprint(i), fx.Trace)
					if err != nil {
						t.Fatal(err)
					}
					o.Event.SetTime(Base.Add(time.Duration(10+i) * time.Second))
					outs = append(outs, o)
				}
				recs := append(fx.Records(t), Records(t, outs...)...)
				if order == "reversed" {
					slices.Reverse(recs)
				}
				for _, rec := range recs {
					mustWrite(t, s, rec)
				}
				run := mustRun(t, s, runID)
				if run.Status != events.StatusSuspended || run.Reason != "waiting for approval suspended" || run.CompletedAt != nil {
					t.Fatalf("status %q reason %q completed_at %v; want the last suspension", run.Status, run.Reason, run.CompletedAt)
				}
			})
		}
	})

	t.Run("FailedRunKeepsItsReason", func(t *testing.T) {
		s := newStore(t)
		fx := FailedRun(t, "run-failed", "weather", TenantB, Base, "policy denied iteration 2: max_iterations reached")
		mustWrite(t, s, fx.Records(t)...)
		run := mustRun(t, s, fx.RunID)
		if run.Status != events.StatusFailed || run.Reason != fx.Reason || run.CompletedAt == nil || run.Outputs != nil {
			t.Fatalf("run = %+v; want failed with reason %q, completed_at set, no outputs", run, fx.Reason)
		}
		if run.Iterations != 1 || run.Tenant != TenantB {
			t.Errorf("iterations %d tenant %+v", run.Iterations, run.Tenant)
		}
	})

	t.Run("CancelledRunEnds", func(t *testing.T) {
		s := newStore(t)
		fx := CancelledRun(t, "run-cancelled", "weather", TenantB, Base, "cancelled by ops: not needed")
		mustWrite(t, s, fx.Records(t)...)
		run := mustRun(t, s, fx.RunID)
		if run.Status != events.StatusCancelled || run.Reason != fx.Reason || run.CompletedAt == nil || len(run.Outputs) == 0 {
			t.Fatalf("run = %+v; want cancelled with reason %q, completed_at set, the outputs of what completed", run, fx.Reason)
		}
		runs, err := s.ListRuns(ctx(t), store.RunFilter{Status: events.StatusCancelled})
		if err != nil || len(runs) != 1 || runs[0].RunID != fx.RunID {
			t.Fatalf("ListRuns(status cancelled) = %+v, %v", runs, err)
		}
	})

	t.Run("CallStatusForwardAndEnvelopeWins", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-calls", "weather", TenantA, Base)
		env := fx.Envelopes[0]
		turn := fx.Event(t, events.TypeTurnCompleted, "")
		// A model turn whose call fields disagree with the envelope: the
		// envelope wins whichever arrives first.
		var tr events.Turn
		if err := json.Unmarshal(turn.Event.Data(), &tr); err != nil {
			t.Fatal(err)
		}
		tr.Calls = slices.Clone(tr.Calls)
		tr.Calls[0].Input = json.RawMessage(`{"query":"something else"}`)
		tr.Calls[0].Version = "9.9.9"
		odd, err := events.NewTurnCompleted(Source, tr, fx.Trace)
		if err != nil {
			t.Fatal(err)
		}
		odd.Event.SetTime(turn.Event.Time())
		// And a start time that disagrees with the envelope's.
		early, err := events.NewCallStarted(Source, events.CallStarted{RunID: fx.RunID, CallID: env.CallID,
			Name: env.Name, Version: env.Version, TStart: env.TStart.Add(-time.Second)}, fx.Tenant, fx.Trace)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, s, Records(t, fx.Event(t, events.TypeRunRequested, ""))...)
		mustWrite(t, s, Records(t, fx.Event(t, events.TypeCallCompleted, env.CallID))...)
		mustWrite(t, s, Records(t, odd, early, fx.Event(t, events.TypeCallApproved, env.CallID))...)
		calls, err := s.ToolCalls(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		// The turn requested both of its calls; only the first went further.
		if len(calls) != 2 {
			t.Fatalf("tool calls = %d, want 2", len(calls))
		}
		c := calls[0]
		if c.Status != store.CallCompleted || c.Version != env.Version || !jsonEqual(c.Input, env.Input) ||
			c.Seq == nil || *c.Seq != 1 || c.TStart == nil || !c.TStart.Equal(env.TStart) ||
			c.Queue != fx.Queues[0] || c.Cost == nil || *c.Cost != env.Cost {
			t.Fatalf("call = %+v; want completed with the envelope's version, input, t_start and cost, seq 1, queue %s", c, fx.Queues[0])
		}
		if o := calls[1]; o.Status != store.CallRequested || o.CallID != fx.Envelopes[1].CallID || o.Seq == nil || *o.Seq != 2 ||
			o.Iteration == nil || *o.Iteration != 1 || o.Name != "fetch_page" || o.Queue != "" || o.Cost != nil || o.Envelope != nil {
			t.Fatalf("second call = %+v; want requested by the turn, seq 2, no queue, cost or envelope yet", o)
		}
	})

	t.Run("OutputsBlobIsKept", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-blob", "weather", TenantA, Base)
		blob := envelope.Attachment{Kind: envelope.AttachmentBlob, URL: "/v1/blobs/run-blob.outputs",
			ContentType: "application/json", Bytes: 300 << 10}
		fx = fx.WithOutputsBlob(t, blob)
		recs := fx.Records(t)
		slices.Reverse(recs)
		for _, rec := range recs {
			mustWrite(t, s, rec)
		}
		run := mustRun(t, s, fx.RunID)
		if run.Status != events.StatusCompleted || run.Outputs != nil || run.Pinned != nil || !jsonEqual(run.OutputsBlob, mustJSON(t, blob)) {
			t.Fatalf("run = status %s outputs %s pinned %s blob %s; want completed, its outputs in the blob", run.Status,
				run.Outputs, run.Pinned, run.OutputsBlob)
		}
		got, err := s.CompletedRuns(ctx(t), TenantA, "weather", Base.Add(time.Hour), 1)
		if err != nil || len(got) != 1 || !jsonEqual(got[0].OutputsBlob, mustJSON(t, blob)) {
			t.Fatalf("CompletedRuns = %+v, %v; want the run with its outputs blob", got, err)
		}
	})

	t.Run("UnknownTypeIsKeptOnly", func(t *testing.T) {
		s := newStore(t)
		callID := "ab12"
		subj, err := events.CallSubject("run-unknown", callID, "escalated")
		if err != nil {
			t.Fatal(err)
		}
		o, err := events.Build("dev.toolwire.call.escalated.v1", "run-unknown/"+callID+"/escalated", subj,
			events.Attrs{Source: Source, RunID: "run-unknown", CallID: callID, Time: Base},
			map[string]any{"run_id": "run-unknown", "call_id": callID, "approvers": []string{"ops"}})
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, s, Records(t, o)...)
		evs, err := s.Events(ctx(t), "run-unknown")
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 || evs[0].Type != o.Event.Type() || evs[0].CallID != callID {
			t.Fatalf("events = %+v; want the one unknown event", evs)
		}
		if _, err := s.Run(ctx(t), "run-unknown"); !errors.Is(err, store.ErrRunNotFound) {
			t.Fatalf("Run of an unknown-type event's run: err %v, want ErrRunNotFound", err)
		}
		if calls, err := s.ToolCalls(ctx(t), "run-unknown"); err != nil || len(calls) != 0 {
			t.Fatalf("tool calls %v err %v; want none", calls, err)
		}
	})

	t.Run("ReadsOfAnUnknownRun", func(t *testing.T) {
		s := newStore(t)
		if _, err := s.Run(ctx(t), "nope"); !errors.Is(err, store.ErrRunNotFound) {
			t.Fatalf("Run: err %v, want ErrRunNotFound", err)
		}
		calls, err := s.ToolCalls(ctx(t), "nope")
		if err != nil || calls == nil || len(calls) != 0 {
			t.Fatalf("ToolCalls = %#v, %v; want an empty list", calls, err)
		}
		envs, err := s.Envelopes(ctx(t), "nope")
		if err != nil || envs == nil || len(envs) != 0 {
			t.Fatalf("Envelopes = %#v, %v; want an empty list", envs, err)
		}
	})

	t.Run("ListRuns", func(t *testing.T) {
		s := newStore(t)
		runs := []*Run{
			CompletedRun(t, "list-1", "weather", TenantA, Base),
			FailedRun(t, "list-2", "weather", TenantB, Base.Add(time.Minute), "boom"),
			StartedRun(t, "list-3", "travel", TenantA, Base.Add(2*time.Minute)),
			CompletedRun(t, "list-4", "travel", TenantA, Base.Add(3*time.Minute)),
		}
		for _, r := range runs {
			mustWrite(t, s, r.Records(t)...)
		}
		cases := []struct {
			f    store.RunFilter
			want []string
		}{
			{store.RunFilter{}, []string{"list-4", "list-3", "list-2", "list-1"}},
			{store.RunFilter{Limit: 2}, []string{"list-4", "list-3"}},
			{store.RunFilter{OrgID: TenantA.OrgID}, []string{"list-4", "list-3", "list-1"}},
			{store.RunFilter{Agent: "weather"}, []string{"list-2", "list-1"}},
			{store.RunFilter{Status: events.StatusCompleted}, []string{"list-4", "list-1"}},
			{store.RunFilter{Status: events.StatusStarted, Agent: "travel", OrgID: TenantA.OrgID}, []string{"list-3"}},
			{store.RunFilter{OrgID: "org-none"}, []string{}},
		}
		for _, c := range cases {
			got, err := s.ListRuns(ctx(t), c.f)
			if err != nil {
				t.Fatalf("ListRuns(%+v): %v", c.f, err)
			}
			ids := []string{}
			for _, r := range got {
				ids = append(ids, r.RunID)
			}
			if !slices.Equal(ids, c.want) {
				t.Errorf("ListRuns(%+v) = %v, want %v", c.f, ids, c.want)
			}
		}
		got, err := s.ListRuns(ctx(t), store.RunFilter{Status: events.StatusCompleted, Limit: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("ListRuns: %v %v", got, err)
		}
		if r := got[0]; r.Status != events.StatusCompleted || r.Agent != "travel" || r.Tenant != TenantA ||
			r.Iterations != 2 || r.ToolCalls != 2 || r.CompletedAt == nil {
			t.Errorf("listed run = %+v", r)
		}
	})
}

// runContractExtras are the rules of the reads the API, the live stream, the
// replay bundle and pinned handles depend on.
func runContractExtras(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("EventsAfterPagesInRecordedOrder", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-pages", "weather", TenantA, Base)
		for _, rec := range fx.Records(t) {
			mustWrite(t, s, rec)
		}
		all, err := s.Events(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != len(fx.Events) {
			t.Fatalf("Events: %d, want %d", len(all), len(fx.Events))
		}
		for i := 1; i < len(all); i++ {
			if all[i].Seq <= all[i-1].Seq {
				t.Fatalf("seq %d after %d: not increasing", all[i].Seq, all[i-1].Seq)
			}
		}
		var paged []store.EventRow
		var after int64
		for {
			page, err := s.EventsAfter(ctx(t), fx.RunID, after, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			if len(page) > 3 {
				t.Fatalf("page of %d events, limit 3", len(page))
			}
			paged = append(paged, page...)
			after = page[len(page)-1].Seq
		}
		if !reflect.DeepEqual(paged, all) {
			t.Fatalf("paged events differ from Events:\n%v\n%v", paged, all)
		}
		rest, err := s.EventsAfter(ctx(t), fx.RunID, all[4].Seq, 0)
		if err != nil || len(rest) != len(all)-5 || rest[0].ID != all[5].ID {
			t.Fatalf("EventsAfter(seq of event 4) = %d events (err %v), want %d starting at %s", len(rest), err, len(all)-5, all[5].ID)
		}
		// A redelivery records nothing new: the stream has nothing to resend.
		mustWrite(t, s, fx.Records(t)...)
		if again, err := s.EventsAfter(ctx(t), fx.RunID, all[len(all)-1].Seq, 0); err != nil || len(again) != 0 {
			t.Fatalf("after a redelivery: %d new events (err %v), want none", len(again), err)
		}
	})

	t.Run("ToolCallTurnsAndVerdicts", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-parts", "weather", TenantA, Base)
		mustWrite(t, s, fx.Records(t)...)
		env := fx.Envelopes[1]
		c, err := s.ToolCall(ctx(t), fx.RunID, env.CallID)
		if err != nil {
			t.Fatal(err)
		}
		if c.CallID != env.CallID || c.Name != env.Name || c.ErrorCode != string(env.Error.Code) || !jsonEqual(c.Envelope, mustJSON(t, env)) {
			t.Fatalf("ToolCall = %+v", c)
		}
		if _, err := s.ToolCall(ctx(t), fx.RunID, "ffff"); !errors.Is(err, store.ErrCallNotFound) {
			t.Fatalf("ToolCall of an unknown call: %v, want ErrCallNotFound", err)
		}
		if _, err := s.ToolCall(ctx(t), "nope", env.CallID); !errors.Is(err, store.ErrCallNotFound) {
			t.Fatalf("ToolCall of an unknown run: %v, want ErrCallNotFound", err)
		}
		turns, err := s.Turns(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if len(turns) != 2 || turns[0].Iteration != 1 || turns[1].Iteration != 2 {
			t.Fatalf("Turns = %+v", turns)
		}
		for i, tr := range turns {
			// A turn is kept as its event sent it (the last one rides on the
			// run's completed event).
			if _, want := fx.Turn(t, i+1); !jsonEqual(tr.Turn, want) {
				t.Errorf("turn %d = %s\nwant %s", i+1, tr.Turn, want)
			}
		}
		verdicts, err := s.Verdicts(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if len(verdicts) != 2 || !verdicts[0].Allowed || verdicts[1].Iteration != 2 {
			t.Fatalf("Verdicts = %+v", verdicts)
		}
		denied := FailedRun(t, "run-denied", "weather", TenantB, Base, "budget exhausted")
		mustWrite(t, s, denied.Records(t)...)
		if v, err := s.Verdicts(ctx(t), denied.RunID); err != nil || len(v) != 1 || v[0].Allowed ||
			v[0].Code != string(envelope.CodePolicyDenied) || v[0].Reason != "budget exhausted" {
			t.Fatalf("Verdicts of a denied run = %+v, %v; want turn 1 denied with its code and reason", v, err)
		}
		for _, f := range []func() (int, error){
			func() (int, error) { v, err := s.Turns(ctx(t), "nope"); return lenOrNil(v == nil, len(v)), err },
			func() (int, error) { v, err := s.Verdicts(ctx(t), "nope"); return lenOrNil(v == nil, len(v)), err },
			func() (int, error) { v, err := s.RunTools(ctx(t), "nope"); return lenOrNil(v == nil, len(v)), err },
		} {
			if n, err := f(); err != nil || n != 0 {
				t.Fatalf("read of an unknown run: %d rows, err %v; want an empty list", n, err)
			}
		}
	})

	t.Run("ReplayBundle", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-bundle", "weather", TenantA, Base)
		recs := fx.Records(t)
		slices.Reverse(recs) // the bundle does not depend on the order events came in
		mustWrite(t, s, recs...)
		b, err := store.ReplayBundle(ctx(t), s, fx.RunID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b.Version != envelope.ReplayBundleVersion || b.RunID != fx.RunID || b.Status != events.StatusCompleted ||
			!jsonEqual(mustJSON(t, b.Request), mustJSON(t, fx.Request)) {
			t.Fatalf("bundle version %d run %q status %q request %s", b.Version, b.RunID, b.Status, mustJSON(t, b.Request))
		}
		if len(b.Turns) != 2 {
			t.Fatalf("turns = %s", mustJSON(t, b.Turns))
		}
		for i, mt := range b.Turns {
			sent, _ := fx.Turn(t, i+1)
			want := envelope.ModelTurn{Iteration: i + 1, Model: fx.Request.Agent.Model, Tools: sent.Tools,
				Response: *sent.Response, TStart: sent.TStart, TEnd: sent.TEnd}
			if !jsonEqual(mustJSON(t, mt), mustJSON(t, want)) {
				t.Errorf("turn %d = %s\nwant %s", i+1, mustJSON(t, mt), mustJSON(t, want))
			}
			if mt.Messages != nil {
				t.Errorf("turn %d carries messages", i+1)
			}
		}
		if !jsonEqual(mustJSON(t, b.Envelopes), mustJSON(t, fx.Envelopes)) {
			t.Errorf("envelopes = %s\nwant them in seq order", mustJSON(t, b.Envelopes))
		}
		if b.Outputs == nil || !jsonEqual(mustJSON(t, b.Outputs), mustJSON(t, fx.Outputs)) {
			t.Errorf("outputs = %s", mustJSON(t, b.Outputs))
		}
		if len(b.Verdicts) != 2 || !b.Verdicts[0].Allowed || !b.Verdicts[1].Allowed || b.Verdicts[1].Iteration != 2 {
			t.Errorf("verdicts = %+v", b.Verdicts)
		}

		// A turn the loop rules denied called no model: a verdict, no turn.
		denied := FailedRun(t, "run-bundle-denied", "weather", TenantA, Base, "max_budget reached")
		mustWrite(t, s, denied.Records(t)...)
		b, err = store.ReplayBundle(ctx(t), s, denied.RunID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Turns) != 0 || len(b.Verdicts) != 1 || b.Verdicts[0].Allowed || b.Verdicts[0].Code != envelope.CodePolicyDenied ||
			b.Status != events.StatusFailed || b.Reason != "max_budget reached" {
			t.Fatalf("bundle of a denied run: turns %d verdicts %+v status %s reason %q", len(b.Turns), b.Verdicts, b.Status, b.Reason)
		}

		// Outputs in a blob are read with the reader given, or left out.
		inBlob := CompletedRun(t, "run-bundle-blob", "weather", TenantA, Base).WithOutputsBlob(t,
			envelope.Attachment{Kind: envelope.AttachmentBlob, URL: "/v1/blobs/run-bundle-blob.outputs"})
		mustWrite(t, s, inBlob.Records(t)...)
		doc := mustJSON(t, events.OutputsDocument{Outputs: inBlob.Outputs})
		read := func(_ context.Context, name string) ([]byte, error) {
			if name != "run-bundle-blob.outputs" {
				return nil, fmt.Errorf("no blob %s", name)
			}
			return doc, nil
		}
		if b, err = store.ReplayBundle(ctx(t), s, inBlob.RunID, read); err != nil || b.Outputs == nil ||
			!jsonEqual(mustJSON(t, b.Outputs), mustJSON(t, inBlob.Outputs)) {
			t.Fatalf("bundle with its outputs in a blob: %v, outputs %s", err, mustJSON(t, b.Outputs))
		}
		if b, err = store.ReplayBundle(ctx(t), s, inBlob.RunID, nil); err != nil || b.Outputs != nil || len(b.Envelopes) != 2 {
			t.Fatalf("bundle without a blob reader: %v, outputs %s", err, mustJSON(t, b.Outputs))
		}

		// A run recorded before contract v2 kept the ModelTurn of its
		// llm.completed events, messages and all: a version 1 bundle.
		legacy := StartedRun(t, "run-bundle-v1", "weather", TenantA, Base)
		mustWrite(t, s, legacy.Records(t)...)
		mt := envelope.ModelTurn{Iteration: 1, Model: legacy.Request.Agent.Model, Messages: legacy.Request.Messages,
			Tools: legacy.Request.Agent.EnabledTools, Response: envelope.ModelResponse{Content: "Sunny.", StopReason: "end_turn"},
			TStart: Base, TEnd: Base.Add(time.Second)}
		mustWrite(t, s, store.Record{Event: store.EventRow{ID: "run-bundle-v1/llm/1", Type: "dev.toolwire.llm.completed.v1",
			Source: Source, Subject: "toolwire.run.run-bundle-v1.llm.1.completed", Time: Base, RunID: legacy.RunID},
			Turn:    &store.TurnRow{RunID: legacy.RunID, Iteration: 1, Turn: mustJSON(t, mt)},
			Verdict: &store.VerdictRow{RunID: legacy.RunID, Iteration: 1, Allowed: true}})
		b, err = store.ReplayBundle(ctx(t), s, legacy.RunID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if b.Version != 0 || len(b.Turns) != 1 || !jsonEqual(mustJSON(t, b.Turns[0]), mustJSON(t, mt)) {
			t.Fatalf("bundle of a run recorded before v2: version %d turns %s; want version 1 (none) and the ModelTurn as kept",
				b.Version, mustJSON(t, b.Turns))
		}
		if _, err := store.ReplayBundle(ctx(t), s, "nope", nil); !errors.Is(err, store.ErrRunNotFound) {
			t.Fatalf("bundle of an unknown run: %v", err)
		}
	})

	t.Run("RunToolsFirstDefinitionWins", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-tools", "weather", TenantA, Base)
		recs := fx.Records(t)
		first := json.RawMessage(`{"name":"web_search","version":"1.2.0","input_schema":{"type":"object"},"metadata":{"category":"search","side_effects":"reads","cache":"none"},"implementation":{"kind":"builtin"}}`)
		later := json.RawMessage(`{"name":"web_search","version":"1.2.0","input_schema":{"type":"string"},"metadata":{"category":"search","side_effects":"reads","cache":"none"},"implementation":{"kind":"builtin"}}`)
		fetch := json.RawMessage(`{"name":"fetch_page","version":"2.0.0","input_schema":{"type":"object"},"metadata":{"category":"api","side_effects":"reads","cache":"none"},"implementation":{"kind":"http"}}`)
		for i := range recs {
			if recs[i].Turn == nil {
				continue
			}
			def := first
			if recs[i].Turn.Iteration == 2 {
				def = later
			}
			recs[i].Tools = []store.ToolDefRow{
				{RunID: fx.RunID, Name: "web_search", Version: "1.2.0", Definition: def},
				{RunID: fx.RunID, Name: "fetch_page", Version: "2.0.0", Definition: fetch},
			}
		}
		for _, rec := range recs {
			mustWrite(t, s, rec)
		}
		defs, err := s.RunTools(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if len(defs) != 2 || defs[0].Name != "fetch_page" || defs[1].Name != "web_search" || defs[1].Version != "1.2.0" {
			t.Fatalf("RunTools = %+v; want fetch_page then web_search", defs)
		}
		if !jsonEqual(defs[1].Definition, first) || !jsonEqual(defs[0].Definition, fetch) {
			t.Fatalf("web_search definition = %s; want the first recorded", defs[1].Definition)
		}
	})

	t.Run("SpendOnlyGrows", func(t *testing.T) {
		s := newStore(t)
		fx := StartedRun(t, "run-spend", "weather", TenantA, Base)
		mustWrite(t, s, fx.Records(t)...)
		if run := mustRun(t, s, fx.RunID); run.Spend != nil {
			t.Fatalf("spend %v before any report, want none", *run.Spend)
		}
		for i, spend := range []float64{0.25, 0.75, 0.5} {
			o, err := events.NewTurnCompleted(Source, events.Turn{RunID: fx.RunID, Iteration: i + 1,
				Tenant: fx.Tenant, Agent: fx.Agent, Verdict: events.LoopVerdict{Allowed: true},
				Response: &envelope.ModelResponse{Content: "thinking"}, Spend: spend}, fx.Trace)
			if err != nil {
				t.Fatal(err)
			}
			o.Event.SetTime(Base.Add(time.Duration(i+1) * time.Second))
			mustWrite(t, s, Records(t, o)...)
		}
		if run := mustRun(t, s, fx.RunID); run.Spend == nil || *run.Spend != 0.75 {
			t.Fatalf("spend %v, want the greatest reported, 0.75", run.Spend)
		}
	})

	t.Run("CompletedRunsOfOneAgentNode", func(t *testing.T) {
		s := newStore(t)
		runs := []*Run{
			CompletedRun(t, "node-1", "weather", TenantA, Base),
			FailedRun(t, "node-2", "weather", TenantA, Base.Add(time.Minute), "boom"),
			CompletedRun(t, "node-3", "weather", TenantA, Base.Add(2*time.Minute)),
			CompletedRun(t, "node-4", "travel", TenantA, Base.Add(3*time.Minute)),
			CompletedRun(t, "node-5", "weather", TenantB, Base.Add(4*time.Minute)),
			StartedRun(t, "node-6", "weather", TenantA, Base.Add(5*time.Minute)),
		}
		for _, r := range runs {
			mustWrite(t, s, r.Records(t)...)
		}
		got, err := s.CompletedRuns(ctx(t), TenantA, "weather", Base.Add(5*time.Minute), 10)
		if err != nil {
			t.Fatal(err)
		}
		if ids := runIDs(got); !slices.Equal(ids, []string{"node-3", "node-1"}) {
			t.Fatalf("CompletedRuns = %v, want [node-3 node-1]", ids)
		}
		if got[0].Outputs == nil || got[0].Pinned == nil {
			t.Fatalf("CompletedRuns without outputs or pinned: %+v", got[0])
		}
		if got, err := s.CompletedRuns(ctx(t), TenantA, "weather", Base.Add(2*time.Minute), 10); err != nil || !slices.Equal(runIDs(got), []string{"node-1"}) {
			t.Fatalf("CompletedRuns before node-3 = %v %v, want [node-1]", runIDs(got), err)
		}
		if got, err := s.CompletedRuns(ctx(t), TenantA, "weather", Base.Add(time.Hour), 1); err != nil || !slices.Equal(runIDs(got), []string{"node-3"}) {
			t.Fatalf("CompletedRuns limit 1 = %v %v", runIDs(got), err)
		}
	})

	t.Run("CompletedRunsOfOneTenantWhole", func(t *testing.T) {
		// The runs a stale_last_success pin reads from: the agent node is
		// the agent name within one tenant, org, workspace and user each
		// matched exactly, so that a reader of one workspace (or user)
		// never gets another's outputs through a pin.
		s := newStore(t)
		otherWS := envelope.Tenant{OrgID: TenantA.OrgID, WorkspaceID: "ws-other", UserID: TenantA.UserID}
		otherUser := envelope.Tenant{OrgID: TenantA.OrgID, WorkspaceID: TenantA.WorkspaceID, UserID: "user-other"}
		orgOnly := envelope.Tenant{OrgID: TenantA.OrgID}
		wsOnly := envelope.Tenant{OrgID: TenantA.OrgID, WorkspaceID: TenantA.WorkspaceID}
		for _, r := range []*Run{
			CompletedRun(t, "w-a", "weather", TenantA, Base),
			CompletedRun(t, "w-ws", "weather", otherWS, Base.Add(time.Minute)),
			CompletedRun(t, "w-user", "weather", otherUser, Base.Add(2*time.Minute)),
			CompletedRun(t, "w-org", "weather", orgOnly, Base.Add(3*time.Minute)),
			CompletedRun(t, "w-wsonly", "weather", wsOnly, Base.Add(4*time.Minute)),
			CompletedRun(t, "w-b", "weather", TenantB, Base.Add(5*time.Minute)),
		} {
			mustWrite(t, s, r.Records(t)...)
		}
		for _, tc := range []struct {
			tenant envelope.Tenant
			want   []string
		}{
			{TenantA, []string{"w-a"}},
			{otherWS, []string{"w-ws"}},
			{otherUser, []string{"w-user"}},
			{orgOnly, []string{"w-org"}},
			{wsOnly, []string{"w-wsonly"}},
			{TenantB, []string{"w-b"}},
			{envelope.Tenant{OrgID: TenantA.OrgID, WorkspaceID: "ws-none"}, nil},
			{envelope.Tenant{OrgID: "org-none"}, nil},
		} {
			got, err := s.CompletedRuns(ctx(t), tc.tenant, "weather", Base.Add(time.Hour), 10)
			if err != nil || !slices.Equal(runIDs(got), tc.want) {
				t.Errorf("CompletedRuns(%+v) = %v, %v; want %v", tc.tenant, runIDs(got), err, tc.want)
			}
			for _, r := range got {
				if r.Tenant != tc.tenant {
					t.Errorf("CompletedRuns(%+v) returned run %s of %+v", tc.tenant, r.RunID, r.Tenant)
				}
			}
		}
	})

	t.Run("ListRunsByWorkspaceUserAndTime", func(t *testing.T) {
		s := newStore(t)
		runs := []*Run{
			CompletedRun(t, "t-1", "weather", TenantA, Base),
			CompletedRun(t, "t-2", "weather", TenantB, Base.Add(time.Minute)),
			CompletedRun(t, "t-3", "weather", TenantA, Base.Add(2*time.Minute)),
		}
		for _, r := range runs {
			mustWrite(t, s, r.Records(t)...)
		}
		first := func(r *Run) time.Time { return r.Events[0].Event.Time() }
		cases := []struct {
			f    store.RunFilter
			want []string
		}{
			{store.RunFilter{WorkspaceID: TenantB.WorkspaceID}, []string{"t-2"}},
			{store.RunFilter{UserID: TenantA.UserID}, []string{"t-3", "t-1"}},
			{store.RunFilter{Since: first(runs[1])}, []string{"t-3", "t-2"}},
			{store.RunFilter{Until: first(runs[1])}, []string{"t-1"}},
			{store.RunFilter{Since: first(runs[0]), Until: first(runs[2])}, []string{"t-2", "t-1"}},
			{store.RunFilter{Since: Base.Add(time.Hour)}, []string{}},
		}
		for _, c := range cases {
			got, err := s.ListRuns(ctx(t), c.f)
			if err != nil {
				t.Fatalf("ListRuns(%+v): %v", c.f, err)
			}
			if ids := runIDs(got); !slices.Equal(ids, c.want) {
				t.Errorf("ListRuns(%+v) = %v, want %v", c.f, ids, c.want)
			}
		}
	})
}

// lenOrNil is n, or -1 for a nil list (which the API would show as null).
func lenOrNil(isNil bool, n int) int {
	if isNil {
		return -1
	}
	return n
}

func runIDs(runs []store.Run) []string {
	ids := []string{}
	for _, r := range runs {
		ids = append(ids, r.RunID)
	}
	return ids
}

// CheckRun asserts that the store holds fx exactly as its events tell it.
func CheckRun(t testing.TB, s store.Store, fx *Run) {
	t.Helper()
	run := mustRun(t, s, fx.RunID)
	last := fx.Events[len(fx.Events)-1].Event.Time()
	if run.Status != fx.Status() || run.Tenant != fx.Tenant || run.Agent != fx.Agent ||
		run.TraceID != fx.Trace.TraceID() {
		t.Errorf("run = status %q tenant %+v agent %q trace %q; want %q %+v %q %q", run.Status, run.Tenant,
			run.Agent, run.TraceID, fx.Status(), fx.Tenant, fx.Agent, fx.Trace.TraceID())
	}
	if run.Reason != fx.Reason {
		t.Errorf("reason %q, want %q", run.Reason, fx.Reason)
	}
	if !run.CreatedAt.Equal(fx.Events[0].Event.Time()) || !run.UpdatedAt.Equal(last) ||
		run.CompletedAt == nil || !run.CompletedAt.Equal(last) {
		t.Errorf("times created %v updated %v completed %v; want %v, %v, %v", run.CreatedAt, run.UpdatedAt,
			run.CompletedAt, fx.Events[0].Event.Time(), last, last)
	}
	if !jsonEqual(run.Request, mustJSON(t, fx.Request)) {
		t.Errorf("request = %s\nwant %s", run.Request, mustJSON(t, fx.Request))
	}
	if fx.Outputs != nil {
		done := fx.Event(t, events.TypeRunCompleted, "")
		var raw struct {
			Outputs json.RawMessage `json:"outputs"`
		}
		if err := json.Unmarshal(done.Event.Data(), &raw); err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(run.Outputs, raw.Outputs) {
			t.Errorf("outputs = %s\nwant %s", run.Outputs, raw.Outputs)
		}
		if run.Pinned == nil {
			t.Errorf("pinned handles missing")
		}
	}
	if run.Iterations != fx.Iterations {
		t.Errorf("iterations %d, want %d", run.Iterations, fx.Iterations)
	}
	if run.Spend == nil || *run.Spend != fx.Spend {
		t.Errorf("spend %v, want %v", run.Spend, fx.Spend)
	}
	if run.ToolCalls != len(fx.Envelopes) {
		t.Errorf("tool_calls %d, want %d", run.ToolCalls, len(fx.Envelopes))
	}

	calls, err := s.ToolCalls(ctx(t), fx.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != len(fx.Envelopes) {
		t.Fatalf("tool calls = %d, want %d", len(calls), len(fx.Envelopes))
	}
	for i, c := range calls {
		env := fx.Envelopes[i]
		wantCode := ""
		if env.Error != nil {
			wantCode = string(env.Error.Code)
		}
		if c.CallID != env.CallID || c.Name != env.Name || c.Version != env.Version || c.Status != store.CallCompleted ||
			c.Seq == nil || *c.Seq != i+1 || c.Iteration == nil || *c.Iteration != 1 || c.ErrorCode != wantCode ||
			c.Cached != env.Cached || c.Truncated != env.Truncated {
			t.Errorf("call %d = %+v; want envelope %s %s@%s seq %d code %q", i, c, env.CallID, env.Name, env.Version, i+1, wantCode)
		}
		if c.TStart == nil || !c.TStart.Equal(env.TStart) || c.TEnd == nil || !c.TEnd.Equal(env.TEnd) ||
			c.LatencyMS == nil || *c.LatencyMS != env.Latency().Milliseconds() {
			t.Errorf("call %d times %v %v %v; want %v %v %dms", i, c.TStart, c.TEnd, c.LatencyMS, env.TStart, env.TEnd,
				env.Latency().Milliseconds())
		}
		if !jsonEqual(c.Input, env.Input) || !jsonEqual(c.Envelope, mustJSON(t, env)) {
			t.Errorf("call %d input %s envelope %s", i, c.Input, c.Envelope)
		}
		if c.Cost == nil || *c.Cost != env.Cost {
			t.Errorf("call %d cost %v; want the envelope's, %v", i, c.Cost, env.Cost)
		}
		if i < len(fx.Queues) && c.Queue != fx.Queues[i] {
			t.Errorf("call %d queue %q; want %q", i, c.Queue, fx.Queues[i])
		}
	}
	envs, err := s.Envelopes(ctx(t), fx.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if len(envs) != len(fx.Envelopes) {
		t.Fatalf("envelopes = %d, want %d", len(envs), len(fx.Envelopes))
	}
	for i, e := range envs {
		if !jsonEqual(e, mustJSON(t, fx.Envelopes[i])) {
			t.Errorf("envelope %d = %s\nwant %s", i, e, mustJSON(t, fx.Envelopes[i]))
		}
	}
}

// snapshotOf is everything the store shows of one run.
type snapshotOf struct {
	runRecord
	Events []store.EventRow
}

func (s snapshotOf) String() string {
	b, _ := json.Marshal(s)
	return string(b)
}

func snapshot(t testing.TB, s store.Store, runID string) snapshotOf {
	t.Helper()
	snap := snapshotOf{runRecord: recordOf(t, s, runID)}
	if snap.Run == nil {
		t.Fatalf("Run(%q): %v", runID, store.ErrRunNotFound)
	}
	var err error
	if snap.Events, err = s.Events(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	return snap
}

func mustWrite(t testing.TB, s store.Store, recs ...store.Record) {
	t.Helper()
	if err := s.Write(ctx(t), recs...); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

func mustRun(t testing.TB, s store.Store, runID string) store.Run {
	t.Helper()
	run, err := s.Run(ctx(t), runID)
	if err != nil {
		t.Fatalf("Run(%q): %v", runID, err)
	}
	return run
}

func mustJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

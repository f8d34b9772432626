// Package storetest is the contract suite of recorder.Store: every store (the
// Postgres one now, SQLite later) runs RunStoreContract and so keeps the same
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
	"github.com/toolwire/toolwire/services/recorder"
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
func RunStoreContract(t *testing.T, newStore func(t *testing.T) recorder.Store) {
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
		orders := map[string]func([]recorder.Record){
			"reversed": func(r []recorder.Record) { slices.Reverse(r) },
		}
		for i := range 6 {
			rng := rand.New(rand.NewPCG(uint64(i), 42)) //nolint:gosec // G404: seeded, so that a failing order is reproducible
			orders[fmt.Sprintf("shuffled-%d", i)] = func(r []recorder.Record) {
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

	t.Run("CallStatusForwardAndEnvelopeWins", func(t *testing.T) {
		s := newStore(t)
		fx := CompletedRun(t, "run-calls", "weather", TenantA, Base)
		env := fx.Envelopes[0]
		requested := fx.Event(t, events.TypeCallRequested, env.CallID)
		// A request whose fields disagree with the envelope: the envelope wins
		// whichever arrives first.
		var req events.CallRequest
		if err := json.Unmarshal(requested.Event.Data(), &req); err != nil {
			t.Fatal(err)
		}
		req.Input = json.RawMessage(`{"query":"something else"}`)
		req.Version = "9.9.9"
		odd, err := events.NewCallRequest(Source, "requested", req, fx.Trace)
		if err != nil {
			t.Fatal(err)
		}
		odd.Event.SetTime(requested.Event.Time())
		// And a start time that disagrees with the envelope's.
		early, err := events.NewCallStarted(Source, events.CallStarted{RunID: fx.RunID, CallID: env.CallID,
			Name: env.Name, Version: env.Version, TStart: env.TStart.Add(-time.Second)}, fx.Tenant, fx.Trace)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, s, Records(t, fx.Event(t, events.TypeCallCompleted, env.CallID))...)
		mustWrite(t, s, Records(t, odd, early, fx.Event(t, events.TypeCallApproved, env.CallID))...)
		calls, err := s.ToolCalls(ctx(t), fx.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) != 1 {
			t.Fatalf("tool calls = %d, want 1", len(calls))
		}
		c := calls[0]
		if c.Status != recorder.CallCompleted || c.Version != env.Version || !jsonEqual(c.Input, env.Input) ||
			c.Seq == nil || *c.Seq != 1 || c.TStart == nil || !c.TStart.Equal(env.TStart) {
			t.Fatalf("call = %+v; want completed with the envelope's version, input and t_start, seq 1", c)
		}
	})

	t.Run("UnknownTypeIsKeptOnly", func(t *testing.T) {
		s := newStore(t)
		callID := "ab12"
		subj, err := events.CallSubject("run-unknown", callID, "approval_required")
		if err != nil {
			t.Fatal(err)
		}
		o, err := events.Build("dev.toolwire.call.approval_required.v1", "run-unknown/"+callID+"/approval_required", subj,
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
		if _, err := s.Run(ctx(t), "run-unknown"); !errors.Is(err, recorder.ErrRunNotFound) {
			t.Fatalf("Run of an unknown-type event's run: err %v, want ErrRunNotFound", err)
		}
		if calls, err := s.ToolCalls(ctx(t), "run-unknown"); err != nil || len(calls) != 0 {
			t.Fatalf("tool calls %v err %v; want none", calls, err)
		}
	})

	t.Run("ReadsOfAnUnknownRun", func(t *testing.T) {
		s := newStore(t)
		if _, err := s.Run(ctx(t), "nope"); !errors.Is(err, recorder.ErrRunNotFound) {
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
			f    recorder.RunFilter
			want []string
		}{
			{recorder.RunFilter{}, []string{"list-4", "list-3", "list-2", "list-1"}},
			{recorder.RunFilter{Limit: 2}, []string{"list-4", "list-3"}},
			{recorder.RunFilter{OrgID: TenantA.OrgID}, []string{"list-4", "list-3", "list-1"}},
			{recorder.RunFilter{Agent: "weather"}, []string{"list-2", "list-1"}},
			{recorder.RunFilter{Status: events.StatusCompleted}, []string{"list-4", "list-1"}},
			{recorder.RunFilter{Status: events.StatusStarted, Agent: "travel", OrgID: TenantA.OrgID}, []string{"list-3"}},
			{recorder.RunFilter{OrgID: "org-none"}, []string{}},
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
		got, err := s.ListRuns(ctx(t), recorder.RunFilter{Status: events.StatusCompleted, Limit: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("ListRuns: %v %v", got, err)
		}
		if r := got[0]; r.Status != events.StatusCompleted || r.Agent != "travel" || r.Tenant != TenantA ||
			r.Iterations != 2 || r.ToolCalls != 2 || r.CompletedAt == nil {
			t.Errorf("listed run = %+v", r)
		}
	})
}

// CheckRun asserts that the store holds fx exactly as its events tell it.
func CheckRun(t testing.TB, s recorder.Store, fx *Run) {
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
		if c.CallID != env.CallID || c.Name != env.Name || c.Version != env.Version || c.Status != recorder.CallCompleted ||
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
	Run       recorder.Run
	Calls     []recorder.ToolCall
	Envelopes []json.RawMessage
	Events    []recorder.EventRow
}

func (s snapshotOf) String() string {
	b, _ := json.Marshal(s)
	return string(b)
}

func snapshot(t testing.TB, s recorder.Store, runID string) snapshotOf {
	t.Helper()
	var snap snapshotOf
	var err error
	snap.Run = mustRun(t, s, runID)
	if snap.Calls, err = s.ToolCalls(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	if snap.Envelopes, err = s.Envelopes(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	if snap.Events, err = s.Events(ctx(t), runID); err != nil {
		t.Fatal(err)
	}
	return snap
}

func mustWrite(t testing.TB, s recorder.Store, recs ...recorder.Record) {
	t.Helper()
	if err := s.Write(ctx(t), recs...); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

func mustRun(t testing.TB, s recorder.Store, runID string) recorder.Run {
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

package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestRecordOfEveryEventType: every event type of package events is
// materialized (touches a run), not merely kept.
func TestRecordOfEveryEventType(t *testing.T) {
	fx := storetest.CompletedRun(t, "every-type", "weather", storetest.TenantA, storetest.Base)
	outs := append([]events.Outgoing(nil), fx.Events...)
	add := func(o events.Outgoing, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, o)
	}
	for _, st := range []string{events.StatusSuspended, events.StatusResumed, events.StatusFailed} {
		add(events.NewRunStatus(storetest.Source, events.RunStatus{RunID: fx.RunID, Status: st, Tenant: fx.Tenant}, "", fx.Trace))
	}
	add(events.NewVerdict(storetest.Source, events.Verdict{RunID: fx.RunID, Iteration: 3, Allowed: false,
		Code: envelope.CodePolicyDenied, Reason: "max_iterations"}, fx.Tenant, fx.Trace))
	for _, o := range storetest.SideEvents(t, fx) {
		add(o, nil)
	}

	seen := map[string]bool{}
	for _, rec := range storetest.Records(t, outs...) {
		if rec.Run == nil {
			t.Errorf("%s: no run update", rec.Event.Type)
		}
		if rec.Event.RunID != fx.RunID {
			t.Errorf("%s: run id %q", rec.Event.Type, rec.Event.RunID)
		}
		seen[rec.Event.Type] = true
		switch rec.Event.Type {
		case events.TypeCallRequested, events.TypeCallApproved, events.TypeCallStarted, events.TypeCallCompleted,
			events.TypeCallApprovalRequired, events.TypeCallDecided:
			if rec.Call == nil || rec.Event.CallID == "" || rec.Call.CallID != rec.Event.CallID {
				t.Errorf("%s: call update %+v", rec.Event.Type, rec.Call)
			}
		case events.TypeLLMCompleted:
			if rec.Turn == nil || rec.Turn.Iteration < 1 || len(rec.Turn.Turn) == 0 {
				t.Errorf("%s: turn %+v", rec.Event.Type, rec.Turn)
			}
		case events.TypeIterationApproved, events.TypeIterationDenied:
			if rec.Verdict == nil {
				t.Errorf("%s: no verdict", rec.Event.Type)
			}
		}
	}
	for _, typ := range events.EventTypes() {
		if !seen[typ] {
			t.Errorf("event type %s is not covered", typ)
		}
	}
}

func TestRecordOfKeepsOutputsAsSent(t *testing.T) {
	fx := storetest.CompletedRun(t, "as-sent", "weather", storetest.TenantA, storetest.Base)
	done := fx.Event(t, events.TypeRunCompleted, "")
	recs := storetest.Records(t, done)
	if got := string(recs[0].Run.Outputs); !strings.HasPrefix(got, `{"response":"It is sunny`) {
		t.Fatalf("outputs = %s", got)
	}
	if recs[0].Run.Status != events.StatusCompleted || recs[0].Run.TraceID != fx.Trace.TraceID() {
		t.Fatalf("run update = %+v", recs[0].Run)
	}
}

func TestRecordOfRefusesWhatCannotBeRecorded(t *testing.T) {
	subj := func(verb events.Verb) string {
		s, err := events.RunSubject("r1", verb)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	build := func(typ, subject string, runID string, data any) *event.Event {
		o, err := events.Build(typ, "id-"+typ, subject, events.Attrs{RunID: runID, Time: storetest.Base}, data)
		if err != nil {
			t.Fatal(err)
		}
		return &o.Event
	}
	cases := []struct {
		name    string
		ev      *event.Event
		subject string
		want    string
	}{
		{"unknown field", build(events.TypeRunStarted, subj("started"), "r1",
			map[string]any{"run_id": "r1", "status": "started", "bogus": true}), subj("started"), "bogus"},
		{"status of another type", build(events.TypeRunStarted, subj("started"), "r1",
			map[string]any{"run_id": "r1", "status": "completed"}), subj("started"), "status"},
		{"run id of another run", build(events.TypeRunStarted, subj("started"), "r1",
			map[string]any{"run_id": "r2", "status": "started"}), subj("started"), "r2"},
		{"unsafe run id", build(events.TypeIterationRequested, "toolwire.run.x", "",
			map[string]any{"run_id": "a b", "iteration": 1}), "toolwire.run.x", "run_id"},
		{"envelope without call id", build(events.TypeCallCompleted, "toolwire.call.r1.ab.completed", "r1",
			map[string]any{"name": "x", "version": "1.0.0"}), "toolwire.call.r1.ab.completed", "call_id"},
		{"verdict allowed in a denied event", build(events.TypeIterationDenied, "toolwire.run.r1.iteration.1.denied", "r1",
			map[string]any{"run_id": "r1", "iteration": 1, "allowed": true}), "toolwire.run.r1.iteration.1.denied", "allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := store.RecordOf(c.ev, c.subject)
			if !errors.Is(err, store.ErrUndecodable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("RecordOf = %v; want ErrUndecodable mentioning %q", err, c.want)
			}
		})
	}

	t.Run("data that is not JSON", func(t *testing.T) {
		e := event.New()
		e.SetID("x")
		e.SetType("dev.example.other.v1")
		e.SetSource("/x")
		e.SetTime(time.Now())
		if err := e.SetData("text/plain", []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if _, err := store.RecordOf(&e, subj("other")); !errors.Is(err, store.ErrUndecodable) {
			t.Fatalf("RecordOf = %v; want ErrUndecodable", err)
		}
	})
}

func TestRecordOfUnknownType(t *testing.T) {
	e := event.New()
	e.SetID("r1/x")
	e.SetType("dev.example.other.v1")
	e.SetSource("/x")
	if err := e.SetData(event.ApplicationJSON, []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	rec, err := store.RecordOf(&e, "toolwire.run.r1.other")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Run != nil || rec.Call != nil || rec.Turn != nil || rec.Verdict != nil {
		t.Fatalf("unknown type materialized: %+v", rec)
	}
	if rec.Event.RunID != "r1" || rec.Event.Time.IsZero() || string(rec.Event.Data) != `{"a":1}` {
		t.Fatalf("event row = %+v", rec.Event)
	}
}

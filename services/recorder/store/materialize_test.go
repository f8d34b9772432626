package store_test

import (
	"bytes"
	"encoding/json"
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
	for _, st := range []string{events.StatusSuspended, events.StatusResumed, events.StatusFailed, events.StatusCancelled} {
		add(events.NewRunStatus(storetest.Source, events.RunStatus{RunID: fx.RunID, Status: st, Tenant: fx.Tenant}, "", fx.Trace))
	}
	add(events.NewCancelRequested(storetest.Source, events.CancelRequest{RunID: fx.RunID, Tenant: fx.Tenant, Reason: "runaway"}, fx.Trace))
	add(events.NewTurnCompleted(storetest.Source, events.Turn{RunID: fx.RunID, Iteration: 3, Tenant: fx.Tenant,
		Agent: fx.Agent, Verdict: events.LoopVerdict{Code: envelope.CodePolicyDenied, Reason: "max_iterations",
			Rule: "max_iterations"}}, fx.Trace))
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
		case events.TypeCallApproved, events.TypeCallStarted, events.TypeCallCompleted,
			events.TypeCallApprovalRequired, events.TypeCallDecided:
			if len(rec.Calls) != 1 || rec.Event.CallID == "" || rec.Calls[0].CallID != rec.Event.CallID {
				t.Errorf("%s: call updates %+v", rec.Event.Type, rec.Calls)
			}
		case events.TypeTurnCompleted:
			if rec.Turn == nil || rec.Turn.Iteration < 1 || len(rec.Turn.Turn) == 0 || rec.Verdict == nil ||
				rec.Verdict.Iteration != rec.Turn.Iteration {
				t.Errorf("%s: turn %+v verdict %+v", rec.Event.Type, rec.Turn, rec.Verdict)
			}
			if rec.Run.Status != events.StatusStarted || rec.Run.Iterations != rec.Turn.Iteration {
				t.Errorf("%s: run update %+v; want started at iteration %d", rec.Event.Type, rec.Run, rec.Turn.Iteration)
			}
		}
	}
	for _, typ := range events.EventTypes() {
		if !seen[typ] {
			t.Errorf("event type %s is not covered", typ)
		}
	}
}

// TestRecordOfTurn: a model turn is the run's iteration n, its spend and
// tool call count so far, the turn as sent, the loop rules' verdict, and a
// request of each call it made; an approved call names its queue, a
// completed one its cost.
func TestRecordOfTurn(t *testing.T) {
	fx := storetest.CompletedRun(t, "turn-run", "weather", storetest.TenantA, storetest.Base)
	rec := storetest.Records(t, fx.Event(t, events.TypeTurnCompleted, ""))[0]
	var turn events.Turn
	if err := json.Unmarshal(fx.Event(t, events.TypeTurnCompleted, "").Event.Data(), &turn); err != nil {
		t.Fatal(err)
	}
	u := rec.Run
	if u.Iterations != 1 || u.ToolCalls != 2 || u.Spend == nil || *u.Spend != turn.Spend || u.Tenant != fx.Tenant ||
		u.Agent != fx.Agent || u.TraceID != fx.Trace.TraceID() || u.Status != events.StatusStarted {
		t.Fatalf("run update = %+v", u)
	}
	if string(rec.Turn.Turn) != string(fx.Event(t, events.TypeTurnCompleted, "").Event.Data()) {
		t.Fatalf("turn row = %s; want the event's data as sent", rec.Turn.Turn)
	}
	if v := rec.Verdict; v == nil || !v.Allowed || v.Iteration != 1 || v.RunID != fx.RunID {
		t.Fatalf("verdict = %+v", rec.Verdict)
	}
	if len(rec.Calls) != 2 {
		t.Fatalf("call updates = %+v; want the turn's two calls", rec.Calls)
	}
	for i, c := range rec.Calls {
		env := fx.Envelopes[i]
		if c.CallID != env.CallID || c.Status != store.CallRequested || c.Seq == nil || *c.Seq != i+1 ||
			c.Iteration == nil || *c.Iteration != 1 || c.Name != env.Name || c.Version != env.Version ||
			compact(t, c.Input) != compact(t, env.Input) || c.Envelope != nil || c.Queue != "" {
			t.Errorf("call %d = %+v; want %s requested", i, c, env.CallID)
		}
	}
	approved := storetest.Records(t, fx.Event(t, events.TypeCallApproved, fx.Envelopes[1].CallID))[0]
	if c := approved.Calls[0]; c.Status != store.CallApproved || c.Queue != "fetchers" || c.Seq == nil || *c.Seq != 2 {
		t.Fatalf("approved = %+v; want approved on queue fetchers", c)
	}
	done := storetest.Records(t, fx.Event(t, events.TypeCallCompleted, fx.Envelopes[1].CallID))[0]
	if c := done.Calls[0]; c.Cost == nil || *c.Cost != fx.Envelopes[1].Cost || c.ErrorCode != string(envelope.CodeTimeout) {
		t.Fatalf("completed = %+v; want the envelope's cost %v", c, fx.Envelopes[1].Cost)
	}
	// The turn that ended a run rides on its end event: the final answer on
	// the completed one, a denied model call on the failed one.
	end := storetest.Records(t, fx.Event(t, events.TypeRunCompleted, ""))[0]
	_, final := fx.Turn(t, 2)
	if end.Turn == nil || end.Turn.Iteration != 2 || string(end.Turn.Turn) != string(final) || end.Verdict == nil ||
		!end.Verdict.Allowed || len(end.Calls) != 0 || end.Run.Iterations != 2 || end.Run.Status != events.StatusCompleted {
		t.Fatalf("completed = turn %+v verdict %+v calls %+v run %+v", end.Turn, end.Verdict, end.Calls, end.Run)
	}
	denied := storetest.FailedRun(t, "turn-denied", "weather", storetest.TenantA, storetest.Base, "over budget")
	rec = storetest.Records(t, denied.Event(t, events.TypeRunFailed, ""))[0]
	if v := rec.Verdict; v == nil || v.Allowed || v.Code != string(envelope.CodePolicyDenied) || v.Reason != "over budget" ||
		len(rec.Calls) != 0 || rec.Turn == nil || rec.Run.Status != events.StatusFailed || rec.Run.Reason != "over budget" {
		t.Fatalf("denied turn = verdict %+v calls %+v turn %v run %+v", rec.Verdict, rec.Calls, rec.Turn, rec.Run)
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
	callA := strings.Repeat("a", 64)
	turnSubj := "toolwire.run.r1.turn.1.completed"
	turn := func(edit func(map[string]any)) map[string]any {
		m := map[string]any{"run_id": "r1", "iteration": 1, "tenant": map[string]any{"org_id": "o"}, "agent": "a",
			"verdict": map[string]any{"allowed": true}, "model": map[string]any{"provider": "p", "name": "m"},
			"response": map[string]any{"content": "", "stop_reason": "tool_use", "usage": map[string]any{}},
			"cost":     0, "t_start": storetest.Base, "t_end": storetest.Base, "policy": map[string]any{},
			"enabled_tools": []string{"echo@1.0.0"}, "spend": 0,
			"calls": []map[string]any{{"call_id": callA, "seq": 1, "name": "echo", "version": "1.0.0", "input": map[string]any{}}}}
		edit(m)
		return m
	}
	approvedSubj := "toolwire.call.r1." + callA + ".approved.default"
	approved := func(edit func(map[string]any)) map[string]any {
		m := map[string]any{"run_id": "r1", "call_id": callA, "seq": 1, "iteration": 1, "name": "echo", "version": "1.0.0",
			"input": map[string]any{}, "tenant": map[string]any{"org_id": "o"}, "agent": "a", "queue": "default"}
		edit(m)
		return m
	}
	completed := func(edit func(map[string]any)) map[string]any {
		m := map[string]any{"run_id": "r1", "status": "completed", "tenant": map[string]any{"org_id": "o"},
			"outputs_blob": map[string]any{"kind": "blob", "url": "/v1/blobs/r1.outputs"}}
		edit(m)
		return m
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
		// The subject names the run a store keys the event by (issue 29).
		{"extension of another run than the subject's", build(events.TypeRunStarted, subj("started"), "r2",
			map[string]any{"run_id": "r2", "status": "started"}), subj("started"), `delivered on run "r1"'s subject`},
		{"unknown type, extension of another run", build("com.example.other", subj("started"), "r2",
			map[string]any{}), subj("started"), `its extensions name run "r2"`},
		{"unsafe run id", build(events.TypeTurnCompleted, "toolwire.run.x", "",
			turn(func(m map[string]any) { m["run_id"] = "a b" })), "toolwire.run.x", "run_id"},
		{"envelope without call id", build(events.TypeCallCompleted, "toolwire.call.r1.ab.completed", "r1",
			map[string]any{"name": "x", "version": "1.0.0"}), "toolwire.call.r1.ab.completed", "call_id"},
		{"turn of another run", build(events.TypeTurnCompleted, turnSubj, "r1",
			turn(func(m map[string]any) { m["run_id"] = "r2" })), turnSubj, "r2"},
		{"turn 0", build(events.TypeTurnCompleted, "toolwire.x", "r1",
			turn(func(m map[string]any) { m["iteration"] = 0 })), "toolwire.x", "iteration 0"},
		{"turn delivered as another turn", build(events.TypeTurnCompleted, "toolwire.run.r1.turn.2.completed", "r1",
			turn(func(map[string]any) {})), "toolwire.run.r1.turn.2.completed", "delivered as turn 2"},
		{"denied turn with calls", build(events.TypeTurnCompleted, turnSubj, "r1",
			turn(func(m map[string]any) { m["verdict"] = map[string]any{"allowed": false, "code": "POLICY_DENIED"} })), turnSubj, "denied"},
		{"turn call with an unsafe id", build(events.TypeTurnCompleted, turnSubj, "r1",
			turn(func(m map[string]any) { m["calls"].([]map[string]any)[0]["call_id"] = "ABC" })), turnSubj, "calls[0]"},
		{"turn call with seq 0", build(events.TypeTurnCompleted, turnSubj, "r1",
			turn(func(m map[string]any) { m["calls"].([]map[string]any)[0]["seq"] = 0 })), turnSubj, "seq 0"},
		{"turn naming a call twice", build(events.TypeTurnCompleted, turnSubj, "r1",
			turn(func(m map[string]any) {
				c := m["calls"].([]map[string]any)
				m["calls"] = append(c, map[string]any{"call_id": callA, "seq": 2, "name": "echo", "version": "1.0.0", "input": 1})
			})), turnSubj, "twice"},
		{"turn call with an unknown field", build(events.TypeTurnCompleted, turnSubj, "r1",
			turn(func(m map[string]any) { m["calls"].([]map[string]any)[0]["policy"] = map[string]any{} })), turnSubj, "policy"},
		{"approved on another queue", build(events.TypeCallApproved, approvedSubj, "r1",
			approved(func(m map[string]any) { m["queue"] = "gpu" })), approvedSubj, "queue"},
		{"approved without a queue", build(events.TypeCallApproved, "toolwire.call.r1."+callA+".approved", "r1",
			approved(func(m map[string]any) { delete(m, "queue") })), "toolwire.call.r1." + callA + ".approved", "queue"},
		{"approved call of another call", build(events.TypeCallApproved, approvedSubj, "r1",
			approved(func(m map[string]any) { m["call_id"] = strings.Repeat("b", 64) })), approvedSubj, "belongs to call"},
		{"approved call of v1 (a policy and enabled tools)", build(events.TypeCallApproved, approvedSubj, "r1",
			approved(func(m map[string]any) { m["enabled_tools"] = []string{"echo@1.0.0"} })), approvedSubj, "enabled_tools"},
		{"a turn on a started event", build(events.TypeRunStarted, subj("started"), "r1",
			map[string]any{"run_id": "r1", "status": "started", "turn": turn(func(m map[string]any) { delete(m, "calls") })}), subj("started"), "only the end of a run"},
		{"a completed run ended by a denied turn", build(events.TypeRunCompleted, subj("completed"), "r1",
			completed(func(m map[string]any) {
				m["turn"] = turn(func(m map[string]any) {
					delete(m, "calls")
					delete(m, "response")
					m["verdict"] = map[string]any{"allowed": false, "code": "POLICY_DENIED"}
				})
			})), subj("completed"), "denied"},
		{"an end carrying another run's turn", build(events.TypeRunFailed, subj("failed"), "r1",
			map[string]any{"run_id": "r1", "status": "failed", "turn": turn(func(m map[string]any) { m["run_id"] = "r2" })}), subj("failed"), "r2"},
		{"an end carrying a turn 0", build(events.TypeRunFailed, subj("failed"), "r1",
			map[string]any{"run_id": "r1", "status": "failed", "turn": turn(func(m map[string]any) { m["iteration"] = 0 })}), subj("failed"), "iteration 0"},
		{"outputs blob beside outputs", build(events.TypeRunCompleted, subj("completed"), "r1",
			completed(func(m map[string]any) { m["outputs"] = map[string]any{"response": "hi"} })), subj("completed"), "outputs_blob"},
		{"outputs blob that is no blob", build(events.TypeRunCompleted, subj("completed"), "r1",
			completed(func(m map[string]any) { m["outputs_blob"] = map[string]any{"kind": "image", "url": "/v1/blobs/x"} })), subj("completed"), "kind"},
		{"outputs blob elsewhere", build(events.TypeRunCompleted, subj("completed"), "r1",
			completed(func(m map[string]any) { m["outputs_blob"] = map[string]any{"kind": "blob", "url": "https://x/y"} })), subj("completed"), "/v1/blobs/"},
		{"outputs blob with an unsafe name", build(events.TypeRunCompleted, subj("completed"), "r1",
			completed(func(m map[string]any) { m["outputs_blob"] = map[string]any{"kind": "blob", "url": "/v1/blobs/../x"} })), subj("completed"), "blob name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := store.RecordOf(c.ev, c.subject)
			if !errors.Is(err, store.ErrUndecodable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("RecordOf = %v; want ErrUndecodable mentioning %q", err, c.want)
			}
		})
	}
	// The well-formed versions of the events above are recorded.
	for _, ok := range []struct {
		ev      *event.Event
		subject string
	}{
		{build(events.TypeTurnCompleted, turnSubj, "r1", turn(func(map[string]any) {})), turnSubj},
		{build(events.TypeCallApproved, approvedSubj, "r1", approved(func(map[string]any) {})), approvedSubj},
		{build(events.TypeRunCompleted, subj("completed"), "r1", completed(func(map[string]any) {})), subj("completed")},
		{build(events.TypeRunCompleted, subj("completed"), "r1", completed(func(m map[string]any) {
			m["turn"] = turn(func(m map[string]any) { delete(m, "calls") })
		})), subj("completed")},
	} {
		if _, err := store.RecordOf(ok.ev, ok.subject); err != nil {
			t.Errorf("RecordOf(%s) = %v; want it recorded", ok.ev.Type(), err)
		}
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
	if rec.Run != nil || rec.Calls != nil || rec.Turn != nil || rec.Verdict != nil {
		t.Fatalf("unknown type materialized: %+v", rec)
	}
	if rec.Event.RunID != "r1" || rec.Event.Time.IsZero() || string(rec.Event.Data) != `{"a":1}` {
		t.Fatalf("event row = %+v", rec.Event)
	}
}

func compact(t *testing.T, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

package recorder_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/api/apitest"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// harness is a recorder on an embedded JetStream and a fresh Postgres schema,
// with its API on a test server.
type harness struct {
	t    *testing.T
	env  *eventstest.Env
	dsn  string
	pool *pgxpool.Pool
	pub  *publish.Publisher
	rec  *recorder.Service
	api  *httptest.Server
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, env: eventstest.Start(t), dsn: pgtest.Schema(t)}
	pool, err := pgxpool.New(testCtx(t), h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h.pool = pool
	h.pub = publish.NewPublisher(h.env.JS)
	h.start()
	return h
}

// start starts a recorder (another one after stop) and points the API at it.
func (h *harness) start() {
	h.t.Helper()
	rec, err := recorder.New(service.Deps{JS: h.env.JetStream(h.t), Log: quietLog()},
		recorder.Config{DatabaseURL: h.dsn, Batch: 64, StreamWait: 2 * time.Second})
	if err != nil {
		h.t.Fatal(err)
	}
	startUntilCleanup(h.t, rec)
	h.rec = rec
	if h.api == nil {
		h.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.rec.Handler().ServeHTTP(w, r)
		}))
		h.t.Cleanup(h.api.Close)
	}
}

// startUntilCleanup starts rec (start) and stops it when the test ends.
func startUntilCleanup(t *testing.T, rec *recorder.Service) {
	t.Helper()
	start(t, rec)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rec.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
}

// start starts rec with a start context that ends right after Start, as
// every test of the package does: the consumers, the writer and the registry
// watch hang off the recorder's lifetime, never off the start-up context, so
// every event a test publishes afterwards is still recorded.
func start(t *testing.T, rec *recorder.Service) {
	t.Helper()
	ctx, endStart := context.WithCancel(testCtx(t))
	defer endStart()
	if err := rec.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) stop() {
	h.t.Helper()
	if err := h.rec.Stop(testCtx(h.t)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) publish(outs ...events.Outgoing) {
	h.t.Helper()
	for _, o := range outs {
		if err := h.pub.Publish(testCtx(h.t), o); err != nil {
			h.t.Fatal(err)
		}
	}
}

// republish publishes events again under new message ids, as a producer
// retrying after JetStream's duplicate window would: the recorder sees them
// all a second time.
func (h *harness) republish(outs ...events.Outgoing) {
	h.t.Helper()
	for _, o := range outs {
		m, err := events.Encode(o.Subject, &o.Event)
		if err != nil {
			h.t.Fatal(err)
		}
		m.Header.Set(events.HeaderMsgID, o.Event.ID()+"/again")
		if _, err := h.env.JS.PublishMsg(testCtx(h.t), m); err != nil {
			h.t.Fatal(err)
		}
	}
}

// waitIdle waits until every consumer has every message of its stream
// handled and acknowledged (or dead-lettered).
func (h *harness) waitIdle() {
	h.t.Helper()
	eventually(h.t, "the recorder's consumers to catch up", func() (bool, string) {
		for _, spec := range recorder.ConsumerSpecs() {
			c, err := h.env.JS.Consumer(testCtx(h.t), spec.Stream, spec.Durable)
			if err != nil {
				return false, err.Error()
			}
			info, err := c.Info(testCtx(h.t))
			if err != nil {
				return false, err.Error()
			}
			if info.NumPending > 0 || info.NumAckPending > 0 {
				return false, fmt.Sprintf("%s: %d pending, %d unacknowledged", spec.Durable, info.NumPending, info.NumAckPending)
			}
		}
		return true, ""
	})
}

// noDeadLetters asserts that the recorder dead-lettered nothing.
func (h *harness) noDeadLetters() {
	h.t.Helper()
	dlq, err := h.env.JS.Stream(testCtx(h.t), events.StreamDLQ)
	if err != nil {
		h.t.Fatal(err)
	}
	info, err := dlq.Info(testCtx(h.t))
	if err != nil {
		h.t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		h.t.Fatalf("%d events were dead-lettered", info.State.Msgs)
	}
}

// get fetches path from the API and returns its status and body; every
// response must be JSON.
func (h *harness) get(path string) (int, []byte) {
	h.t.Helper()
	return h.do(http.MethodGet, path)
}

func (h *harness) do(method, path string) (int, []byte) {
	h.t.Helper()
	req, err := http.NewRequestWithContext(testCtx(h.t), method, h.api.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		h.t.Fatalf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	if !json.Valid(body) {
		h.t.Fatalf("%s %s: body is not JSON: %s", method, path, body)
	}
	if method == http.MethodGet {
		apitest.CheckResponse(h.t, req, resp.StatusCode, resp.Header, body)
	}
	return resp.StatusCode, body
}

func (h *harness) getRun(runID string) apitypes.RunDetailJSON {
	h.t.Helper()
	status, body := h.get("/v1/runs/" + runID)
	if status != http.StatusOK {
		h.t.Fatalf("GET run %s: %d %s", runID, status, body)
	}
	var run apitypes.RunDetailJSON
	if err := json.Unmarshal(body, &run); err != nil {
		h.t.Fatal(err)
	}
	return run
}

// waitRun polls the API until the run has status and wantCalls completed
// tool calls.
func (h *harness) waitRun(runID, status string, wantCalls int) apitypes.RunDetailJSON {
	h.t.Helper()
	var run apitypes.RunDetailJSON
	eventually(h.t, "run "+runID+" to be "+status, func() (bool, string) {
		code, body := h.get("/v1/runs/" + runID)
		if code != http.StatusOK {
			return false, fmt.Sprintf("%d %s", code, body)
		}
		run = apitypes.RunDetailJSON{}
		if err := json.Unmarshal(body, &run); err != nil {
			h.t.Fatal(err)
		}
		done := 0
		for _, c := range run.ToolCalls {
			if c.Status == store.CallCompleted {
				done++
			}
		}
		return run.Status == status && done == wantCalls, string(body)
	})
	return run
}

// counts returns the rows of every table.
func (h *harness) counts() map[string]int {
	h.t.Helper()
	out := map[string]int{}
	for _, table := range []string{"events", "runs", "tool_calls", "model_turns", "verdicts"} {
		var n int
		if err := h.pool.QueryRow(testCtx(h.t), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			h.t.Fatal(err)
		}
		out[table] = n
	}
	return out
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %s", what, last)
		}
		<-tick.C
	}
}

// checkRunJSON asserts every field GET /v1/runs/{run_id} shows for fx.
func checkRunJSON(t *testing.T, got apitypes.RunDetailJSON, fx *storetest.Run) {
	t.Helper()
	first, last := fx.Events[0].Event.Time(), fx.Events[len(fx.Events)-1].Event.Time()
	want := apitypes.RunJSON{
		RunID: fx.RunID, Tenant: fx.Tenant, Agent: fx.Agent, Status: fx.Status(), Reason: fx.Reason,
		TraceID: fx.Trace.TraceID(), Counts: apitypes.CountsJSON{Iterations: fx.Iterations, ToolCalls: len(fx.Envelopes)},
		Spend: &fx.Spend, CreatedAt: first, UpdatedAt: last, CompletedAt: &last,
	}
	g := got.RunJSON
	if g.CompletedAt == nil || !g.CompletedAt.Equal(last) || !g.CreatedAt.Equal(first) || !g.UpdatedAt.Equal(last) {
		t.Errorf("times: created %v updated %v completed %v; want %v %v %v", g.CreatedAt, g.UpdatedAt, g.CompletedAt, first, last, last)
	}
	g.CreatedAt, g.UpdatedAt, g.CompletedAt = want.CreatedAt, want.UpdatedAt, want.CompletedAt
	if !reflect.DeepEqual(g, want) {
		t.Errorf("run = %+v\nwant  %+v", g, want)
	}
	if !jsonEq(got.Request, mustMarshal(t, fx.Request)) {
		t.Errorf("request = %s", got.Request)
	}
	if len(got.ToolCalls) != len(fx.Envelopes) {
		t.Fatalf("tool_calls = %d, want %d", len(got.ToolCalls), len(fx.Envelopes))
	}
	for i, c := range got.ToolCalls {
		env := fx.Envelopes[i]
		seq, iter, lat, cost := i+1, 1, env.Latency().Milliseconds(), env.Cost
		tStart, tEnd := env.TStart, env.TEnd
		want := apitypes.ToolCallJSON{CallID: env.CallID, Seq: &seq, Iteration: &iter, Name: env.Name,
			Version: env.Version, Status: store.CallCompleted, TStart: &tStart, TEnd: &tEnd, LatencyMS: &lat,
			Cached: env.Cached, Truncated: env.Truncated, Queue: &fx.Queues[i], Cost: &cost}
		if env.Error != nil {
			code := string(env.Error.Code)
			want.ErrorCode = &code
		}
		if c.TStart != nil && c.TStart.Equal(tStart) {
			c.TStart = &tStart
		}
		if c.TEnd != nil && c.TEnd.Equal(tEnd) {
			c.TEnd = &tEnd
		}
		if !reflect.DeepEqual(c, want) {
			t.Errorf("tool_calls[%d] = %s\nwant %s", i, mustMarshal(t, c), mustMarshal(t, want))
		}
	}
}

// completedOutputs is the outputs JSON exactly as the completed event carried it.
func completedOutputs(t *testing.T, fx *storetest.Run) json.RawMessage {
	t.Helper()
	var raw struct {
		Outputs json.RawMessage `json:"outputs"`
	}
	if err := json.Unmarshal(fx.Event(t, events.TypeRunCompleted, "").Event.Data(), &raw); err != nil {
		t.Fatal(err)
	}
	return raw.Outputs
}

func TestRecorderEndToEnd(t *testing.T) {
	h := newHarness(t)
	fx := storetest.CompletedRun(t, "e2e-run", "weather", storetest.TenantA, time.Now())
	h.publish(fx.Events...)

	run := h.waitRun(fx.RunID, events.StatusCompleted, 2)
	h.waitIdle()
	checkRunJSON(t, h.getRun(fx.RunID), fx)
	if run.Pinned == nil {
		t.Error("pinned handles missing")
	}

	// Outputs: the AgentOutputs of the completed event.
	status, body := h.get("/v1/runs/" + fx.RunID + "/outputs")
	if status != http.StatusOK || !jsonEq(body, completedOutputs(t, fx)) {
		t.Fatalf("outputs: %d %s\nwant %s", status, body, completedOutputs(t, fx))
	}
	var outputs envelope.AgentOutputs
	if err := json.Unmarshal(body, &outputs); err != nil {
		t.Fatal(err)
	}
	if outputs.Response != fx.Outputs.Response || len(outputs.ToolOrder) != 2 || outputs.LastTool == nil ||
		outputs.LastTool.CallID != fx.Envelopes[0].CallID {
		t.Fatalf("outputs = %+v", outputs)
	}

	// Envelopes, in call order.
	status, body = h.get("/v1/runs/" + fx.RunID + "/envelopes")
	wantEnvs := mustMarshal(t, map[string]any{"run_id": fx.RunID, "envelopes": fx.Envelopes})
	if status != http.StatusOK || !jsonEq(body, wantEnvs) {
		t.Fatalf("envelopes: %d %s\nwant %s", status, body, wantEnvs)
	}

	// The list, with every filter.
	for _, q := range []string{"", "?status=completed", "?agent=weather", "?org_id=org-a", "?status=completed&agent=weather&org_id=org-a&limit=1"} {
		status, body = h.get("/v1/runs" + q)
		var list apitypes.RunListJSON
		if err := json.Unmarshal(body, &list); err != nil || status != http.StatusOK {
			t.Fatalf("list %q: %d %s", q, status, body)
		}
		if len(list.Runs) != 1 || list.Runs[0].RunID != fx.RunID || list.Runs[0].Status != events.StatusCompleted ||
			list.Runs[0].Counts != (apitypes.CountsJSON{Iterations: 2, ToolCalls: 2}) {
			t.Fatalf("list %q = %s", q, body)
		}
	}
	for _, q := range []string{"?status=failed", "?agent=other", "?org_id=org-b"} {
		if status, body = h.get("/v1/runs" + q); status != http.StatusOK || !jsonEq(body, []byte(`{"runs":[]}`)) {
			t.Fatalf("list %q: %d %s, want no runs", q, status, body)
		}
	}

	wantCounts := map[string]int{"events": len(fx.Events), "runs": 1, "tool_calls": 2, "model_turns": 2, "verdicts": 2}
	if got := h.counts(); !reflect.DeepEqual(got, wantCounts) {
		t.Fatalf("rows = %v, want %v", got, wantCounts)
	}
	snapshot := func() map[string]string {
		out := map[string]string{}
		for _, p := range []string{"", "/outputs", "/envelopes"} {
			_, b := h.get("/v1/runs/" + fx.RunID + p)
			out[p] = string(b)
		}
		return out
	}
	before := snapshot()

	t.Run("RedeliveredEventsChangeNothing", func(t *testing.T) {
		h.republish(fx.Events...)
		h.waitIdle()
		if got := h.counts(); !reflect.DeepEqual(got, wantCounts) {
			t.Fatalf("after redelivery rows = %v, want %v", got, wantCounts)
		}
		if after := snapshot(); !reflect.DeepEqual(before, after) {
			t.Fatalf("after redelivery the API shows\n%v\nwant\n%v", after, before)
		}
		h.noDeadLetters()
	})

	t.Run("ReplayFromTheStreamsChangesNothing", func(t *testing.T) {
		// A new recorder on new consumers reads both streams from the start.
		h.stop()
		for _, spec := range recorder.ConsumerSpecs() {
			if err := h.env.JS.DeleteConsumer(testCtx(t), spec.Stream, spec.Durable); err != nil {
				t.Fatal(err)
			}
		}
		h.start()
		h.waitIdle()
		if got := h.counts(); !reflect.DeepEqual(got, wantCounts) {
			t.Fatalf("after replay rows = %v, want %v", got, wantCounts)
		}
		if after := snapshot(); !reflect.DeepEqual(before, after) {
			t.Fatalf("after replay the API shows\n%v\nwant\n%v", after, before)
		}
		h.noDeadLetters()
	})
}

func TestRecorderFailedRun(t *testing.T) {
	h := newHarness(t)
	fx := storetest.FailedRun(t, "e2e-failed", "weather", storetest.TenantB, time.Now(), "max_iterations reached")
	h.publish(fx.Events...)
	h.waitRun(fx.RunID, events.StatusFailed, 0)
	h.waitIdle()
	checkRunJSON(t, h.getRun(fx.RunID), fx)

	status, body := h.get("/v1/runs/" + fx.RunID + "/outputs")
	e := decodeError(t, body)
	if status != http.StatusConflict || e.Code != apitypes.CodeRunFailed || !strings.Contains(e.Message, "max_iterations reached") {
		t.Fatalf("outputs of a failed run: %d %s; want 409 run_failed with its reason", status, body)
	}
	if status, body = h.get("/v1/runs/" + fx.RunID + "/envelopes"); status != http.StatusOK ||
		!jsonEq(body, mustMarshal(t, map[string]any{"run_id": fx.RunID, "envelopes": []any{}})) {
		t.Fatalf("envelopes of a run without calls: %d %s", status, body)
	}
}

// TestRecorderOutOfOrder delivers the end of a run before its beginning: the
// completion before the start, a call's envelope before its request. The
// result is the same as in order.
func TestRecorderOutOfOrder(t *testing.T) {
	h := newHarness(t)
	fx := storetest.CompletedRun(t, "e2e-ooo", "weather", storetest.TenantA, time.Now())
	completed := fx.Event(t, events.TypeRunCompleted, "")
	envA := fx.Envelopes[0]
	callDone := fx.Event(t, events.TypeCallCompleted, envA.CallID)

	h.publish(completed, callDone)
	h.waitIdle()
	// The run is not recorded before its request (its events wait for it).
	if status, body := h.get("/v1/runs/" + fx.RunID); status != http.StatusNotFound {
		t.Fatalf("after the completions alone: %d %s; want 404", status, body)
	}

	var rest []events.Outgoing
	for _, o := range fx.Events {
		if o.Event.ID() != completed.Event.ID() && o.Event.ID() != callDone.Event.ID() {
			rest = append(rest, o)
		}
	}
	h.publish(rest...)
	h.waitIdle()
	checkRunJSON(t, h.getRun(fx.RunID), fx)
	if status, body := h.get("/v1/runs/" + fx.RunID + "/outputs"); status != http.StatusOK || !jsonEq(body, completedOutputs(t, fx)) {
		t.Fatalf("outputs: %d %s", status, body)
	}
	h.noDeadLetters()
}

// TestRecorderKeysEventsPerRun (issue 29): a tenant's run whose events
// carry the ids of another tenant's run to come (event ids are
// deterministic, and the streams dedupe on the Nats-Msg-Id, which a
// publisher sets apart from the id) suppresses none of the other run's
// events in the recorder: its request, its turns, its envelopes.
func TestRecorderKeysEventsPerRun(t *testing.T) {
	h := newHarness(t)
	now := time.Now()
	victim := storetest.CompletedRun(t, "e2e-victim", "weather", storetest.TenantB, now)
	squatter := storetest.CompletedRun(t, "e2e-squatter", "weather", storetest.TenantA, now)
	for i := range squatter.Events {
		o := &squatter.Events[i]
		o.Event.SetID(victim.Events[i].Event.ID())
		o.MsgID = "squat/" + strconv.Itoa(i)
	}
	h.publish(squatter.Events...)
	h.waitIdle()
	h.publish(victim.Events...)
	h.waitIdle()
	checkRunJSON(t, h.getRun(victim.RunID), victim)
	checkRunJSON(t, h.getRun(squatter.RunID), squatter)
	for _, fx := range []*storetest.Run{victim, squatter} {
		status, body := h.get("/v1/runs/" + fx.RunID + "/envelopes")
		var got apitypes.EnvelopesJSON
		if status != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Envelopes) != len(fx.Envelopes) {
			t.Fatalf("%s's envelopes: %d %s; want its %d", fx.RunID, status, body, len(fx.Envelopes))
		}
		status, body = h.get("/v1/runs/" + fx.RunID + "/events")
		var evs apitypes.EventsJSON
		if status != http.StatusOK || json.Unmarshal(body, &evs) != nil || len(evs.Events) != len(fx.Events) {
			t.Fatalf("%s's events: %d %s; want its %d", fx.RunID, status, body, len(fx.Events))
		}
	}
	h.noDeadLetters()
}

func TestRecorderAPIErrors(t *testing.T) {
	h := newHarness(t)
	fx := storetest.StartedRun(t, "e2e-started", "weather", storetest.TenantA, time.Now())
	h.publish(fx.Events...)
	h.waitRun(fx.RunID, events.StatusStarted, 0)

	cases := []struct {
		method, path string
		status       int
		code         string
		message      string // a part of the message
	}{
		{"GET", "/v1/runs/no-such-run", 404, apitypes.CodeRunNotFound, `"no-such-run"`},
		{"GET", "/v1/runs/no-such-run/outputs", 404, apitypes.CodeRunNotFound, ""},
		{"GET", "/v1/runs/no-such-run/envelopes", 404, apitypes.CodeRunNotFound, ""},
		{"GET", "/v1/runs/bad%20id", 400, apitypes.CodeInvalidRunID, `run_id "bad id" is not a run id`},
		{"GET", "/v1/runs/" + strings.Repeat("x", 65) + "/outputs", 400, apitypes.CodeInvalidRunID, "1 to 64"},
		{"GET", "/v1/runs/a.b/envelopes", 400, apitypes.CodeInvalidRunID, "run_id"},
		{"GET", "/v1/runs/e2e-started/outputs", 409, apitypes.CodeRunNotCompleted, "is started"},
		{"GET", "/v1/runs?status=bogus", 400, apitypes.CodeInvalidParameter, "status"},
		{"GET", "/v1/runs?limit=0", 400, apitypes.CodeInvalidParameter, "limit"},
		{"GET", "/v1/runs?limit=many", 400, apitypes.CodeInvalidParameter, "limit"},
		{"DELETE", "/v1/runs", 405, apitypes.CodeMethodNotAllowed, "GET, HEAD, POST"},
		{"GET", "/v1/runs/e2e-started/cancel", 405, apitypes.CodeMethodNotAllowed, "POST"},
		{"POST", "/v1/runs", 415, apitypes.CodeUnsupportedMediaType, "application/json"},
		{"DELETE", "/v1/runs/e2e-started", 405, apitypes.CodeMethodNotAllowed, ""},
		{"GET", "/v1/nothing", 404, apitypes.CodeNotFound, ""},
	}
	for _, c := range cases {
		status, body := h.do(c.method, c.path)
		e := decodeError(t, body)
		if status != c.status || e.Code != c.code || e.Message == "" || !strings.Contains(e.Message, c.message) {
			t.Errorf("%s %s = %d %s; want %d %s mentioning %q", c.method, c.path, status, body, c.status, c.code, c.message)
		}
	}
	// limit above the maximum is clamped, not refused.
	if status, body := h.get("/v1/runs?limit=100000"); status != http.StatusOK {
		t.Errorf("limit=100000: %d %s", status, body)
	}
}

// TestRecorderDeadLettersUndecodableEvents: an event whose data does not
// decode goes to the dead-letter stream at once and is not recorded; an event
// of an unknown type is kept in the events table only.
func TestRecorderDeadLettersUndecodableEvents(t *testing.T) {
	h := newHarness(t)
	subj, err := events.RunSubject("e2e-poison", "started")
	if err != nil {
		t.Fatal(err)
	}
	poison, err := events.Build(events.TypeRunStarted, "e2e-poison/started", subj,
		events.Attrs{Source: storetest.Source, RunID: "e2e-poison"}, map[string]any{"run_id": "e2e-poison", "bogus": 1})
	if err != nil {
		t.Fatal(err)
	}
	callID := "abc123"
	usubj, err := events.CallSubject("e2e-unknown", callID, "escalated")
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := events.Build("dev.toolwire.call.escalated.v1", "e2e-unknown/"+callID+"/escalated",
		usubj, events.Attrs{Source: storetest.Source, RunID: "e2e-unknown", CallID: callID},
		map[string]any{"run_id": "e2e-unknown", "call_id": callID})
	if err != nil {
		t.Fatal(err)
	}
	h.publish(poison, unknown)
	h.waitIdle()

	dlq, err := h.env.JS.Stream(testCtx(t), events.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := dlq.GetLastMsgForSubject(testCtx(t), consume.DLQSubject(events.StreamRuns, recorder.DurableRuns))
	if err != nil {
		t.Fatalf("no dead letter: %v", err)
	}
	if got := msg.Header.Get(consume.HeaderDLQDeliveries); got != "1" {
		t.Errorf("dead-lettered after %s deliveries, want 1 (permanent)", got)
	}
	if got := msg.Header.Get(consume.HeaderDLQError); !strings.Contains(got, "bogus") {
		t.Errorf("dead-letter error %q does not say what is wrong", got)
	}
	var n int
	if err := h.pool.QueryRow(testCtx(t), `SELECT count(*) FROM events WHERE run_id = 'e2e-poison'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("poison event recorded: %d %v", n, err)
	}
	var typ string
	if err := h.pool.QueryRow(testCtx(t), `SELECT type FROM events WHERE run_id = 'e2e-unknown'`).Scan(&typ); err != nil {
		t.Fatalf("unknown event not recorded: %v", err)
	}
	if status, _ := h.get("/v1/runs/e2e-unknown"); status != http.StatusNotFound {
		t.Fatalf("an unknown-type event made a run: %d", status)
	}
}

func decodeError(t *testing.T, body []byte) apitypes.ErrorBody {
	t.Helper()
	var e apitypes.ErrorJSON
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	return e.Error
}

func mustMarshal(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonEq(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// A second Start is refused; the running recorder goes on.
func TestRecorderStartsOnce(t *testing.T) {
	h := newHarness(t)
	if err := h.rec.Start(testCtx(t)); !errors.Is(err, service.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v, want service.ErrAlreadyStarted", err)
	}
	fx := storetest.StartedRun(t, "started-once", "weather", storetest.TenantA, time.Now())
	h.publish(fx.Events...)
	h.waitRun(fx.RunID, events.StatusStarted, 0)
}

func TestRecorderStopWithoutStart(t *testing.T) {
	env := eventstest.Start(t)
	rec, err := recorder.New(service.Deps{JS: env.JS, Log: quietLog()},
		recorder.Config{DatabaseURL: "postgres://nobody@127.0.0.1:1/none"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rec.Stop(ctx); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := rec.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := rec.Start(ctx); !errors.Is(err, service.ErrStopped) {
		t.Fatalf("Start after Stop: %v, want service.ErrStopped", err)
	}
}

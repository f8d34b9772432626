package recorder_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/api/apitest"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// writesEnv is a recorder with authentication on, on an embedded JetStream
// and SQLite, and tokens of every role for tenants A and B. No orchestrator
// runs: what is submitted stays on the runs stream (the end-to-end tests of
// e2e/stack run it).
type writesEnv struct {
	t     *testing.T
	env   *eventstest.Env
	srv   *httptest.Server
	admin string
	tok   map[string]string // producer A, viewer A, approver A, producer B, approver B
}

const writesAdminToken = "writes-admin-token"

func newWritesEnv(t *testing.T, opts ...func(*recorder.Config)) *writesEnv {
	t.Helper()
	env := eventstest.Start(t)
	db := sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))
	cfg := recorder.Config{DatabaseURL: db, AuthRequired: true, AdminToken: writesAdminToken, StreamWait: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	rec, err := recorder.New(service.Deps{JS: env.JetStream(t), Log: quietLog()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, rec)
	w := &writesEnv{t: t, env: env, srv: httptest.NewServer(rec.Handler()), admin: writesAdminToken, tok: map[string]string{}}
	t.Cleanup(w.srv.Close)
	tokens, closeTokens, err := recorder.OpenTokens(testCtx(t), db, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer closeTokens()
	for name, spec := range map[string]auth.TokenSpec{
		"producer A": {OrgID: storetest.TenantA.OrgID, WorkspaceID: storetest.TenantA.WorkspaceID, Role: auth.RoleProducer},
		"viewer A":   {OrgID: storetest.TenantA.OrgID, Role: auth.RoleViewer},
		"approver A": {OrgID: storetest.TenantA.OrgID, Role: auth.RoleApprover},
		"producer B": {OrgID: storetest.TenantB.OrgID, WorkspaceID: storetest.TenantB.WorkspaceID, Role: auth.RoleProducer},
		"approver B": {OrgID: storetest.TenantB.OrgID, Role: auth.RoleApprover},
	} {
		spec.Name = name
		tok, row, err := auth.NewToken(spec, time.Now())
		if err == nil {
			err = tokens.CreateToken(testCtx(t), row)
		}
		if err != nil {
			t.Fatal(err)
		}
		w.tok[name] = tok
	}
	return w
}

// post sends body (JSON unless contentType says otherwise) as who, checks
// a JSON answer against openapi.yaml, and returns the status and body.
func (w *writesEnv) post(who, path, contentType string, body []byte) (int, http.Header, []byte) {
	w.t.Helper()
	req, err := http.NewRequestWithContext(testCtx(w.t), http.MethodPost, w.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	tok := w.tok[who]
	if who == "admin" {
		tok = w.admin
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") == "application/json" {
		check, _ := http.NewRequestWithContext(testCtx(w.t), http.MethodPost, w.srv.URL+path, nil)
		apitest.CheckResponse(w.t, check, resp.StatusCode, resp.Header, b)
	}
	return resp.StatusCode, resp.Header, b
}

// count is how many messages stream holds on subject.
func (w *writesEnv) count(stream, subject string) uint64 {
	w.t.Helper()
	s, err := w.env.JS.Stream(testCtx(w.t), stream)
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := s.Info(testCtx(w.t), jetstream.WithSubjectFilter(subject))
	if err != nil {
		w.t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// requestBody is a valid run request of run id for tenant A, as JSON, with
// its tenant left out when withTenant is false.
func requestBody(t *testing.T, runID string, withTenant bool) []byte {
	t.Helper()
	req := storetest.StartedRun(t, runID, "weather", storetest.TenantA, time.Now()).Request
	req.Tenant.UserID = ""
	b := mustMarshal(t, req)
	if withTenant {
		return b
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	delete(doc, "tenant")
	return mustMarshal(t, doc)
}

func withField(t *testing.T, body []byte, key string, v any) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	doc[key] = v
	return mustMarshal(t, doc)
}

// TestSubmitRefusesBadInput: every kind of bad submission answers its 4xx
// JSON error (validated against openapi.yaml) and publishes nothing: the
// intake and the runs stream hold no message of the run afterwards.
func TestSubmitRefusesBadInput(t *testing.T) {
	w := newWritesEnv(t)
	const id = "bad-input"
	good := requestBody(t, id, false)
	huge := withField(t, good, "metadata", map[string]string{"pad": strings.Repeat("x", 1<<20)})
	noName := withField(t, good, "agent", map[string]any{"model": map[string]any{"provider": "scripted"}})
	typed := withField(t, good, "messages", "hello")
	badID := withField(t, good, "run_id", "not a run id!")
	otherTenant := withField(t, good, "tenant", storetest.TenantB)
	for _, tc := range []struct {
		name, who, contentType string
		body                   []byte
		status                 int
		code                   string
		details                bool
	}{
		{"over 1 MiB", "producer A", "application/json", huge, http.StatusRequestEntityTooLarge, apitypes.CodePayloadTooLarge, false},
		{"not JSON's content type", "producer A", "text/plain", good, http.StatusUnsupportedMediaType, apitypes.CodeUnsupportedMediaType, false},
		{"no content type", "producer A", "", good, http.StatusUnsupportedMediaType, apitypes.CodeUnsupportedMediaType, false},
		{"not JSON", "producer A", "application/json", []byte(`{"run_id": "bad-input",`), http.StatusBadRequest, apitypes.CodeInvalidJSON, false},
		{"two values", "producer A", "application/json", append(append([]byte{}, good...), good...), http.StatusBadRequest, apitypes.CodeInvalidJSON, false},
		{"an unknown field", "producer A", "application/json", withField(t, good, "priority", 3), http.StatusBadRequest, apitypes.CodeUnknownField, false},
		{"a schema error", "producer A", "application/json", noName, http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest, true},
		{"a wrong type", "producer A", "application/json", typed, http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest, true},
		{"a bad run id", "producer A", "application/json", badID, http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest, true},
		{"an array", "producer A", "application/json", []byte(`[1,2]`), http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest, true},
		{"another tenant", "producer A", "application/json", otherTenant, http.StatusForbidden, apitypes.CodeTenantMismatch, false},
		{"another tenant's producer", "producer B", "application/json", requestBody(t, id, true), http.StatusForbidden, apitypes.CodeTenantMismatch, false},
		{"a viewer", "viewer A", "application/json", good, http.StatusForbidden, apitypes.CodeForbidden, false},
		{"every tenant, none named", "admin", "application/json", good, http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest, true},
	} {
		status, _, body := w.post(tc.who, "/v1/runs", tc.contentType, tc.body)
		e := decodeError(t, body)
		if status != tc.status || e.Code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, body, tc.status, tc.code)
			continue
		}
		if tc.details != (len(e.Details) > 0) {
			t.Errorf("%s: details %q", tc.name, e.Details)
		}
		t.Logf("%s: %d %s %s %q", tc.name, status, e.Code, e.Message, e.Details)
	}
	// Every problem is listed: a request without agent.name and with a bad
	// run id has both.
	status, _, body := w.post("producer A", "/v1/runs", "application/json", withField(t, noName, "run_id", "bad id"))
	if e := decodeError(t, body); status != http.StatusUnprocessableEntity || len(e.Details) < 2 {
		t.Errorf("two problems: %d %s", status, body)
	}
	if n := w.count(events.StreamIntake, events.SubjectsIntake); n != 0 {
		t.Errorf("the intake holds %d messages after refused submissions", n)
	}
	for _, run := range []string{id, "not a run id!", "bad id"} {
		subj := events.Prefix + ".run." + run + ".>"
		if strings.ContainsAny(run, " !") {
			continue // no subject can name it
		}
		if n := w.count(events.StreamRuns, subj); n != 0 {
			t.Errorf("the runs stream holds %d messages of %s", n, run)
		}
	}
}

// TestSubmitIdempotency: a run id whose request is stored answers the same
// request (200, created false) and refuses another (409 run_id_in_use), as
// it does for another tenant's producer under the same run id; neither
// stores anything. A new request is stored on the runs stream, once, as
// client.Submit stores it (the run's request id, on the condition that the
// subject holds none), with the tenant the credential gave: 201, then 200
// for the same request again; the intake is not used.
func TestSubmitIdempotency(t *testing.T) {
	w := newWritesEnv(t)
	fx := storetest.StartedRun(t, "stored-run", "weather", storetest.TenantA, time.Now())
	fx.Request.Tenant.UserID = ""
	out, err := events.NewRunRequested("/toolwire/test", fx.Request, events.RunTrace{})
	if err != nil {
		t.Fatal(err)
	}
	w.env.Publish(t, out)

	// The same request, key order and spelling aside (the tenant left out:
	// the credential's is the same), answers the stored run.
	same := requestBody(t, "stored-run", false)
	var sameDoc map[string]any
	_ = json.Unmarshal(same, &sameDoc)
	sameDoc["run_id"] = "stored-run"
	status, _, body := w.post("producer A", "/v1/runs", "application/json; charset=utf-8", mustMarshal(t, sameDoc))
	if got := decode[apitypes.SubmitJSON](t, body); status != http.StatusOK || got.Created || got.RunID != "stored-run" {
		t.Fatalf("the same request: %d %s; want 200 created false", status, body)
	}
	// Another request under the run id: 409.
	other := withField(t, same, "metadata", map[string]string{"attempt": "2"})
	status, _, body = w.post("producer A", "/v1/runs", "application/json", other)
	if status != http.StatusConflict || decodeError(t, body).Code != apitypes.CodeRunIDInUse {
		t.Fatalf("another request under the run id: %d %s; want 409 run_id_in_use", status, body)
	}
	// Another tenant's producer under the run id: 409, saying nothing of A's.
	status, _, body = w.post("producer B", "/v1/runs", "application/json", same)
	if status != http.StatusConflict || decodeError(t, body).Code != apitypes.CodeRunIDInUse || bytes.Contains(body, []byte("org-a")) {
		t.Fatalf("another tenant's run id: %d %s; want 409 run_id_in_use without A's tenant", status, body)
	}
	if n := w.count(events.StreamIntake, events.SubjectsIntake); n != 0 {
		t.Fatalf("the intake holds %d messages: a run id in use must not be handed in", n)
	}

	// A new run: stored on the runs stream as client.Submit stores it,
	// with the tenant the credential gave; 201, then 200 for it again.
	status, h, body := w.post("producer A", "/v1/runs", "application/json", requestBody(t, "new-run", false))
	if got := decode[apitypes.SubmitJSON](t, body); status != http.StatusCreated || !got.Created || h.Get("Location") != "/v1/runs/new-run" {
		t.Fatalf("a new run: %d %s (Location %q); want 201 created", status, body, h.Get("Location"))
	}
	status, _, body = w.post("producer A", "/v1/runs", "application/json", requestBody(t, "new-run", false))
	if got := decode[apitypes.SubmitJSON](t, body); status != http.StatusOK || got.Created {
		t.Fatalf("the new run again: %d %s; want 200 created false", status, body)
	}
	subj, err := events.RunSubject("new-run", events.VerbRequested)
	if err != nil {
		t.Fatal(err)
	}
	if n := w.count(events.StreamRuns, subj); n != 1 {
		t.Fatalf("the runs stream holds %d requests on %s, want 1", n, subj)
	}
	if n := w.count(events.StreamIntake, events.SubjectsIntake); n != 0 {
		t.Fatalf("the intake holds %d messages: HTTP submissions are stored on the runs stream", n)
	}
	runs, err := w.env.JS.Stream(testCtx(t), events.StreamRuns)
	if err != nil {
		t.Fatal(err)
	}
	m, err := runs.GetLastMsgForSubject(testCtx(t), subj)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err != nil {
		t.Fatal(err)
	}
	var req envelope.RunRequest
	if err := events.DecodeData(ev, &req); err != nil {
		t.Fatal(err)
	}
	if ev.Type() != events.TypeRunRequested || ev.ID() != events.RunRequestedID("new-run") ||
		req.Tenant.OrgID != storetest.TenantA.OrgID || req.Tenant.WorkspaceID != storetest.TenantA.WorkspaceID ||
		!publish.FirstOnSubject(m.Header) {
		t.Fatalf("stored: %s %s %+v, first on its subject %v", ev.Type(), ev.ID(), req.Tenant, publish.FirstOnSubject(m.Header))
	}
}

// TestCancelRoute: a producer (or approver) of the run's tenant cancels a
// run in progress: 202, and the run's cancel request on the runs stream,
// by the token's name, for the run's tenant; asking again is 202 and
// stores nothing more. A run that has ended answers its end (200). A viewer
// may not (403); another tenant's producer, or an unknown run, is 404.
func TestCancelRoute(t *testing.T) {
	w := newWritesEnv(t)
	started := storetest.StartedRun(t, "cancel-me", "weather", storetest.TenantA, time.Now())
	done := storetest.CompletedRun(t, "cancel-done", "weather", storetest.TenantA, time.Now())
	w.env.Publish(t, started.Events...)
	w.env.Publish(t, done.Events...)
	eventually(t, "both runs recorded", func() (bool, string) {
		s1, b1 := w.get("admin", "/v1/runs/cancel-me")
		s2, b2 := w.get("admin", "/v1/runs/cancel-done/outputs")
		return s1 == http.StatusOK && s2 == http.StatusOK, string(b1) + string(b2)
	})

	for _, tc := range []struct {
		who, run, contentType, body string
		status                      int
		code                        string
	}{
		{"viewer A", "cancel-me", "", "", http.StatusForbidden, apitypes.CodeForbidden},
		{"producer B", "cancel-me", "", "", http.StatusNotFound, apitypes.CodeRunNotFound},
		{"approver B", "cancel-me", "", "", http.StatusNotFound, apitypes.CodeRunNotFound},
		{"producer A", "never-was", "", "", http.StatusNotFound, apitypes.CodeRunNotFound},
		{"producer A", "cancel-me", "application/json", `{"why": "x"}`, http.StatusBadRequest, apitypes.CodeUnknownField},
		{"producer A", "cancel-me", "text/plain", `{"reason": "x"}`, http.StatusUnsupportedMediaType, apitypes.CodeUnsupportedMediaType},
		{"producer A", "cancel-me", "application/json", `{"reason": "` + strings.Repeat("r", 1001) + `"}`, http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest},
	} {
		status, _, body := w.post(tc.who, "/v1/runs/"+tc.run+"/cancel", tc.contentType, []byte(tc.body))
		if status != tc.status || decodeError(t, body).Code != tc.code {
			t.Errorf("cancel %s as %s (%s): %d %s, want %d %s", tc.run, tc.who, tc.body, status, body, tc.status, tc.code)
		}
	}
	subj := events.Prefix + ".run.cancel-me.cancel_requested"
	if n := w.count(events.StreamRuns, subj); n != 0 {
		t.Fatalf("%d cancel requests after refused ones", n)
	}

	for range 2 {
		status, _, body := w.post("producer A", "/v1/runs/cancel-me/cancel", "application/json", []byte(`{"reason": "not needed"}`))
		got := decode[apitypes.CancelJSON](t, body)
		if status != http.StatusAccepted || !got.Cancelled || got.Status != apitypes.StatusCancelling {
			t.Fatalf("cancel: %d %s; want 202 cancelling", status, body)
		}
	}
	if n := w.count(events.StreamRuns, subj); n != 1 {
		t.Fatalf("%d cancel requests stored, want 1", n)
	}
	var c events.CancelRequest
	runs, _ := w.env.JS.Stream(testCtx(t), events.StreamRuns)
	m, err := runs.GetLastMsgForSubject(testCtx(t), subj)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err == nil {
		err = events.DecodeData(ev, &c)
	}
	if err != nil || c.By != "producer A" || c.Tenant != storetest.TenantA || c.Reason != "not needed" || ev.ID() != events.CancelRequestedID("cancel-me") {
		t.Fatalf("the cancel request: %+v %v", c, err)
	}
	// An approver may cancel too; the body is optional.
	if status, _, body := w.post("approver A", "/v1/runs/cancel-me/cancel", "", nil); status != http.StatusAccepted {
		t.Fatalf("cancel as an approver: %d %s", status, body)
	}
	// A run that has ended: its end, nothing published.
	status, _, body := w.post("producer A", "/v1/runs/cancel-done/cancel", "", nil)
	if got := decode[apitypes.CancelJSON](t, body); status != http.StatusOK || got.Cancelled || got.Status != events.StatusCompleted {
		t.Fatalf("cancel of a completed run: %d %s; want 200 completed", status, body)
	}
	if n := w.count(events.StreamRuns, events.Prefix+".run.cancel-done.cancel_requested"); n != 0 {
		t.Fatalf("a cancel request was published for a completed run")
	}
}

func (w *writesEnv) get(who, path string) (int, []byte) {
	w.t.Helper()
	req, _ := http.NewRequestWithContext(testCtx(w.t), http.MethodGet, w.srv.URL+path, nil)
	tok := w.tok[who]
	if who == "admin" {
		tok = w.admin
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestDecisionRoute: an approver of the run's tenant decides a call that
// awaits approval, by its short id (as the CLI and the timeline show it):
// 202 and the decided event, signed with the token's name; deciding again
// is 409 saying how it was settled. A producer or a viewer may not (403),
// another tenant's approver gets 404, as does a call that awaits nothing;
// a revise without a note, or a decision that is none, is 422.
func TestDecisionRoute(t *testing.T) {
	w := newWritesEnv(t)
	fx := storetest.StartedRun(t, "decide-me", "weather", storetest.TenantA, time.Now())
	w.env.Publish(t, fx.Events...)
	eventually(t, "the run recorded", func() (bool, string) {
		s, b := w.get("admin", "/v1/runs/decide-me")
		return s == http.StatusOK, string(b)
	})
	callID := strings.Repeat("ab", 32)
	rec := events.ApprovalRecord{State: events.ApprovalPending, RequestedAt: time.Now(), Deadline: time.Now().Add(time.Hour),
		Call: events.CallRequest{RunID: "decide-me", CallID: callID, Seq: 1, Iteration: 1, Name: "send_email", Version: "1.0.0",
			Input: json.RawMessage(`{}`), Tenant: storetest.TenantA, Agent: "weather", Queue: "default"}}
	kv, err := w.env.JS.KeyValue(testCtx(t), events.BucketApprovals)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := events.ApprovalKey("decide-me", callID)
	if _, err := kv.Put(testCtx(t), key, mustMarshal(t, rec)); err != nil {
		t.Fatal(err)
	}
	short := "/v1/runs/decide-me/calls/" + callID[:12] + "/decision"
	for _, tc := range []struct {
		who, path, body string
		status          int
		code            string
	}{
		{"producer A", short, `{"decision":"approve"}`, http.StatusForbidden, apitypes.CodeForbidden},
		{"viewer A", short, `{"decision":"approve"}`, http.StatusForbidden, apitypes.CodeForbidden},
		{"approver B", short, `{"decision":"approve"}`, http.StatusNotFound, apitypes.CodeRunNotFound},
		{"approver A", "/v1/runs/decide-me/calls/" + strings.Repeat("cd", 32) + "/decision", `{"decision":"approve"}`, http.StatusNotFound, apitypes.CodeCallNotFound},
		{"approver A", "/v1/runs/decide-me/calls/abc/decision", `{"decision":"approve"}`, http.StatusBadRequest, apitypes.CodeInvalidCallID},
		{"approver A", short, `{"decision":"revise"}`, http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest},
		{"approver A", short, `{"decision":"maybe"}`, http.StatusUnprocessableEntity, apitypes.CodeInvalidRequest},
		{"approver A", short, `{"decision":"approve","by":"someone else"}`, http.StatusBadRequest, apitypes.CodeUnknownField},
		{"approver A", short, `{"decision":`, http.StatusBadRequest, apitypes.CodeInvalidJSON},
	} {
		status, _, body := w.post(tc.who, tc.path, "application/json", []byte(tc.body))
		if status != tc.status || decodeError(t, body).Code != tc.code {
			t.Errorf("decide as %s %s: %d %s, want %d %s", tc.who, tc.body, status, body, tc.status, tc.code)
		}
	}
	decided := events.Prefix + ".call.decide-me." + callID + ".decided"
	if n := w.count(events.StreamCalls, decided); n != 0 {
		t.Fatalf("%d decisions published by refused requests", n)
	}
	status, _, body := w.post("approver A", short, "application/json", []byte(`{"decision":"deny","note":"not today"}`))
	if got := decode[apitypes.DecidedJSON](t, body); status != http.StatusAccepted || got.CallID != callID || got.Decision != "deny" {
		t.Fatalf("decide: %d %s; want 202 with the full call id", status, body)
	}
	if n := w.count(events.StreamCalls, decided); n != 1 {
		t.Fatalf("%d decisions published, want 1", n)
	}
	calls, _ := w.env.JS.Stream(testCtx(t), events.StreamCalls)
	m, err := calls.GetLastMsgForSubject(testCtx(t), decided)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	var d events.Decision
	if err == nil {
		err = events.DecodeData(ev, &d)
	}
	if err != nil || d.By != "approver A" || d.Note != "not today" || d.Decision != events.DecisionDeny {
		t.Fatalf("the decision: %+v %v", d, err)
	}
	// The guard settles it (as the Policy Guard would): deciding again says how.
	now := time.Now()
	rec.State, rec.Decision, rec.DecidedAt = events.ApprovalDenied, &d, &now
	if _, err := kv.Put(testCtx(t), key, mustMarshal(t, rec)); err != nil {
		t.Fatal(err)
	}
	status, _, body = w.post("approver A", short, "application/json", []byte(`{"decision":"approve"}`))
	if e := decodeError(t, body); status != http.StatusConflict || e.Code != apitypes.CodeAlreadyDecided || !strings.Contains(e.Message, "denied by approver A") {
		t.Fatalf("deciding a settled call: %d %s; want 409 already_decided saying how", status, body)
	}
	// A record still pending, but a decision already published: 409 too.
	rec.State, rec.Decision, rec.DecidedAt = events.ApprovalPending, nil, nil
	if _, err := kv.Put(testCtx(t), key, mustMarshal(t, rec)); err != nil {
		t.Fatal(err)
	}
	status, _, body = w.post("approver A", short, "application/json", []byte(`{"decision":"approve"}`))
	if status != http.StatusConflict || decodeError(t, body).Code != apitypes.CodeAlreadyDecided {
		t.Fatalf("deciding twice: %d %s; want 409", status, body)
	}
	// The run is cancelled while the record still reads pending: the
	// approval was withdrawn, and the answer says so.
	end, err := events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: "decide-me", Status: events.StatusCancelled,
		Reason: "cancelled by ops"}, "", events.RunTrace{})
	if err != nil {
		t.Fatal(err)
	}
	w.env.Publish(t, end)
	eventually(t, "the run cancelled", func() (bool, string) {
		_, b := w.get("admin", "/v1/runs/decide-me")
		return strings.Contains(string(b), `"status":"cancelled"`), string(b)
	})
	status, _, body = w.post("approver A", short, "application/json", []byte(`{"decision":"approve"}`))
	if e := decodeError(t, body); status != http.StatusConflict || e.Code != apitypes.CodeAlreadyDecided || !strings.Contains(e.Message, "withdrawn") {
		t.Fatalf("deciding a call of a cancelled run: %d %s; want 409 saying withdrawn", status, body)
	}
}

// TestWritesWithTheSessionCookieCheckTheOrigin: a write authenticated by
// the pages' session cookie from another origin is refused (403), as every
// state-changing request of the API is; from the recorder's own origin it
// goes through.
func TestWritesWithTheSessionCookieCheckTheOrigin(t *testing.T) {
	w := newWritesEnv(t)
	fx := storetest.StartedRun(t, "cookie-run", "weather", storetest.TenantA, time.Now())
	w.env.Publish(t, fx.Events...)
	eventually(t, "the run recorded", func() (bool, string) {
		s, b := w.get("admin", "/v1/runs/cookie-run")
		return s == http.StatusOK, string(b)
	})
	send := func(origin string) int {
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, w.srv.URL+"/v1/runs/cookie-run/cancel", nil)
		req.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: w.tok["producer A"]})
		req.Header.Set("Origin", origin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if s := send("https://evil.example"); s != http.StatusForbidden {
		t.Fatalf("cross-origin cancel with the session cookie: %d, want 403", s)
	}
	if s := send(w.srv.URL); s != http.StatusAccepted {
		t.Fatalf("same-origin cancel with the session cookie: %d, want 202", s)
	}
}

// TestTimelineCancelButton: the timeline shows an approver of the run's
// tenant a Cancel button (a form POST of the recorder's own origin, as the
// decision form), and a viewer none. The form refuses another origin and a
// viewer, and for the approver publishes the same cancel request as the
// API, by the approver's name. Once the run has ended cancelled the list
// and the timeline show it so, and the button is gone.
func TestTimelineCancelButton(t *testing.T) {
	w := newWritesEnv(t)
	fx := storetest.StartedRun(t, "button-run", "weather", storetest.TenantA, time.Now())
	w.env.Publish(t, fx.Events...)
	eventually(t, "the run recorded", func() (bool, string) {
		s, b := w.get("admin", "/v1/runs/button-run")
		return s == http.StatusOK, string(b)
	})
	page := func(who, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, w.srv.URL+path, nil)
		req.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: w.tok[who]})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const form = `<form method="post" action="/runs/button-run/cancel" class="cancel-run">`
	if s, body := page("approver A", "/runs/button-run"); s != http.StatusOK || !strings.Contains(body, form) {
		t.Fatalf("the approver's timeline: %d, Cancel button %t", s, strings.Contains(body, form))
	}
	if _, body := page("viewer A", "/runs/button-run"); strings.Contains(body, form) {
		t.Fatal("a viewer sees the Cancel button")
	}
	submit := func(who string, header map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, w.srv.URL+"/runs/button-run/cancel",
			strings.NewReader("reason=stop+it"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: w.tok[who]})
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	subj := events.Prefix + ".run.button-run.cancel_requested"
	for _, h := range []map[string]string{{"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}} {
		if s := submit("approver A", h).StatusCode; s != http.StatusForbidden {
			t.Errorf("cross-origin cancel form %v: %d, want 403", h, s)
		}
	}
	same := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": w.srv.URL}
	if s := submit("viewer A", same).StatusCode; s != http.StatusForbidden {
		t.Errorf("the viewer's cancel form: %d, want 403", s)
	}
	if s := submit("approver B", same).StatusCode; s != http.StatusNotFound {
		t.Errorf("another tenant's approver's cancel form: %d, want 404", s)
	}
	if n := w.count(events.StreamRuns, subj); n != 0 {
		t.Fatalf("%d cancel requests published by refused forms", n)
	}
	resp := submit("approver A", same)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/runs/button-run" {
		t.Fatalf("the approver's cancel form: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n := w.count(events.StreamRuns, subj); n != 1 {
		t.Fatalf("%d cancel requests, want 1", n)
	}
	runs, _ := w.env.JS.Stream(testCtx(t), events.StreamRuns)
	m, err := runs.GetLastMsgForSubject(testCtx(t), subj)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	var c events.CancelRequest
	if err == nil {
		err = events.DecodeData(ev, &c)
	}
	if err != nil || c.By != "approver A" || c.Reason != "stop it" || c.Tenant != storetest.TenantA {
		t.Fatalf("the form's cancel request: %+v %v", c, err)
	}

	// The run ends cancelled (the orchestrator's end event).
	end, err := events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: "button-run", Status: events.StatusCancelled,
		Reason: c.Said()}, "", events.RunTrace{})
	if err != nil {
		t.Fatal(err)
	}
	w.env.Publish(t, end)
	eventually(t, "the run cancelled", func() (bool, string) {
		_, b := w.get("approver A", "/v1/runs/button-run")
		return strings.Contains(string(b), `"status":"cancelled"`), string(b)
	})
	_, body := page("approver A", "/runs/button-run")
	if !strings.Contains(body, `status-cancelled">cancelled`) || strings.Contains(body, form) || !strings.Contains(body, "cancelled by approver A: stop it") {
		t.Fatalf("the timeline of the cancelled run: %.3000s", body)
	}
	if s, b := w.get("producer A", "/v1/runs/button-run/outputs"); s != http.StatusOK {
		t.Fatalf("the outputs of a cancelled run: %d %s; want 200 (what completed)", s, b)
	}
	if _, list := page("approver A", "/?status=cancelled"); !strings.Contains(list, `href="/runs/button-run"`) {
		t.Fatal("the runs list filtered on cancelled lacks the run")
	}
	status, _, b := w.post("producer A", "/v1/runs/button-run/cancel", "", nil)
	if got := decode[apitypes.CancelJSON](t, b); status != http.StatusOK || got.Status != events.StatusCancelled || got.Cancelled {
		t.Fatalf("cancelling a cancelled run: %d %s", status, b)
	}
}

func noRedirects() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

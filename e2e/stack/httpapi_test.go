package stack_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// httpStack is the whole pipeline with the recorder, every service on its
// own NATS identity (the recorder stores runs submitted over HTTP with its
// own), authentication on, and tokens of tenant org1/ws1.
type httpStack struct {
	st                         *stack.Stack
	producer, approver, viewer string
	mail                       *mailTool
}

func startHTTPStack(t *testing.T) *httpStack {
	t.Helper()
	db := sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))
	mail := &mailTool{}
	st := startStack(t, stack.Options{
		Identities: true,
		Recorder:   recorder.ForStack(db), ExecutorOptions: []executor.Option{executor.WithTools(mail)},
		Getenv: func(k string) string {
			if k == recorder.EnvAuth {
				return "on"
			}
			return os.Getenv(k)
		},
	})
	tokens, closeTokens, err := recorder.OpenTokens(t.Context(), db, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer closeTokens()
	issue := func(name string, role auth.Role) string {
		tok, row, err := auth.NewToken(auth.TokenSpec{Name: name, OrgID: "org1", WorkspaceID: "ws1", Role: role}, time.Now())
		require.NoError(t, err)
		require.NoError(t, tokens.CreateToken(t.Context(), row))
		return tok
	}
	return &httpStack{st: st, producer: issue("ci-producer", auth.RoleProducer), approver: issue("approver-1", auth.RoleApprover),
		viewer: issue("viewer-1", auth.RoleViewer), mail: mail}
}

// do sends a JSON body (nil: none) with a bearer token.
func (h *httpStack) do(ctx context.Context, t *testing.T, method, path, token string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, h.st.HTTPURL+path, bytes.NewReader(body))
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, b
}

// submitBody is req as a producer sends it: without a tenant (the token's).
func submitBody(t *testing.T, req envelope.RunRequest) []byte {
	t.Helper()
	b, err := json.Marshal(req)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	delete(doc, "tenant")
	b, err = json.Marshal(doc)
	require.NoError(t, err)
	return b
}

// requestsStored counts the run requests the runs stream holds, by run id.
func requestsStored(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), events.StreamRuns)
	require.NoError(t, err)
	info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(events.Prefix+".run.*.requested"))
	require.NoError(t, err)
	out := map[string]uint64{}
	for subj, n := range info.State.Subjects {
		out[strings.TrimSuffix(strings.TrimPrefix(subj, events.Prefix+".run."), ".requested")] = n
	}
	return out
}

// TestHTTPSubmitConcurrently: 200 runs submitted over HTTP at once, each
// stored by the recorder on the runs stream as client.Submit stores it, are
// each created (201) and stored exactly once on the runs stream; submitting them
// all again at once answers each with its run (200, created false) and
// stores nothing more; 20 concurrent submissions of one new request make
// one run, created for exactly one of them; another request under a used run
// id is 409; a viewer may not submit.
func TestHTTPSubmitConcurrently(t *testing.T) {
	h := startHTTPStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const n = 200
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = submitBody(t, scripted(t, fmt.Sprintf("http-run-%03d", i), nil, map[string]any{"content": "done"}))
	}
	submitAll := func(want int, wantCreated bool) time.Duration {
		t.Helper()
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				status, hdr, body := h.do(ctx, t, http.MethodPost, "/v1/runs", h.producer, bodies[i])
				var got apitypes.SubmitJSON
				_ = json.Unmarshal(body, &got)
				id := fmt.Sprintf("http-run-%03d", i)
				switch {
				case status != want || got.RunID != id || got.Created != wantCreated:
					errs <- fmt.Errorf("%s: %d %s", id, status, body)
				case want == http.StatusCreated && hdr.Get("Location") != "/v1/runs/"+id:
					errs <- fmt.Errorf("%s: Location %q", id, hdr.Get("Location"))
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		return time.Since(start)
	}
	took := submitAll(http.StatusCreated, true)
	t.Logf("%d concurrent submissions answered 201 in %s", n, took)
	stored := requestsStored(t, h.st.JS)
	for i := range n {
		id := fmt.Sprintf("http-run-%03d", i)
		require.Equal(t, uint64(1), stored[id], "run requests of %s on the runs stream", id)
	}
	took = submitAll(http.StatusOK, false)
	t.Logf("%d concurrent resubmissions answered 200 in %s", n, took)
	stored = requestsStored(t, h.st.JS)
	for i := range n {
		require.Equal(t, uint64(1), stored[fmt.Sprintf("http-run-%03d", i)])
	}

	// One new request, 20 times at once: one run, created for one of them.
	one := submitBody(t, scripted(t, "http-once", nil, map[string]any{"content": "done"}))
	var created, repeated int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			status, _, body := h.do(ctx, t, http.MethodPost, "/v1/runs", h.producer, one)
			mu.Lock()
			defer mu.Unlock()
			switch status {
			case http.StatusCreated:
				created++
			case http.StatusOK:
				repeated++
			default:
				t.Errorf("concurrent same request: %d %s", status, body)
			}
		})
	}
	wg.Wait()
	require.Equal(t, 1, created, "created for exactly one (%d repeats)", repeated)
	require.Equal(t, uint64(1), requestsStored(t, h.st.JS)["http-once"])

	// Another request under a used run id: 409, nothing stored.
	other := submitBody(t, scripted(t, "http-once", nil, map[string]any{"content": "something else"}))
	status, _, body := h.do(ctx, t, http.MethodPost, "/v1/runs", h.producer, other)
	require.Equal(t, http.StatusConflict, status, "%s", body)
	require.Contains(t, string(body), apitypes.CodeRunIDInUse)
	require.Equal(t, uint64(1), requestsStored(t, h.st.JS)["http-once"])

	status, _, body = h.do(ctx, t, http.MethodPost, "/v1/runs", h.viewer, submitBody(t, scripted(t, "http-viewer", nil, map[string]any{"content": "x"})))
	require.Equal(t, http.StatusForbidden, status, "%s", body)
	require.Zero(t, requestsStored(t, h.st.JS)["http-viewer"])
}

// sse is one Server-Sent Event.
type sse struct{ id, event, data string }

// readSSE reads events from a stream until an end or error event, or EOF.
func readSSE(t *testing.T, body io.Reader, each func(sse)) {
	t.Helper()
	r := bufio.NewReader(body)
	var ev sse
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if ev.data != "" || ev.event != "" {
				each(ev)
				if ev.event == "end" || ev.event == "error" {
					return
				}
			}
			ev = sse{}
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data += strings.TrimPrefix(line, "data: ")
		}
	}
}

// openStream opens a run's live stream (with Last-Event-ID when not "").
func (h *httpStack) openStream(ctx context.Context, t *testing.T, runID, lastEventID string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.st.HTTPURL+"/v1/runs/"+runID+"/events/stream", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+h.viewer)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	return resp
}

// ceName is a CloudEvents attribute name (CloudEvents 1.0: lowercase ASCII
// letters and digits).
var ceName = regexp.MustCompile(`^[a-z0-9]+$`)

// checkCloudEvent checks one stream message's data against the CloudEvents
// 1.0 JSON format: it parses with the CloudEvents SDK (which refuses
// invalid extension names) and validates, every attribute name is a
// CloudEvents name, and it has the context attributes the stream promises.
func checkCloudEvent(t *testing.T, data string) event.Event {
	t.Helper()
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(data), &raw), data)
	for k := range raw {
		require.Regexp(t, ceName, k, "attribute name %q of %s", k, data)
	}
	for _, k := range []string{"specversion", "id", "source", "type", "time", "datacontenttype", "runid", "tenantid"} {
		require.Contains(t, raw, k, "attribute %s of %s", k, data)
	}
	var e event.Event
	require.NoError(t, json.Unmarshal([]byte(data), &e), data)
	require.NoError(t, e.Validate(), data)
	require.Equal(t, "1.0", e.SpecVersion())
	require.Equal(t, "application/json", e.DataContentType())
	if events.DataSchema(e.Type()) != "" {
		require.Equal(t, envelope.SchemaURL(events.DataSchema(e.Type())), e.DataSchema(), "dataschema of %s", e.Type())
	}
	return e
}

// checkCausal checks that evs are in causal order: each call's events after
// the turn that asked for the call, a decision after its call's approval
// request, the run's suspension for an approval after that request and its
// resumption after the call's answer, the run's end last.
func checkCausal(t *testing.T, evs []event.Event) {
	t.Helper()
	asked, approval, answered := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i, e := range evs {
		callID := events.Ext(&e, events.ExtCallID)
		if callID != "" && (e.Type() == events.TypeCallDecided || e.Type() == events.TypeCallApproved || e.Type() == events.TypeCallCompleted) {
			answered[callID] = true // checked below against the turn, not against itself
		}
		switch {
		case e.Type() == events.TypeRunSuspended || e.Type() == events.TypeRunResumed:
			_, call, ok := strings.Cut(strings.TrimPrefix(e.ID(), events.Ext(&e, events.ExtRunID)+"/"), "/")
			if !ok {
				break
			}
			if e.Type() == events.TypeRunSuspended {
				require.True(t, approval[call], "the run suspended for call %s before its approval request", call)
			} else {
				require.True(t, answered[call], "the run resumed for call %s before its answer", call)
			}
		case e.Type() == events.TypeTurnCompleted:
			var turn events.Turn
			require.NoError(t, events.DecodeData(&e, &turn))
			for _, c := range turn.Calls {
				asked[c.CallID] = true
			}
		case e.Type() == events.TypeRunCompleted || e.Type() == events.TypeRunFailed || e.Type() == events.TypeRunCancelled:
			require.Equal(t, len(evs)-1, i, "the run's end is the last event")
		case callID != "":
			require.True(t, asked[callID], "%s of call %s before the turn that asked for it", e.Type(), callID)
			if e.Type() == events.TypeCallApprovalRequired {
				approval[callID] = true
			}
			if e.Type() == events.TypeCallDecided {
				require.True(t, approval[callID], "a decision on %s before its approval request", callID)
			}
		}
	}
}

// TestHTTPStreamBeforeTheRun: a live stream opened before the run is
// submitted waits for it, then delivers every event of the run, each a
// valid CloudEvent, in causal order, and ends after the run's end; the
// call that waits for approval is approved over HTTP (its short id). A
// stream resumed with Last-Event-ID from the middle delivers exactly the
// rest, in the same order.
func TestHTTPStreamBeforeTheRun(t *testing.T) {
	h := startHTTPStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const runID = "http-stream"
	type msg struct {
		id string
		ev event.Event
	}
	var got []msg
	var end sse
	streamed := make(chan struct{})
	resp := h.openStream(ctx, t, runID, "")
	go func() {
		defer close(streamed)
		defer func() { _ = resp.Body.Close() }()
		readSSE(t, resp.Body, func(s sse) {
			if s.event != "" {
				end = s
				return
			}
			got = append(got, msg{s.id, checkCloudEvent(t, s.data)})
		})
	}()

	time.Sleep(300 * time.Millisecond) // the stream waits for a run not submitted yet
	req := approvalScript(t, runID, 120, mailTurn, map[string]any{"content": "sent"})
	status, _, body := h.do(ctx, t, http.MethodPost, "/v1/runs", h.producer, submitBody(t, req))
	require.Equal(t, http.StatusCreated, status, "%s", body)

	// The send_email call waits for approval: decide it over HTTP.
	var callID string
	require.Eventually(t, func() bool {
		status, _, body := h.do(ctx, t, http.MethodGet, "/v1/runs/"+runID, h.viewer, nil)
		if status != http.StatusOK {
			return false
		}
		var run apitypes.RunDetailJSON
		require.NoError(t, json.Unmarshal(body, &run))
		for _, c := range run.ToolCalls {
			if c.Name == "send_email" {
				callID = c.CallID
			}
		}
		if callID == "" {
			return false
		}
		_, err := approvalsPending(ctx, h, runID, callID)
		return err == nil
	}, 60*time.Second, 50*time.Millisecond, "the call to await approval")
	status, _, body = h.do(ctx, t, http.MethodPost, "/v1/runs/"+runID+"/calls/"+callID[:12]+"/decision", h.producer,
		[]byte(`{"decision":"approve"}`))
	require.Equal(t, http.StatusForbidden, status, "a producer may not decide: %s", body)
	status, _, body = h.do(ctx, t, http.MethodPost, "/v1/runs/"+runID+"/calls/"+callID[:12]+"/decision", h.approver,
		[]byte(`{"decision":"approve","note":"fine"}`))
	require.Equal(t, http.StatusAccepted, status, "%s", body)

	select {
	case <-streamed:
	case <-ctx.Done():
		t.Fatal("the stream did not end")
	}
	require.Equal(t, "end", end.event, "the stream ends with its end event: %+v", end)
	require.JSONEq(t, `{"run_id":"http-stream","status":"completed"}`, end.data)
	evs := make([]event.Event, len(got))
	ids := map[string]bool{}
	for i, m := range got {
		evs[i] = m.ev
		require.False(t, ids[m.ev.ID()], "event %s delivered twice", m.ev.ID())
		ids[m.ev.ID()] = true
	}
	checkCausal(t, evs)
	require.Equal(t, events.TypeRunRequested, evs[0].Type(), "the request first")
	// Every recorded event was delivered.
	status, _, body = h.do(ctx, t, http.MethodGet, "/v1/runs/"+runID+"/events?limit=5000", h.viewer, nil)
	require.Equal(t, http.StatusOK, status)
	var recorded apitypes.EventsJSON
	require.NoError(t, json.Unmarshal(body, &recorded))
	for _, e := range recorded.Events {
		require.True(t, ids[e.ID], "recorded event %s (%s) was not streamed", e.ID, e.Type)
	}
	require.Len(t, got, len(recorded.Events))
	var types []string
	for _, e := range evs {
		types = append(types, strings.TrimPrefix(strings.TrimSuffix(e.Type(), ".v1"), "dev.toolwire."))
	}
	t.Logf("streamed %d events in causal order: %s", len(evs), strings.Join(types, ", "))

	// Resume from the middle: exactly the rest, in the same order.
	mid := len(got) / 2
	resp = h.openStream(ctx, t, runID, got[mid].id)
	defer func() { _ = resp.Body.Close() }()
	var rest []string
	var end2 sse
	readSSE(t, resp.Body, func(s sse) {
		if s.event != "" {
			end2 = s
			return
		}
		rest = append(rest, checkCloudEvent(t, s.data).ID())
	})
	var want []string
	for _, m := range got[mid+1:] {
		want = append(want, m.ev.ID())
	}
	require.Equal(t, want, rest, "resumed after %s", got[mid].id)
	require.Equal(t, "end", end2.event)
}

// approvalsPending reads the call's approval record, as the decision route
// does.
func approvalsPending(ctx context.Context, h *httpStack, runID, callID string) (events.ApprovalRecord, error) {
	kv, err := h.st.JS.KeyValue(ctx, events.BucketApprovals)
	if err != nil {
		return events.ApprovalRecord{}, err
	}
	key, err := events.ApprovalKey(runID, callID)
	if err != nil {
		return events.ApprovalRecord{}, err
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		return events.ApprovalRecord{}, err
	}
	rec, err := events.DecodeApprovalRecord(e.Value())
	if err == nil && !rec.Pending() {
		err = fmt.Errorf("not pending: %s", rec.State)
	}
	return rec, err
}

// TestHTTPCancel: a run whose call waits for approval is cancelled over
// HTTP by its tenant's producer (202 cancelling); the orchestrator ends it
// cancelled, its live stream ends with the cancelled end last, its waiting
// approval reads withdrawn on the timeline, a decision afterwards is 409
// saying so, the call never ran, and cancelling again answers the end
// (200). The run's outputs (what completed) are served.
func TestHTTPCancel(t *testing.T) {
	h := startHTTPStack(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const runID = "http-cancel"
	req := approvalScript(t, runID, 120, mailTurn, map[string]any{"content": "sent"})
	status, _, body := h.do(ctx, t, http.MethodPost, "/v1/runs", h.producer, submitBody(t, req))
	require.Equal(t, http.StatusCreated, status, "%s", body)
	var callID string
	require.Eventually(t, func() bool {
		_, _, body := h.do(ctx, t, http.MethodGet, "/v1/runs/"+runID, h.viewer, nil)
		var run apitypes.RunDetailJSON
		if json.Unmarshal(body, &run) != nil {
			return false
		}
		for _, c := range run.ToolCalls {
			if c.Name == "send_email" {
				callID = c.CallID
			}
		}
		if callID == "" {
			return false
		}
		_, err := approvalsPending(ctx, h, runID, callID)
		return err == nil
	}, 60*time.Second, 50*time.Millisecond, "the call to await approval")

	resp := h.openStream(ctx, t, runID, "")
	defer func() { _ = resp.Body.Close() }()
	status, _, body = h.do(ctx, t, http.MethodPost, "/v1/runs/"+runID+"/cancel", h.viewer, []byte(`{"reason":"x"}`))
	require.Equal(t, http.StatusForbidden, status, "a viewer may not cancel: %s", body)
	status, _, body = h.do(ctx, t, http.MethodPost, "/v1/runs/"+runID+"/cancel", h.producer, []byte(`{"reason":"wrong prompt"}`))
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	require.JSONEq(t, `{"run_id":"http-cancel","status":"cancelling","cancelled":true}`, string(body))

	var evs []event.Event
	var end sse
	readSSE(t, resp.Body, func(s sse) {
		if s.event != "" {
			end = s
			return
		}
		evs = append(evs, checkCloudEvent(t, s.data))
	})
	require.Equal(t, "end", end.event, "%+v", end)
	require.JSONEq(t, `{"run_id":"http-cancel","status":"cancelled"}`, end.data)
	require.NotEmpty(t, evs)
	require.Equal(t, events.TypeRunCancelled, evs[len(evs)-1].Type(), "the cancelled end comes last")
	checkCausal(t, evs)

	status, _, body = h.do(ctx, t, http.MethodPost, "/v1/runs/"+runID+"/calls/"+callID+"/decision", h.approver, []byte(`{"decision":"approve"}`))
	require.Equal(t, http.StatusConflict, status, "%s", body)
	require.Contains(t, string(body), "withdrawn")
	require.Empty(t, h.mail.sentTo(), "the withdrawn call never ran")

	status, _, body = h.do(ctx, t, http.MethodPost, "/v1/runs/"+runID+"/cancel", h.producer, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.JSONEq(t, `{"run_id":"http-cancel","status":"cancelled","cancelled":false}`, string(body))
	status, _, body = h.do(ctx, t, http.MethodGet, "/v1/runs/"+runID+"/outputs", h.viewer, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Eventually(t, func() bool {
		_, _, page := h.do(ctx, t, http.MethodGet, "/runs/"+runID+"/timeline", h.viewer, nil)
		return strings.Contains(string(page), "withdrawn") && strings.Contains(string(page), `status-cancelled">cancelled`)
	}, 20*time.Second, 100*time.Millisecond, "the timeline shows the run cancelled and its approval withdrawn")
}

// TestCatalogAuthStatusUnderIdentities: with every service on its own NATS
// identity, the tool catalog tells a tool whose key is missing from one
// whose key is set, and at which scope, reading only the secrets' names
// (the recorder's role may not read the sealed values: before the names
// bucket, GET /v1/tools answered 503 here for any tool with secrets), and
// the live processes of its queue.
func TestCatalogAuthStatusUnderIdentities(t *testing.T) {
	h := startHTTPStack(t)
	ctx := t.Context()
	reg, err := registry.Open(ctx, h.st.JS)
	require.NoError(t, err)
	def := probeDef("1.0.0")
	def.Name, def.RequiredSecrets = "keyed", []string{"KEYED_API_KEY"}
	_, err = reg.Register(ctx, def)
	require.NoError(t, err)
	auth := func() apitypes.AuthStatusJSON {
		code, _, body := h.do(ctx, t, http.MethodGet, "/v1/tools?search=keyed", h.viewer, nil)
		require.Equal(t, http.StatusOK, code, string(body))
		var c apitypes.CatalogJSON
		require.NoError(t, json.Unmarshal(body, &c))
		require.Len(t, c.Tools, 1, string(body))
		// The executor serving the default queue, from its heartbeats,
		// which the recorder's role may read.
		require.NotEmpty(t, c.Tools[0].LiveWorkers, string(body))
		return c.Tools[0].Auth
	}
	require.Equal(t, apitypes.AuthMissing, auth().Status)

	k, err := secrets.ParseKeyring("k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)), "")
	require.NoError(t, err)
	store, err := secrets.Open(ctx, h.st.JS, k)
	require.NoError(t, err)
	require.NoError(t, store.Set(ctx, secrets.WorkspaceScope("org1", "ws1"), "KEYED_API_KEY", []byte("sk-test-value")))
	got := auth()
	require.Equal(t, apitypes.AuthReady, got.Status, "%+v", got)
	require.Equal(t, string(secrets.LevelWorkspace), got.Scope)
}

// TestCatalogRateLimitUnderIdentities: a tool's rate limit, and where the
// tenant stands in it, as the catalog reads the executors' token buckets
// with the recorder's own NATS identity: after the tenant's one call of
// the hour, none is left and the catalog (and the tools page) says when
// the next may go.
func TestCatalogRateLimitUnderIdentities(t *testing.T) {
	h := startHTTPStack(t)
	ctx := t.Context()
	reg, err := registry.Open(ctx, h.st.JS)
	require.NoError(t, err)
	def := probeDef("1.0.0")
	def.Name, def.RateLimit = "limited", &envelope.RateLimit{PerS: 1.0 / 3600, Burst: 1}
	_, err = reg.Register(ctx, def)
	require.NoError(t, err)
	limit := func() apitypes.RateLimitStatusJSON {
		t.Helper()
		code, _, body := h.do(ctx, t, http.MethodGet, "/v1/tools?search=limited", h.viewer, nil)
		require.Equal(t, http.StatusOK, code, string(body))
		var c apitypes.CatalogJSON
		require.NoError(t, json.Unmarshal(body, &c))
		require.Len(t, c.Tools, 1, string(body))
		require.NotNil(t, c.Tools[0].RateLimit, string(body))
		return *c.Tools[0].RateLimit
	}
	before := limit()
	require.Equal(t, 1, before.Burst)
	require.NotNil(t, before.Remaining)
	require.Equal(t, 1, *before.Remaining, "an untouched bucket is full")
	require.Nil(t, before.ResetsAt)

	req := scripted(t, "rate-limited", []string{"limited@1.0.0"},
		map[string]any{"tool_calls": []any{call("limited", map[string]any{"text": "one"})}},
		map[string]any{"tool_calls": []any{call("limited", map[string]any{"text": "two"})}},
		map[string]any{"content": "done"})
	req.Tenant = envelope.Tenant{OrgID: "org1", WorkspaceID: "ws1"} // the viewer's tenant, as the catalog asks
	called := time.Now()
	final := runToEnd(t, h.st, req)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.NotNil(t, final.Outputs)
	require.Len(t, final.Outputs.ToolOrder, 2)
	second := final.Outputs.ToolsByID[final.Outputs.ToolOrder[1]]
	require.NotNil(t, second.Error)
	require.Equal(t, envelope.CodeRateLimit, second.Error.Code)

	after := limit()
	require.NotNil(t, after.Remaining)
	require.Zero(t, *after.Remaining)
	require.NotNil(t, after.ResetsAt, "none left: the catalog says when the next call may go")
	require.WithinRange(t, *after.ResetsAt, called.Add(59*time.Minute), time.Now().Add(time.Hour))

	code, _, page := h.do(ctx, t, http.MethodGet, "/tools?search=limited", h.viewer, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(page), "Rate limited")
	require.Contains(t, string(page), "none left now, the next at "+after.ResetsAt.UTC().Format("15:04:05"))
}

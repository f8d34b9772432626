package apiclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolwire/toolwire/services/recorder/apiclient"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
)

// recorderStub answers GET /v1/runs/{id} as a recorder would, from answers
// in turn (the last one repeated); an answer of nil is a 503.
func recorderStub(t *testing.T, answers ...*apitypes.RunDetailJSON) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/runs/run-1" {
			http.NotFound(w, r)
			return
		}
		i := int(n.Add(1)) - 1
		a := answers[min(i, len(answers)-1)]
		if a == nil {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func runAt(status string, settled bool, calls ...string) *apitypes.RunDetailJSON {
	r := &apitypes.RunDetailJSON{RunJSON: apitypes.RunJSON{RunID: "run-1", Status: status,
		Counts: apitypes.CountsJSON{ToolCalls: len(calls)}}, Settled: settled}
	for _, c := range calls {
		r.ToolCalls = append(r.ToolCalls, apitypes.ToolCallJSON{Status: c})
	}
	return r
}

// TestWaitSettled: the wait goes on through errors and runs not yet whole,
// and ends with the settled run.
func TestWaitSettled(t *testing.T) {
	srv, n := recorderStub(t, nil, runAt("started", false, "approved"),
		runAt("completed", false, "approved"), runAt("completed", true, "completed"))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	run, err := apiclient.WaitSettled(ctx, srv.URL, "run-1", time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !run.Settled || run.Status != "completed" || n.Load() != 4 {
		t.Fatalf("run %+v after %d requests; want the settled one after 4", run, n.Load())
	}
}

// TestWaitSettledBounded: a run that never settles ends the wait with ctx,
// saying how the run last stood; a bad URL is refused at once.
func TestWaitSettledBounded(t *testing.T) {
	srv, _ := recorderStub(t, runAt("completed", false, "completed", "approved"))
	// Long enough for the stub's first answer on a loaded CI host.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := apiclient.WaitSettled(ctx, srv.URL, "run-1", 10*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "status completed, 1 of 2 calls recorded completed") ||
		!strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Fatalf("err = %v; want the deadline, with the run's last state", err)
	}

	// The deadline in the middle of a request (here: every request after
	// the first hangs) ends the wait with the answer before it, not with the
	// cancelled request's error.
	var asked atomic.Int32
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if asked.Add(1) > 1 {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(runAt("started", false, "approved"))
	}))
	defer hanging.Close()
	hctx, hcancel := context.WithTimeout(t.Context(), time.Second)
	defer hcancel()
	_, err = apiclient.WaitSettled(hctx, hanging.URL, "run-1", time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "status started, 0 of 1 calls recorded completed") ||
		!errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want the deadline, with the answer before the request it cut short", err)
	}

	// An answer that waiting will not change ends the wait at once.
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"code":"unauthorized","message":"a token is required"}}`, http.StatusUnauthorized)
	}))
	defer refusing.Close()
	rctx, rcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer rcancel()
	_, err = apiclient.WaitSettled(rctx, refusing.URL, "run-1", time.Millisecond)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "401 Unauthorized") ||
		!strings.Contains(err.Error(), "a token is required") {
		t.Fatalf("err = %v; want the refusal, not a wait to the deadline", err)
	}
	if _, err := apiclient.WaitSettled(t.Context(), srv.URL, "../runs", time.Millisecond); err == nil {
		t.Error("a run id with a path in it was accepted")
	}

	for _, base := range []string{"", "ftp://host", "http://", "::"} {
		if _, err := apiclient.WaitSettled(t.Context(), base, "run-1", time.Millisecond); err == nil ||
			!strings.Contains(err.Error(), "want http(s)://host:port") {
			t.Errorf("base %q: err = %v", base, err)
		}
	}
}

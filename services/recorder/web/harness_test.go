package web_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
	"github.com/toolwire/toolwire/services/recorder/web"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness serves the pages and the JSON API, as the recorder does, on a
// SQLite store that the test writes to directly: what the pages show is
// what the store holds, however it got there.
type harness struct {
	t       *testing.T
	store   *sqlite.Store
	changes *api.Changes
	srv     *httptest.Server
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	st := sqlitetest.Store(t)
	log := slog.New(slog.DiscardHandler)
	h := &harness{t: t, store: st, changes: api.NewChanges()}
	done := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/v1/", api.New(st, api.Options{Log: log, Changes: h.changes, Done: done}))
	mux.Handle("/", web.New(st, web.Options{Log: log}))
	h.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(done) // ends the live streams, as a stopping recorder does
		h.srv.Close()
	})
	return h
}

// publish records events as the recorder would, and wakes the live streams.
func (h *harness) publish(outs ...events.Outgoing) {
	h.t.Helper()
	recs := storetest.Records(h.t, outs...)
	if err := h.store.Write(testCtx(h.t), recs...); err != nil {
		h.t.Fatal(err)
	}
	h.changes.Notify(recs)
}

// page fetches an HTML page and checks its status and headers.
func (h *harness) page(path string, want int) string {
	h.t.Helper()
	resp := h.get(path)
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		h.t.Fatalf("GET %s: %d %s %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return string(b)
}

func (h *harness) get(path string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequestWithContext(testCtx(h.t), http.MethodGet, h.srv.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

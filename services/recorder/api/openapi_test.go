package api_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/api/apitest"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
)

// TestOpenAPIDocument: the document is valid OpenAPI 3, documents every route
// of the API and nothing else, and is what /v1/openapi.yaml serves.
func TestOpenAPIDocument(t *testing.T) {
	doc, _ := apitest.Spec(t)
	var paths []string
	for p := range doc.Paths.Map() {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	want := []string{
		"/v1/blobs/{name}", "/v1/openapi.yaml", "/v1/runs", "/v1/runs/{run_id}",
		"/v1/runs/{run_id}/calls/{call_id}", "/v1/runs/{run_id}/calls/{call_id}/materialize",
		"/v1/runs/{run_id}/cancel", "/v1/runs/{run_id}/calls/{call_id}/decision",
		"/v1/runs/{run_id}/envelopes", "/v1/runs/{run_id}/events", "/v1/runs/{run_id}/events/stream",
		"/v1/runs/{run_id}/outputs", "/v1/runs/{run_id}/pins", "/v1/runs/{run_id}/replay", "/v1/runs/{run_id}/turns",
		"/v1/tools", "/v1/admin/tools", "/v1/admin/tools/{ref}", "/v1/admin/tools/{ref}/state", "/v1/admin/tools/{ref}/publish",
	}
	sort.Strings(want)
	if !slices.Equal(paths, want) {
		t.Fatalf("documented paths = %v\nwant %v", paths, want)
	}

	srv := httptest.NewServer(api.New(nil, api.Options{Log: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/openapi.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(buf.Bytes(), api.OpenAPI) {
		t.Fatalf("GET /v1/openapi.yaml: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), buf.Len())
	}
}

// TestOpenAPISecurity: every operation declares its security, as linters
// require: the document itself is public, every other operation takes the
// API's credentials and documents its 401; the admin routes also take the
// admin token and document their 403. Every scheme named is defined.
func TestOpenAPISecurity(t *testing.T) {
	doc, _ := apitest.Spec(t)
	if doc.Security == nil || len(doc.Security) == 0 {
		t.Fatal("the document declares no default security")
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			if op.Security == nil {
				t.Errorf("%s declares no security", name)
				continue
			}
			if path == "/v1/openapi.yaml" {
				if len(*op.Security) != 0 {
					t.Errorf("%s: want public (security: [])", name)
				}
				continue
			}
			schemes := map[string]bool{}
			for _, req := range *op.Security {
				for s := range req {
					if doc.Components.SecuritySchemes[s] == nil {
						t.Errorf("%s: security scheme %q is not defined", name, s)
					}
					schemes[s] = true
				}
			}
			want := []string{"apiToken", "oidcToken", "session"}
			if strings.HasPrefix(path, "/v1/admin/") {
				want = append(want, "adminToken")
				if op.Responses.Status(http.StatusForbidden) == nil {
					t.Errorf("%s documents no 403", name)
				}
			}
			for _, s := range want {
				if !schemes[s] {
					t.Errorf("%s: security lacks %s", name, s)
				}
			}
			if op.Responses.Status(http.StatusUnauthorized) == nil {
				t.Errorf("%s documents no 401", name)
			}
		}
	}
}

// TestOpenAPIOperationsAreServed: every operation the document describes
// is a route of the API: its method on its path (parameters filled in) is
// neither refused as a method the path does not take (405) nor answered as
// a resource that does not exist (404 not_found); and every method of a
// documented path that the document does not describe is refused (405).
func TestOpenAPIOperationsAreServed(t *testing.T) {
	doc, _ := apitest.Spec(t)
	st := sqlitetest.Store(t)
	done := make(chan struct{})
	defer close(done)
	srv := httptest.NewServer(api.New(st, api.Options{Log: slog.New(slog.DiscardHandler), Done: done,
		StreamWait: time.Millisecond, Poll: time.Millisecond}))
	t.Cleanup(srv.Close)
	fill := strings.NewReplacer("{run_id}", "run-1", "{call_id}", strings.Repeat("ab", 32), "{name}", "run-1.outputs",
		"{ref}", "ghost@1.0.0")
	for path, item := range doc.Paths.Map() {
		ops := item.Operations()
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
			req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+fill.Replace(path), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 4096)
			n, _ := io.ReadAtLeast(resp.Body, b, 1)
			_ = resp.Body.Close()
			body := string(b[:n])
			_, documented := ops[method]
			switch {
			case documented && resp.StatusCode == http.StatusMethodNotAllowed:
				t.Errorf("%s %s is documented but refused: %s", method, path, body)
			case documented && resp.StatusCode == http.StatusNotFound && strings.Contains(body, `"code":"not_found"`):
				t.Errorf("%s %s is documented but no route: %s", method, path, body)
			case !documented && resp.StatusCode != http.StatusMethodNotAllowed:
				t.Errorf("%s %s is not documented but answered %d: %.200s", method, path, resp.StatusCode, body)
			}
		}
	}
}

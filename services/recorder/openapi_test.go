package recorder_test

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/toolwire/toolwire/services/recorder"
)

var (
	specOnce   sync.Once
	specDoc    *openapi3.T
	specRouter routers.Router
	specErr    error
)

// spec loads and validates openapi.yaml once.
func spec(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	specOnce.Do(func() {
		loader := openapi3.NewLoader()
		specDoc, specErr = loader.LoadFromData(recorder.OpenAPI)
		if specErr != nil {
			return
		}
		if specErr = specDoc.Validate(context.Background()); specErr != nil {
			return
		}
		// The document's server is "/" (relative): route on paths alone.
		routed := *specDoc
		routed.Servers = nil
		specRouter, specErr = legacy.NewRouter(&routed)
	})
	if specErr != nil {
		t.Fatalf("openapi.yaml: %v", specErr)
	}
	return specDoc, specRouter
}

// checkAgainstSpec validates a JSON response of the API against openapi.yaml:
// its status must be documented for the operation, and its body must match
// the documented schema.
func checkAgainstSpec(t testing.TB, req *http.Request, status int, header http.Header, body []byte) {
	t.Helper()
	if !strings.HasPrefix(req.URL.Path, "/v1/") {
		return
	}
	_, router := spec(t)
	route, params, err := router.FindRoute(req)
	if err != nil {
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			return // not an API path (the 404 of /v1/nothing) or a method the API refuses
		}
		t.Errorf("%s %s answered %d but is not in openapi.yaml: %v", req.Method, req.URL.Path, status, err)
		return
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{ExcludeRequestQueryParams: true},
		},
		Status: status, Header: header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Errorf("%s %s: response %d does not match openapi.yaml: %v\nbody: %s", req.Method, req.URL, status, err, truncateBody(body))
	}
}

func truncateBody(b []byte) []byte {
	if len(b) > 2000 {
		return append(b[:2000:2000], "..."...)
	}
	return b
}

// TestOpenAPIDocument: the document is valid OpenAPI 3, documents every route
// of the API and nothing else, and is what /v1/openapi.yaml serves.
func TestOpenAPIDocument(t *testing.T) {
	doc, _ := spec(t)
	var paths []string
	for p := range doc.Paths.Map() {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	want := []string{
		"/v1/blobs/{name}", "/v1/openapi.yaml", "/v1/runs", "/v1/runs/{run_id}",
		"/v1/runs/{run_id}/calls/{call_id}", "/v1/runs/{run_id}/calls/{call_id}/materialize",
		"/v1/runs/{run_id}/envelopes", "/v1/runs/{run_id}/events", "/v1/runs/{run_id}/events/stream",
		"/v1/runs/{run_id}/outputs", "/v1/runs/{run_id}/pins", "/v1/runs/{run_id}/replay",
		"/v1/tools", "/v1/admin/tools", "/v1/admin/tools/{ref}", "/v1/admin/tools/{ref}/state",
	}
	sort.Strings(want)
	if !slices.Equal(paths, want) {
		t.Fatalf("documented paths = %v\nwant %v", paths, want)
	}

	h := newHarness(t)
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, h.api.URL+"/v1/openapi.yaml", nil)
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
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(buf.Bytes(), recorder.OpenAPI) {
		t.Fatalf("GET /v1/openapi.yaml: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), buf.Len())
	}
}

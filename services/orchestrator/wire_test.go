package orchestrator_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// fakeModel is an httptest server that speaks a provider's wire format: it
// records every request and answers each from a queue of canned replies
// (status, headers, body), repeating the last one when the queue runs out.
type fakeModel struct {
	t       testing.TB
	srv     *httptest.Server
	mu      sync.Mutex
	replies []reply
	got     []gotRequest
	answer  func(n int, body map[string]any) reply // optional: computes the reply of request n (0-based)
}

type reply struct {
	status  int
	headers map[string]string
	body    string
}

type gotRequest struct {
	at     time.Time
	method string
	path   string
	header http.Header
	body   map[string]any
	raw    []byte
}

func newFakeModel(t testing.TB, replies ...reply) *fakeModel {
	t.Helper()
	f := &fakeModel{t: t, replies: replies}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeModel) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	f.mu.Lock()
	n := len(f.got)
	f.got = append(f.got, gotRequest{at: time.Now(), method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: body, raw: raw})
	var rep reply
	switch {
	case f.answer != nil:
		rep = f.answer(n, body)
	case n < len(f.replies):
		rep = f.replies[n]
	default:
		rep = f.replies[len(f.replies)-1]
	}
	f.mu.Unlock()
	for k, v := range rep.headers {
		w.Header().Set(k, v)
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	if rep.status == 0 {
		rep.status = http.StatusOK
	}
	w.WriteHeader(rep.status)
	_, _ = io.WriteString(w, rep.body)
}

func (f *fakeModel) requests() []gotRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]gotRequest(nil), f.got...)
}

// registryTools are two tool definitions as the registry holds them.
func registryTools() []envelope.ToolDefinition {
	return []envelope.ToolDefinition{
		{Name: "echo", Version: "1.0.0", Description: "Returns its input text.",
			InputSchema: json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",` +
				`"properties":{"text":{"type":"string","description":"The text to return."}},"required":["text"],"additionalProperties":false}`)},
		{Name: "calculator", Version: "1.0.0", Description: "Evaluates an arithmetic expression.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`)},
	}
}

// jsonOf decodes a JSON text for comparisons.
func jsonOf(t testing.TB, s string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(s), &v), s)
	return v
}

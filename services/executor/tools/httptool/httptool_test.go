package httptool_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/httptool"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// The tools run here directly, on a real loopback server; the executor's
// tests run them through the pipeline (timeouts, output schemas, secrets
// from the store).

// received is a request as the endpoint saw it.
type received struct {
	Method, URI string
	Header      http.Header
	Body        string
}

// endpoint is a loopback test server that records every request and answers
// with respond.
type endpoint struct {
	*httptest.Server
	mu   sync.Mutex
	seen []received
}

func newEndpoint(t *testing.T, respond func(w http.ResponseWriter, r *http.Request)) *endpoint {
	t.Helper()
	e := &endpoint{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.seen = append(e.seen, received{Method: r.Method, URI: r.RequestURI, Header: r.Header.Clone(), Body: string(b)})
		e.mu.Unlock()
		respond(w, r)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *endpoint) requests() []received {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]received(nil), e.seen...)
}

func (e *endpoint) hostPort() string { return e.Listener.Addr().String() }

// newRunner returns a runner whose guard lets allow through, reading at most
// 4 KiB of a body.
func newRunner(t *testing.T, allow ...string) *httptool.Runner {
	t.Helper()
	c, err := web.NewClient(web.Config{AllowHosts: allow, MaxResponseBytes: 4096})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return httptool.NewRunner(c)
}

// definition is an http tool of config, with side effects and secrets.
func definition(side envelope.SideEffects, config string, secrets ...string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: "weather", Version: "1.0.0", Description: "the weather",
		InputSchema:     json.RawMessage(`{"type":"object"}`),
		Metadata:        envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: side, Cache: envelope.CacheNone},
		Implementation:  envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(config)},
		RequiredSecrets: secrets,
	}
}

func config(url string, extra string) string {
	b, _ := json.Marshal(url)
	if extra == "" {
		return `{"url":` + string(b) + `}`
	}
	return `{"url":` + string(b) + `,` + extra + `}`
}

// callID is a call id, as the pipeline gives the tool.
const callID = "3f1c0a5d9b7e2a4c6d8e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"

func run(t *testing.T, r *httptool.Runner, def envelope.ToolDefinition, input string, auth map[string]string) (json.RawMessage, error) {
	t.Helper()
	tl, err := r.Tool(&def)
	require.NoError(t, err)
	require.Equal(t, def, tl.Definition())
	return tl.Execute(t.Context(), json.RawMessage(input), toolapi.Context{TenantID: "acme", RunID: "run-1", CallID: callID, Auth: auth})
}

func toolError(t *testing.T, err error) *envelope.ToolError {
	t.Helper()
	var te *envelope.ToolError
	require.ErrorAs(t, err, &te)
	return te
}

// TestRequestAsSent: the input arrives byte for byte as the call carried it,
// with the config's headers, its secret headers filled from the call's
// secrets, and the idempotency key on a writes tool only.
func TestRequestAsSent(t *testing.T) {
	srv := newEndpoint(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"city":"Lyon","temp_c":21.5}`)
	})
	r := newRunner(t, srv.hostPort())
	// Spaces, key order and number spelling as the model wrote them.
	input := "{ \"city\" : \"Lyon\",  \"days\": 1.50, \"a\": \"\\u00e9\" }"
	reads := definition(envelope.SideEffectsReads, config(srv.URL+"/v1/weather?units=metric",
		`"headers":{"X-Api-Version":"2"},"secret_headers":{"Authorization":"Bearer {{secret:API_KEY}}","X-Tenant":"t-{{secret:TENANT}}"}`), "API_KEY", "TENANT")

	out, err := run(t, r, reads, input, map[string]string{"API_KEY": "k-123", "TENANT": "acme"})
	require.NoError(t, err)
	require.JSONEq(t, `{"city":"Lyon","temp_c":21.5}`, string(out))
	got := srv.requests()
	require.Len(t, got, 1)
	req := got[0]
	require.Equal(t, "POST", req.Method)
	require.Equal(t, "/v1/weather?units=metric", req.URI)
	require.Equal(t, input, req.Body, "the input as sent")
	require.Equal(t, "application/json", req.Header.Get("Content-Type"))
	require.Equal(t, "application/json", req.Header.Get("Accept"))
	require.Equal(t, web.UserAgent, req.Header.Get("User-Agent"))
	require.Equal(t, "2", req.Header.Get("X-Api-Version"))
	require.Equal(t, "Bearer k-123", req.Header.Get("Authorization"))
	require.Equal(t, "t-acme", req.Header.Get("X-Tenant"))
	require.Empty(t, req.Header.Values("Idempotency-Key"), "a reads tool has no idempotency key")

	// A writes tool, with PUT and its own Accept.
	writes := definition(envelope.SideEffectsWrites, config(srv.URL+"/v1/items/7", `"method":"PUT","headers":{"Accept":"application/vnd.api+json"}`))
	_, err = run(t, r, writes, `{"name":"x"}`, nil)
	require.NoError(t, err)
	req = srv.requests()[1]
	require.Equal(t, "PUT", req.Method)
	require.Equal(t, `{"name":"x"}`, req.Body)
	require.Equal(t, []string{"run-1." + callID}, req.Header.Values("Idempotency-Key"), "the run's call, once")
	require.Equal(t, "application/vnd.api+json", req.Header.Get("Accept"))
}

// TestResponsesMapToCodes: the status and the body decide the outcome, with
// one mapping for every HTTP tool (web.StatusError).
func TestResponsesMapToCodes(t *testing.T) {
	srv := newEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `[1,2,3]`)
		case "/created":
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":7}`)
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/html":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, `<html><body>Welcome</body></html>`)
		case "/binary":
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write([]byte{0xff, 0xfe, 0x00, 0x01})
		case "/big":
			_, _ = io.WriteString(w, `{"rows":"`+strings.Repeat("x", 5000)+`"}`)
		case "/moved":
			http.Redirect(w, r, "/ok", http.StatusFound)
		default: // /<status>
			code := map[string]int{"/400": 400, "/404": 404, "/409": 409, "/422": 422, "/401": 401, "/403": 403,
				"/408": 408, "/429": 429, "/500": 500, "/503": 503}[r.URL.Path]
			if code == 429 || code == 503 {
				w.Header().Set("Retry-After", "7")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = io.WriteString(w, `{"error":"city is required"}`)
		}
	})
	r := newRunner(t, srv.hostPort())
	host := srv.hostPort()
	tests := []struct {
		path    string
		out     string // the output, when the call succeeds
		code    envelope.ErrorCode
		msg     string
		details map[string]any
		retry   float64
	}{
		{path: "/ok", out: `[1,2,3]`},
		{path: "/created", out: `{"id":7}`},
		{path: "/empty", out: `null`},
		{path: "/400", code: envelope.CodeValidation, msg: "weather@1.0.0: " + host + " refused the request: 400 Bad Request",
			details: map[string]any{"status": 400, "body": `{"error":"city is required"}`}},
		{path: "/404", code: envelope.CodeValidation, msg: "refused the request: 404 Not Found"},
		{path: "/409", code: envelope.CodeValidation, msg: "refused the request: 409 Conflict"},
		{path: "/422", code: envelope.CodeValidation, msg: "refused the request: 422 Unprocessable Entity",
			details: map[string]any{"status": 422, "body": `{"error":"city is required"}`}},
		{path: "/401", code: envelope.CodeAuthRequired, msg: "answered 401 Unauthorized: the credentials are missing or were refused"},
		{path: "/403", code: envelope.CodeAuthRequired, msg: "answered 403 Forbidden: the credentials were refused for this request"},
		{path: "/408", code: envelope.CodeTimeout, msg: "answered 408 Request Timeout"},
		{path: "/429", code: envelope.CodeRateLimit, msg: "answered 429 Too Many Requests", retry: 7},
		{path: "/500", code: envelope.CodeProviderError, msg: "weather@1.0.0: " + host + " answered 500 Internal Server Error"},
		{path: "/503", code: envelope.CodeProviderError, msg: "answered 503 Service Unavailable", retry: 7},
		{path: "/moved", code: envelope.CodeProviderError, msg: `answered 302 Found (to "/ok"), and redirects are not followed: register the final URL`},
		{path: "/html", code: envelope.CodeProviderError, msg: "weather@1.0.0: " + host + " answered a body that is not JSON (text/html)",
			details: map[string]any{"status": 200, "content_type": "text/html; charset=utf-8", "body": `<html><body>Welcome</body></html>`}},
		{path: "/binary", code: envelope.CodeProviderError, msg: "answered a body that is not JSON (application/octet-stream)",
			details: map[string]any{"status": 200, "content_type": "application/octet-stream"}},
		{path: "/big", code: envelope.CodeProviderError, msg: "answered a body longer than 4096 bytes, the most the executor reads (TOOLWIRE_HTTP_MAX_RESPONSE_BYTES)",
			details: map[string]any{"status": 200}},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			out, err := run(t, r, definition(envelope.SideEffectsReads, config(srv.URL+tc.path, "")), `{"city":""}`, nil)
			if tc.code == "" {
				require.NoError(t, err)
				require.JSONEq(t, tc.out, string(out))
				return
			}
			require.Nil(t, out)
			te := toolError(t, err)
			require.Equal(t, tc.code, te.Code, te.Message)
			require.Contains(t, te.Message, tc.msg)
			require.InDelta(t, tc.retry, te.RetryAfterS, 0)
			if tc.details != nil {
				b, err := json.Marshal(te.Details)
				require.NoError(t, err)
				want, err := json.Marshal(tc.details)
				require.NoError(t, err)
				require.JSONEq(t, string(want), string(b))
			}
		})
	}
	n := 0
	for _, req := range srv.requests() {
		if req.URI == "/ok" {
			n++
		}
	}
	require.Equal(t, 1, n, "the redirect to /ok was not followed")
}

// TestGuard: the web tools' SSRF guard applies: a loopback endpoint that is
// not allow-listed is refused before anything is sent.
func TestGuard(t *testing.T) {
	srv := newEndpoint(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{}`) })
	def := definition(envelope.SideEffectsWrites, config(srv.URL+"/hook", ""))

	for name, r := range map[string]*httptool.Runner{
		"no allow-list":             newRunner(t),
		"another port allowed":      newRunner(t, "127.0.0.1:1"),
		"another host allowed":      newRunner(t, "api.internal"),
		"its name, not its address": newRunner(t, "localhost"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := run(t, r, def, `{}`, nil)
			te := toolError(t, err)
			require.Equal(t, envelope.CodePolicyDenied, te.Code)
			require.Equal(t, "weather@1.0.0: destination 127.0.0.1 is a loopback address: refused (allow it with TOOLWIRE_HTTP_ALLOW_HOSTS)", te.Message)
		})
	}
	require.Empty(t, srv.requests(), "nothing was sent")

	// Allowed, but nothing listens there: a network error.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	_, err = run(t, newRunner(t, closed), definition(envelope.SideEffectsReads, config("http://"+closed+"/", "")), `{}`, nil)
	te := toolError(t, err)
	require.Equal(t, envelope.CodeNetworkError, te.Code)
	require.Contains(t, te.Message, "weather@1.0.0: request to http://"+closed+"/")
	require.Contains(t, te.Message, "connection refused")
}

// TestSecretNotResolved: a secret header whose secret the call did not get
// is AUTH_REQUIRED, and nothing is sent.
func TestSecretNotResolved(t *testing.T) {
	srv := newEndpoint(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{}`) })
	def := definition(envelope.SideEffectsReads, config(srv.URL, `"secret_headers":{"Authorization":"Bearer {{secret:API_KEY}}"}`), "API_KEY")
	_, err := run(t, newRunner(t, srv.hostPort()), def, `{}`, map[string]string{})
	te := toolError(t, err)
	require.Equal(t, envelope.CodeAuthRequired, te.Code)
	require.Contains(t, te.Message, `weather@1.0.0: secret "API_KEY" is not available to this tool`)
	require.Empty(t, srv.requests())
}

// TestContextEndsTheCall: the call's context bounds the request, its body
// included (the executor gives it the tool's timeout, and answers TIMEOUT
// with its cause): whether the endpoint has not answered yet or its body is
// still dripping in, the call ends with the context's cause.
func TestContextEndsTheCall(t *testing.T) {
	tests := []struct {
		name    string
		respond func(w http.ResponseWriter, r *http.Request, arrived chan<- struct{})
	}{
		{name: "before the headers", respond: func(_ http.ResponseWriter, r *http.Request, arrived chan<- struct{}) {
			close(arrived)
			<-r.Context().Done()
		}},
		{name: "while the body drips in", respond: func(w http.ResponseWriter, r *http.Request, arrived chan<- struct{}) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			rc := http.NewResponseController(w)
			for i := 0; ; i++ {
				if _, err := w.Write([]byte(" ")); err != nil {
					return
				}
				if err := rc.Flush(); err != nil {
					return
				}
				if i == 2 {
					close(arrived) // the headers and some of the body are out
				}
				select {
				case <-r.Context().Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			arrived := make(chan struct{})
			srv := newEndpoint(t, func(w http.ResponseWriter, r *http.Request) { tc.respond(w, r, arrived) })
			def := definition(envelope.SideEffectsReads, config(srv.URL, ""))
			tl, err := newRunner(t, srv.hostPort()).Tool(&def)
			require.NoError(t, err)
			cause := errors.New("tool timeout")
			ctx, cancel := context.WithCancelCause(t.Context())
			go func() {
				<-arrived
				cancel(cause)
			}()
			_, err = tl.Execute(ctx, json.RawMessage(`{}`), toolapi.Context{CallID: callID})
			require.ErrorIs(t, err, cause)
		})
	}
}

// TestUnrunnableEntries: an entry whose config cannot run (stored before
// configs were checked) is refused with the reason.
func TestUnrunnableEntries(t *testing.T) {
	r := newRunner(t)
	for cfg, want := range map[string]string{
		``:                                   `implementation.config: an http tool needs {"url": ...}`,
		`{"url":"ftp://files.example/x"}`:    `url "ftp://files.example/x": scheme must be http or https`,
		`{"url":"https://u:p@a.example/"}`:   "credentials in the URL are not accepted",
		`{"url":"http://1.2.3.4.5/"}`:        `host "1.2.3.4.5" is not a domain name`,
		`{"url":"https://a.example/","x":1}`: `unknown field "x"`,
	} {
		def := definition(envelope.SideEffectsReads, cfg)
		_, err := r.Tool(&def)
		require.ErrorContains(t, err, want, cfg)
	}
	def := definition(envelope.SideEffectsReads, `{"url":"https://a.example/"}`)
	def.Implementation.Kind = envelope.ImplBuiltin
	_, err := r.Tool(&def)
	require.ErrorContains(t, err, `implementation kind "builtin" is not http`)
}

// TestPreview: the dry run of an http entry is the exact request a call
// would send (method, URL, headers, the body byte for byte, the idempotency
// key), its secrets named and never their values, and nothing is sent.
func TestPreview(t *testing.T) {
	srv := newEndpoint(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{}`) })
	r := newRunner(t, srv.hostPort())
	def := definition(envelope.SideEffectsWrites, config(srv.URL+"/v1/invoices?draft=false",
		`"headers":{"X-Api-Version":"2"},"secret_headers":{"Authorization":"Bearer {{secret:BILLING_KEY}}"}`), "BILLING_KEY")
	tl, err := r.Tool(&def)
	require.NoError(t, err)
	pv, ok := tl.(toolapi.Previewer)
	require.True(t, ok, "every http entry can be previewed")
	input := `{"customer": "c-1", "amount": 12.50}`
	out, err := pv.Preview(t.Context(), json.RawMessage(input), toolapi.Context{TenantID: "acme", RunID: "run-1", CallID: callID, Auth: map[string]string{"BILLING_KEY": "sk-live-verysecret"}})
	require.NoError(t, err)
	require.NotContains(t, string(out), "sk-live-verysecret")
	var p web.RequestPreview
	require.NoError(t, json.Unmarshal(out, &p))
	require.True(t, p.DryRun)
	require.Equal(t, "POST", p.Method)
	require.Equal(t, srv.URL+"/v1/invoices?draft=false", p.URL)
	require.Equal(t, "Bearer [secret BILLING_KEY]", p.Headers["Authorization"])
	require.Equal(t, "2", p.Headers["X-Api-Version"])
	require.Equal(t, "application/json", p.Headers["Content-Type"])
	require.Equal(t, "run-1."+callID, p.Headers["Idempotency-Key"])
	require.Equal(t, []string{"BILLING_KEY"}, p.Secrets)
	require.Equal(t, input, p.Body, "the body as it would be sent, byte for byte")
	require.Empty(t, srv.requests(), "a dry run sends nothing")

	// A secret it could not resolve: the call would fail, and so does its preview.
	_, err = pv.Preview(t.Context(), json.RawMessage(input), toolapi.Context{TenantID: "acme", RunID: "run-1", CallID: callID})
	require.Equal(t, envelope.CodeAuthRequired, toolError(t, err).Code)
}

// TestPreviewEndpoint: an http tool with a preview_url asks it, with the
// call's input and the same secret headers, and shows its answer beside the
// request the call would send; the tool's endpoint itself is not called.
// A preview_url on another origin is refused when the tool is registered.
func TestPreviewEndpoint(t *testing.T) {
	srv := newEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/invoices/preview" {
			_, _ = io.WriteString(w, `{"would_charge": 12.5, "currency": "EUR"}`)
			return
		}
		_, _ = io.WriteString(w, `{"invoice_id": "inv-1"}`)
	})
	r := newRunner(t, srv.hostPort())
	def := definition(envelope.SideEffectsWrites, config(srv.URL+"/v1/invoices",
		`"preview_url":`+strconv.Quote(srv.URL+"/v1/invoices/preview")+`,"secret_headers":{"Authorization":"Bearer {{secret:BILLING_KEY}}"}`), "BILLING_KEY")
	tl, err := r.Tool(&def)
	require.NoError(t, err)
	out, err := tl.(toolapi.Previewer).Preview(t.Context(), json.RawMessage(`{"customer":"c-1"}`),
		toolapi.Context{TenantID: "acme", RunID: "run-1", CallID: callID, Auth: map[string]string{"BILLING_KEY": "sk-live-x"}})
	require.NoError(t, err)
	var p web.RequestPreview
	require.NoError(t, json.Unmarshal(out, &p))
	require.Equal(t, srv.URL+"/v1/invoices", p.URL, "the request the call would send")
	require.JSONEq(t, `{"would_charge": 12.5, "currency": "EUR"}`, string(p.EndpointPreview))
	got := srv.requests()
	require.Len(t, got, 1, "only the preview endpoint was asked")
	require.Equal(t, "/v1/invoices/preview", got[0].URI)
	require.Equal(t, `{"customer":"c-1"}`, got[0].Body)
	require.Equal(t, "Bearer sk-live-x", got[0].Header.Get("Authorization"), "the secret goes to the endpoint's origin only")

	elsewhere := definition(envelope.SideEffectsWrites, config(srv.URL+"/v1/invoices", `"preview_url":"https://preview.example.com/p"`))
	require.ErrorContains(t, elsewhere.Validate(), "is not on the origin of url")
}

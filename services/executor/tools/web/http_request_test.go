package web

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// testResolver maps test names to addresses. Every other name fails as not
// found, except localhost, which the system resolves (from /etc/hosts): the
// tests send no DNS query.
type testResolver map[string][]netip.Addr

func (r testResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, ok := r[host]; ok {
		return a, nil
	}
	if host == "localhost" {
		return (&net.Resolver{}).LookupNetIP(ctx, network, host)
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

var testNames = testResolver{
	"rebind.test":   addrs("127.0.0.1"),
	"metadata.test": addrs("169.254.169.254"),
	"mixed.test":    addrs("::1", "169.254.169.254", "127.0.0.1"),
	"v6only.test":   addrs("::"),
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Resolver == nil {
		cfg.Resolver = testNames
	}
	c, err := NewClient(cfg)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// counted is a test server that counts the requests it receives.
type counted struct {
	*httptest.Server
	hits atomic.Int64
}

func newCounted(t *testing.T, h http.HandlerFunc) *counted {
	t.Helper()
	c := &counted{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *counted) hostPort() string { return c.Listener.Addr().String() }

// runTool runs a tool's Execute with a test deadline and returns its output
// or its ToolError.
func runTool(t *testing.T, tl toolapi.Tool, input string, auth map[string]string) (map[string]any, *envelope.ToolError) {
	t.Helper()
	return runToolIn(t, tl, input, toolapi.Context{Auth: auth})
}

// runToolIn is runTool with the call's context (tenant acme).
func runToolIn(t *testing.T, tl toolapi.Tool, input string, tc toolapi.Context) (map[string]any, *envelope.ToolError) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tc.TenantID = "acme"
	out, err := tl.Execute(ctx, json.RawMessage(input), tc)
	if err != nil {
		var te *envelope.ToolError
		require.ErrorAs(t, err, &te, "a ToolError, got %v", err)
		return nil, te
	}
	var m map[string]any
	require.NoError(t, json.Unmarshal(out, &m))
	return m, nil
}

func input(v map[string]any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestSSRFBypassesAreRefused is the SSRF test: every classic bypass is
// refused with a clear POLICY_DENIED before any connection is made, while an
// allowed test server still answers, and a redirect from it to a refused
// destination is refused too.
func TestSSRFBypassesAreRefused(t *testing.T) {
	allowed := newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); to != "" {
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"hello":"from the allowed server"}`)
	})
	// A server the allow-list does not name: nothing may reach it.
	forbidden := newCounted(t, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "you should not see this")
	})
	_, forbiddenPort, err := net.SplitHostPort(forbidden.hostPort())
	require.NoError(t, err)

	web := newTestClient(t, Config{AllowHosts: []string{allowed.hostPort()}})
	get := httpTool{web: web, getOnly: true, now: time.Now}
	req := httpTool{web: web, now: time.Now}

	// The allowed server works.
	out, te := runTool(t, get, input(map[string]any{"url": allowed.URL + "/ok"}), nil)
	require.Nil(t, te)
	require.EqualValues(t, 200, out["status"])
	require.Equal(t, map[string]any{"hello": "from the allowed server"}, out["body"])
	require.Equal(t, "json", out["body_encoding"])
	connectsAfterAllowed := web.dialer.connects.Load()
	require.Positive(t, connectsAfterAllowed)

	const hint = ": refused (allow it with TOOLWIRE_HTTP_ALLOW_HOSTS)"
	cases := []struct {
		name, url, want string
	}{
		{"decimal", "http://2130706433/", "destination 2130706433 (127.0.0.1) is a loopback address" + hint},
		{"octal", "http://0177.0.0.1/", "destination 0177.0.0.1 (127.0.0.1) is a loopback address" + hint},
		{"hex", "http://0x7f000001/", "destination 0x7f000001 (127.0.0.1) is a loopback address" + hint},
		{"hex dotted", "http://0x7f.0x0.0x0.0x1/", "destination 0x7f.0x0.0x0.0x1 (127.0.0.1) is a loopback address" + hint},
		{"short 127.1", "http://127.1/", "destination 127.1 (127.0.0.1) is a loopback address" + hint},
		{"zero", "http://0.0.0.0/", "destination 0.0.0.0 is an unspecified address" + hint},
		{"zero short", "http://0/", "destination 0 (0.0.0.0) is an unspecified address" + hint},
		{"IPv6 unspecified", "http://[::]/", "destination :: is an unspecified address" + hint},
		{"IPv6 loopback", "http://[::1]/", "destination ::1 is a loopback address" + hint},
		{"IPv4-mapped IPv6", "http://[::ffff:127.0.0.1]/", "destination ::ffff:127.0.0.1 is an IPv4-mapped IPv6 address (of 127.0.0.1, a loopback address)" + hint},
		{"IPv4-mapped IPv6 in hex", "http://[::ffff:7f00:1]/", "destination ::ffff:7f00:1 (::ffff:127.0.0.1) is an IPv4-mapped IPv6 address (of 127.0.0.1, a loopback address)" + hint},
		{"IPv4-mapped metadata", "http://[::ffff:a9fe:a9fe]/", "is an IPv4-mapped IPv6 address (of 169.254.169.254, the cloud metadata address)" + hint},
		{"loopback with the allowed address on another port", "http://127.0.0.1:" + forbiddenPort + "/", "destination 127.0.0.1 is a loopback address" + hint},
		{"other loopback address", "http://127.0.0.2/", "destination 127.0.0.2 is a loopback address" + hint},
		{"name resolving to loopback (system resolver)", "http://localhost/", "destination localhost (127.0.0.1) is a loopback address" + hint},
		{"name resolving to loopback (with a trailing dot)", "http://localhost./", "destination localhost. (127.0.0.1) is a loopback address" + hint},
		{"name resolving to loopback (test resolver)", "http://rebind.test/", "destination rebind.test (127.0.0.1) is a loopback address" + hint},
		{"name resolving only to refused addresses", "http://mixed.test/", "destination mixed.test (::1) is a loopback address" + hint},
		{"name resolving to unspecified", "http://v6only.test/", "destination v6only.test (::) is an unspecified address" + hint},
		{"metadata", "http://169.254.169.254/latest/meta-data/", "destination 169.254.169.254 is the cloud metadata address" + hint},
		{"metadata in decimal", "http://2852039166/", "destination 2852039166 (169.254.169.254) is the cloud metadata address" + hint},
		{"metadata by name", "http://metadata.test/computeMetadata/v1/", "destination metadata.test (169.254.169.254) is the cloud metadata address" + hint},
		{"IPv6 metadata", "http://[fd00:ec2::254]/", "destination fd00:ec2::254 is the cloud metadata address" + hint},
		{"https too", "https://127.0.0.1/", "destination 127.0.0.1 is a loopback address" + hint},
		{"redirect to loopback", allowed.URL + "/?to=" + forbidden.URL + "/", "destination 127.0.0.1 is a loopback address" + hint},
		{"redirect to loopback by name", allowed.URL + "/?to=http://localhost:" + forbiddenPort + "/", "destination localhost (127.0.0.1) is a loopback address" + hint},
		{"redirect to hex loopback", allowed.URL + "/?to=http://0x7f000001:" + forbiddenPort + "/", "destination 0x7f000001 (127.0.0.1) is a loopback address" + hint},
		{"redirect to IPv6 loopback", allowed.URL + "/?to=http://[::1]:" + forbiddenPort + "/", "destination ::1 is a loopback address" + hint},
		{"redirect to metadata", allowed.URL + "/?to=http://169.254.169.254/latest/meta-data/", "destination 169.254.169.254 is the cloud metadata address" + hint},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hitsBefore := allowed.hits.Load()
			for _, tl := range []toolapi.Tool{get, req} {
				_, te := runTool(t, tl, input(map[string]any{"url": c.url}), nil)
				require.NotNil(t, te, "%s must be refused", c.url)
				require.Equal(t, envelope.CodePolicyDenied, te.Code, te.Message)
				require.Contains(t, te.Message, c.want)
			}
			if !strings.HasPrefix(c.url, allowed.URL) {
				require.Equal(t, hitsBefore, allowed.hits.Load())
			}
		})
	}
	require.Zero(t, forbidden.hits.Load(), "the forbidden server received nothing")
	// Only the allowed server was ever connected to (keep-alive connections
	// are reused, so the count is the allowed server's connections alone).
	require.LessOrEqual(t, web.dialer.connects.Load(), connectsAfterAllowed+int64(len(cases))*2)
	require.Zero(t, forbidden.hits.Load())

	// And nothing at all is dialled for a refused destination.
	fresh := newTestClient(t, Config{})
	for _, u := range []string{"http://169.254.169.254/", "http://2130706433/", "http://[::ffff:127.0.0.1]/", "http://localhost/", "http://metadata.test/"} {
		_, te := runTool(t, httpTool{web: fresh, getOnly: true, now: time.Now}, input(map[string]any{"url": u}), nil)
		require.Equal(t, envelope.CodePolicyDenied, te.Code, u)
	}
	require.Zero(t, fresh.dialer.connects.Load(), "no socket was connected for a refused destination")
}

// TestSSRFIgnoresProxyEnvironment: a proxy in the environment would dial for
// the tool out of the guard's sight; the client never uses one.
func TestSSRFIgnoresProxyEnvironment(t *testing.T) {
	proxy := newCounted(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "proxied") })
	target := newCounted(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "direct") })
	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("http_proxy", proxy.URL)
	t.Setenv("NO_PROXY", "")
	web := newTestClient(t, Config{AllowHosts: []string{target.hostPort()}})
	out, te := runTool(t, httpTool{web: web, getOnly: true, now: time.Now}, input(map[string]any{"url": target.URL}), nil)
	require.Nil(t, te)
	require.Equal(t, "direct", out["body"])
	require.Zero(t, proxy.hits.Load())

	// A refused destination is refused, not handed to the proxy.
	_, te = runTool(t, httpTool{web: web, getOnly: true, now: time.Now}, input(map[string]any{"url": "http://169.254.169.254/"}), nil)
	require.Equal(t, envelope.CodePolicyDenied, te.Code)
	require.Zero(t, proxy.hits.Load())
}

func TestHTTPErrorMapping(t *testing.T) {
	date := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	srv := newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/500":
			http.Error(w, "database on fire", http.StatusInternalServerError)
		case "/503":
			w.Header().Set("Retry-After", "7")
			http.Error(w, "maintenance", http.StatusServiceUnavailable)
		case "/429":
			w.Header().Set("Retry-After", "3")
			http.Error(w, "slow down", http.StatusTooManyRequests)
		case "/429-date":
			w.Header().Set("Retry-After", date.Add(90*time.Second).Format(http.TimeFormat))
			http.Error(w, "slow down", http.StatusTooManyRequests)
		case "/429-bare":
			w.WriteHeader(http.StatusTooManyRequests)
		case "/401":
			http.Error(w, "who are you", http.StatusUnauthorized)
		case "/404":
			http.Error(w, "no such thing", http.StatusNotFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		}
	})
	// A port nothing listens on, allowed: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := ln.Addr().String()
	require.NoError(t, ln.Close())

	web := newTestClient(t, Config{AllowHosts: []string{srv.hostPort(), closedAddr}})
	tl := httpTool{web: web, now: func() time.Time { return date }}

	cases := []struct {
		name, url  string
		code       envelope.ErrorCode
		msg        string
		retryAfter float64
		details    map[string]any
	}{
		{name: "5xx", url: srv.URL + "/500", code: envelope.CodeProviderError, msg: "answered 500 Internal Server Error",
			details: map[string]any{"status": float64(500), "body": "database on fire\n"}},
		{name: "503 with Retry-After", url: srv.URL + "/503", code: envelope.CodeProviderError, msg: "answered 503 Service Unavailable", retryAfter: 7},
		{name: "429 with Retry-After seconds", url: srv.URL + "/429", code: envelope.CodeRateLimit, msg: "answered 429 Too Many Requests", retryAfter: 3},
		{name: "429 with Retry-After date", url: srv.URL + "/429-date", code: envelope.CodeRateLimit, msg: "answered 429 Too Many Requests", retryAfter: 90},
		{name: "429 without Retry-After", url: srv.URL + "/429-bare", code: envelope.CodeRateLimit, msg: "answered 429"},
		{name: "401", url: srv.URL + "/401", code: envelope.CodeAuthRequired, msg: "the credentials are missing or were refused"},
		{name: "connection refused on an allowed port", url: "http://" + closedAddr + "/", code: envelope.CodeNetworkError, msg: "connection refused"},
		{name: "DNS failure", url: "http://no-such-host.test/", code: envelope.CodeNetworkError, msg: "cannot resolve no-such-host.test: no such host"},
		{name: "too many redirects", url: srv.URL + "/loop", code: envelope.CodeProviderError, msg: "stopped after 5 redirects"},
		{name: "not http", url: "file:///etc/passwd", code: envelope.CodeValidation, msg: "scheme must be http or https"},
		{name: "credentials in the URL", url: "http://user:pw@" + srv.hostPort() + "/", code: envelope.CodeValidation, msg: "credentials in the URL are not accepted"},
		{name: "five-part IPv4", url: "http://1.2.3.4.5/", code: envelope.CodeValidation, msg: "at most four parts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, te := runTool(t, tl, input(map[string]any{"url": c.url}), nil)
			require.NotNil(t, te)
			require.Equal(t, c.code, te.Code, te.Message)
			require.Contains(t, te.Message, c.msg)
			require.InDelta(t, c.retryAfter, te.RetryAfterS, 0.001)
			if c.details != nil {
				b, err := json.Marshal(te.Details)
				require.NoError(t, err)
				var got map[string]any
				require.NoError(t, json.Unmarshal(b, &got))
				require.Equal(t, c.details, got)
			}
		})
	}
	hits := srv.hits.Load()
	_, _ = runTool(t, tl, input(map[string]any{"url": srv.URL + "/loop"}), nil)
	require.EqualValues(t, 6, srv.hits.Load()-hits, "the first request and 5 redirects")

	// A 404 is data, not a failure.
	out, te := runTool(t, tl, input(map[string]any{"url": srv.URL + "/404"}), nil)
	require.Nil(t, te)
	require.EqualValues(t, 404, out["status"])
	require.Equal(t, "no such thing\n", out["body"])
}

func TestHTTPRequestMethodsBodiesAndCaps(t *testing.T) {
	type seen struct {
		method, ctype, body, ua string
	}
	got := make(chan seen, 16)
	srv := newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.Header.Get("Content-Type"), string(b), r.Header.Get("User-Agent")}
		switch r.URL.Path {
		case "/big":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"data":"`+strings.Repeat("a", 3<<20)+`"}`)
		case "/binary":
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write([]byte{0xff, 0xfe, 0x00, 0x01})
		default:
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.Header().Add("X-Multi", "a")
			w.Header().Add("X-Multi", "b")
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, `{"method":%q}`, r.Method)
		}
	})
	web := newTestClient(t, Config{AllowHosts: []string{srv.hostPort()}})
	tl := httpTool{web: web, now: time.Now}

	out, te := runTool(t, tl, input(map[string]any{"method": "POST", "url": srv.URL + "/items", "body": map[string]any{"name": "x"}}), nil)
	require.Nil(t, te)
	s := <-got
	require.Equal(t, seen{"POST", "application/json", `{"name":"x"}`, UserAgent}, s)
	require.EqualValues(t, 201, out["status"])
	require.Equal(t, map[string]any{"method": "POST"}, out["body"])
	require.Equal(t, "a, b", out["headers"].(map[string]any)["X-Multi"])
	require.Equal(t, false, out["truncated"])

	_, te = runTool(t, tl, input(map[string]any{"method": "PUT", "url": srv.URL + "/items/1", "body": "plain text", "headers": map[string]any{"Content-Type": "text/plain", "User-Agent": "mine"}}), nil)
	require.Nil(t, te)
	require.Equal(t, seen{"PUT", "text/plain", "plain text", "mine"}, <-got)

	_, te = runTool(t, tl, input(map[string]any{"method": "GET", "url": srv.URL, "body": "x"}), nil)
	require.Equal(t, envelope.CodeValidation, te.Code)
	require.Contains(t, te.Message, "a GET request has no body")

	for _, h := range []map[string]any{{"Host": "evil"}, {"Content-Length": "1"}, {"Bad Name": "x"}, {"X-Ok": "line\r\nbreak"}, {"Proxy-Authorization": "x"}} {
		_, te = runTool(t, tl, input(map[string]any{"url": srv.URL, "headers": h}), nil)
		require.Equal(t, envelope.CodeValidation, te.Code, "%v", h)
	}

	// The response cap: 3 MiB of JSON is cut at 2 MiB, as text.
	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/big"}), nil)
	require.Nil(t, te)
	<-got
	require.Equal(t, true, out["truncated"])
	require.EqualValues(t, DefaultMaxResponseBytes, out["bytes"])
	require.Equal(t, "text", out["body_encoding"])
	require.Len(t, out["body"], DefaultMaxResponseBytes)

	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/binary"}), nil)
	require.Nil(t, te)
	<-got
	require.Equal(t, "base64", out["body_encoding"])
	require.Equal(t, "//4AAQ==", out["body"])

	// A smaller cap from the configuration.
	small := newTestClient(t, Config{AllowHosts: []string{srv.hostPort()}, MaxResponseBytes: 10})
	out, te = runTool(t, httpTool{web: small, getOnly: true, now: time.Now}, input(map[string]any{"url": srv.URL}), nil)
	require.Nil(t, te)
	<-got
	require.Equal(t, true, out["truncated"])
	require.Equal(t, `{"method":`, out["body"])
}

func TestHTTPSecretHeaders(t *testing.T) {
	const token = "s3cr3t-t0ken-value"
	other := newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "auth=%q key=%q", r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"))
	})
	srv := newCounted(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/away" {
			http.Redirect(w, r, other.URL+"/landed", http.StatusFound)
			return
		}
		if r.URL.Path == "/here" {
			http.Redirect(w, r, "/echo", http.StatusFound)
			return
		}
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"authorization": r.Header.Get("Authorization"), "key": r.Header.Get("X-Api-Key")})
	})
	web := newTestClient(t, Config{AllowHosts: []string{srv.hostPort(), other.hostPort()}})
	tl := httpTool{web: web, getOnly: true, now: time.Now}
	auth := map[string]string{"API_TOKEN": token, "KEY": "k-123456"}
	// Both secrets are bound to srv (and only to srv: TestSecretDestinations).
	bound := toolapi.Context{Auth: auth, SecretDestinations: map[string]envelope.SecretBinding{
		"API_TOKEN": {Hosts: []string{"http://" + srv.hostPort()}, Headers: []string{"Authorization"}},
		"KEY":       {Hosts: []string{"http://" + srv.hostPort()}, Headers: []string{"X-Api-Key"}},
	}}
	runTool := func(t *testing.T, tl toolapi.Tool, input string, auth map[string]string) (map[string]any, *envelope.ToolError) {
		t.Helper()
		tc := bound
		tc.Auth = auth
		return runToolIn(t, tl, input, tc)
	}
	secretHeaders := map[string]any{"Authorization": "Bearer {{secret:API_TOKEN}}", "X-Api-Key": "{{ secret:KEY }}"}

	out, te := runTool(t, tl, input(map[string]any{"url": srv.URL + "/echo", "secret_headers": secretHeaders}), auth)
	require.Nil(t, te)
	raw, err := json.Marshal(out)
	require.NoError(t, err)
	require.NotContains(t, string(raw), token, "a secret echoed back is redacted")
	require.NotContains(t, string(raw), "k-123456")
	require.Equal(t, map[string]any{"authorization": "Bearer " + redacted, "key": redacted}, out["body"], "the server received the secrets")
	require.Equal(t, "Bearer "+redacted, out["headers"].(map[string]any)["X-Echo"])

	// A redirect on the same host keeps them; one to another host drops them.
	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/here", "secret_headers": secretHeaders}), auth)
	require.Nil(t, te)
	require.Equal(t, map[string]any{"authorization": "Bearer " + redacted, "key": redacted}, out["body"])
	out, te = runTool(t, tl, input(map[string]any{"url": srv.URL + "/away", "secret_headers": secretHeaders}), auth)
	require.Nil(t, te)
	require.Equal(t, `auth="" key=""`, out["body"])

	_, te = runTool(t, tl, input(map[string]any{"url": srv.URL, "secret_headers": map[string]any{"Authorization": "Bearer {{secret:MISSING}}"}}), auth)
	require.Equal(t, envelope.CodeAuthRequired, te.Code)
	require.Contains(t, te.Message, `secret "MISSING" is not available to this tool`)

	_, te = runTool(t, tl, input(map[string]any{"url": srv.URL, "headers": map[string]any{"Authorization": "Bearer {{secret:API_TOKEN}}"}}), auth)
	require.Equal(t, envelope.CodeValidation, te.Code)
	require.Contains(t, te.Message, "put it in secret_headers")

	_, te = runTool(t, tl, input(map[string]any{"url": srv.URL, "secret_headers": map[string]any{"Authorization": "Bearer plain"}}), auth)
	require.Equal(t, envelope.CodeValidation, te.Code)
}

// TestHTTPRequestPreview: the dry run of http_request is the request it
// would send, checked as the call is (a secret bound elsewhere is refused),
// with its secret headers named, never filled; nothing is sent.
func TestHTTPRequestPreview(t *testing.T) {
	srv := newCounted(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "{}") })
	c := newTestClient(t, Config{AllowHosts: []string{srv.hostPort()}})
	tl := httpTool{web: c, now: time.Now}
	require.True(t, tl.Definition().SupportsPreview)
	const token = "s3cr3t-t0ken-value"
	tc := toolapi.Context{Auth: map[string]string{"API_TOKEN": token}, SecretDestinations: map[string]envelope.SecretBinding{
		"API_TOKEN": {Hosts: []string{"http://" + srv.hostPort()}, Headers: []string{"Authorization"}},
	}}
	in := input(map[string]any{"method": "POST", "url": srv.URL + "/v1/issues", "headers": map[string]any{"Accept": "application/json"},
		"secret_headers": map[string]any{"Authorization": "Bearer {{secret:API_TOKEN}}"}, "body": map[string]any{"title": "bug"}})
	out, err := tl.Preview(t.Context(), json.RawMessage(in), tc)
	require.NoError(t, err)
	require.NotContains(t, string(out), token)
	var p RequestPreview
	require.NoError(t, json.Unmarshal(out, &p))
	require.Equal(t, RequestPreview{DryRun: true, Method: "POST", URL: srv.URL + "/v1/issues", Body: `{"title":"bug"}`, Secrets: []string{"API_TOKEN"},
		Headers: map[string]string{"Accept": "application/json", "Authorization": "Bearer [secret API_TOKEN]", "Content-Type": "application/json", "User-Agent": UserAgent}}, p)
	require.Zero(t, srv.hits.Load(), "a dry run sends nothing")

	// Bound elsewhere: the call would be refused, and so is its preview.
	tc.SecretDestinations["API_TOKEN"] = envelope.SecretBinding{Hosts: []string{"https://api.example.com"}, Headers: []string{"Authorization"}}
	_, err = tl.Preview(t.Context(), json.RawMessage(in), tc)
	var te *envelope.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodePolicyDenied, te.Code)
	require.Zero(t, srv.hits.Load())
}

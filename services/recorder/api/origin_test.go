package api_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// TestCookieAdminOrigin: a state-changing API request authenticated by the
// session cookie (here an admin's) is refused with 403 JSON, and changes
// nothing, unless it comes from the recorder's own origin (scheme, host and
// port exactly): another port of the same host and a sibling subdomain are
// the same site for the browser, which sends the SameSite=Lax cookie, but
// not the same origin. The same origin succeeds, and a bearer token needs
// no origin at all.
func TestCookieAdminOrigin(t *testing.T) {
	h := newCatalogHarness(t, adminToken)
	srvURL, err := url.Parse(h.srv.URL)
	require.NoError(t, err)
	own := "http://" + srvURL.Host
	otherPort := "http://127.0.0.1:1" // same site, another port
	if srvURL.Port() == "1" {
		otherPort = "http://127.0.0.1:2"
	}
	type req struct {
		host    string // the Host the browser addressed; "" the test server's
		cookie  bool   // the admin token as the session cookie
		bearer  bool   // the admin token as a bearer token
		headers map[string]string
	}
	send := func(method, path, body string, rq req) (int, []byte) {
		t.Helper()
		r, err := http.NewRequestWithContext(t.Context(), method, h.srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		r.Header.Set("Content-Type", "application/json")
		if rq.host != "" {
			r.Host = rq.host
		}
		if rq.cookie {
			r.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: adminToken})
		}
		if rq.bearer {
			r.Header.Set("Authorization", "Bearer "+adminToken)
		}
		for k, v := range rq.headers {
			r.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		return resp.StatusCode, b
	}
	register := func(name string, rq req) (int, []byte) {
		t.Helper()
		def, err := json.Marshal(catalogDef(name, "1.0.0", envelope.CategoryAPI))
		require.NoError(t, err)
		return send(http.MethodPost, "/v1/admin/tools", string(def), rq)
	}
	registered := func(name string) bool {
		t.Helper()
		def := catalogDef(name, "1.0.0", envelope.CategoryAPI)
		_, err := h.reg.Get(t.Context(), def.Ref())
		if errors.Is(err, registry.ErrNotFound) {
			return false
		}
		require.NoError(t, err)
		return true
	}

	for i, tc := range []struct {
		name string
		rq   req
	}{
		{"another port of the same host", req{cookie: true, headers: map[string]string{"Origin": otherPort}}},
		{"another port, as Sec-Fetch-Site says", req{cookie: true, headers: map[string]string{"Sec-Fetch-Site": "same-site", "Origin": otherPort}}},
		{"another port, by its Referer only", req{cookie: true, headers: map[string]string{"Referer": otherPort + "/page"}}},
		{"a sibling subdomain", req{host: "recorder.example.com", cookie: true, headers: map[string]string{"Origin": "http://evil.example.com"}}},
		{"a sibling subdomain, Sec-Fetch-Site only", req{host: "recorder.example.com", cookie: true, headers: map[string]string{"Sec-Fetch-Site": "same-site"}}},
		{"a parent domain", req{host: "recorder.example.com", cookie: true, headers: map[string]string{"Origin": "http://example.com"}}},
		{"another scheme", req{host: "recorder.example.com", cookie: true, headers: map[string]string{"Origin": "https://recorder.example.com"}}},
		{"behind TLS, a plain-HTTP page", req{host: "recorder.example.com", cookie: true,
			headers: map[string]string{"X-Forwarded-Proto": "https", "Origin": "http://recorder.example.com"}}},
		{"a cross-site page", req{cookie: true, headers: map[string]string{"Sec-Fetch-Site": "cross-site"}}},
		{"an opaque origin", req{cookie: true, headers: map[string]string{"Origin": "null"}}},
		{"no origin at all", req{cookie: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("refused_%d", i)
			status, b := register(name, tc.rq)
			require.Equal(t, http.StatusForbidden, status, string(b))
			require.Contains(t, string(b), `"code":"forbidden"`)
			require.Contains(t, string(b), "cross-origin request refused")
			require.False(t, registered(name), "a refused request registered the tool")
		})
	}
	// The state route is guarded the same way.
	status, b := register("stateful", req{bearer: true})
	require.Equal(t, http.StatusCreated, status, string(b))
	status, b = send(http.MethodPut, "/v1/admin/tools/stateful@1.0.0/state", `{"state":"blocked"}`,
		req{cookie: true, headers: map[string]string{"Origin": otherPort}})
	require.Equal(t, http.StatusForbidden, status, string(b))
	def := catalogDef("stateful", "1.0.0", envelope.CategoryAPI)
	e, err := h.reg.Get(t.Context(), def.Ref())
	require.NoError(t, err)
	require.Equal(t, registry.StateActive, e.State)

	for i, tc := range []struct {
		name string
		rq   req
	}{
		{"the same origin", req{cookie: true, headers: map[string]string{"Origin": own, "Sec-Fetch-Site": "same-origin"}}},
		{"the same origin, Origin only", req{cookie: true, headers: map[string]string{"Origin": own}}},
		{"the same origin, Sec-Fetch-Site only", req{cookie: true, headers: map[string]string{"Sec-Fetch-Site": "same-origin"}}},
		{"the same origin, Referer only", req{cookie: true, headers: map[string]string{"Referer": own + "/runs/r1"}}},
		{"the same named host", req{host: "Recorder.Example.com:80", cookie: true, headers: map[string]string{"Origin": "http://recorder.example.com"}}},
		{"behind a TLS proxy", req{host: "recorder.example.com", cookie: true,
			headers: map[string]string{"X-Forwarded-Proto": "https", "Origin": "https://recorder.example.com"}}},
		{"behind a proxy saying Forwarded", req{host: "recorder.example.com", cookie: true,
			headers: map[string]string{"Forwarded": `for=10.0.0.1;proto=https`, "Origin": "https://recorder.example.com"}}},
		{"a bearer token", req{bearer: true}},
		{"a bearer token from another origin", req{bearer: true, headers: map[string]string{"Origin": otherPort}}},
		{"a bearer token beside a cookie", req{bearer: true, cookie: true, headers: map[string]string{"Origin": "http://evil.example.com"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("accepted_%d", i)
			status, b := register(name, tc.rq)
			require.Equal(t, http.StatusCreated, status, string(b))
			require.True(t, registered(name))
		})
	}
	// Reads need no origin: a cookie GET from anywhere is the browser
	// navigating (SameSite=Lax decides), and changes nothing.
	status, b = send(http.MethodGet, "/v1/admin/tools", "", req{cookie: true, headers: map[string]string{"Origin": otherPort}})
	require.Equal(t, http.StatusOK, status, string(b))
}

package pages_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/pages"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// authPages serves the pages with authentication on, and a viewer's token
// of storetest.TenantA's org.
func authPages(t *testing.T) (srv *httptest.Server, viewer string, st *sqlite.Store) {
	t.Helper()
	st = sqlitetest.Store(t)
	log := slog.New(slog.DiscardHandler)
	tok, row, err := auth.NewToken(auth.TokenSpec{Name: "viewer-a", OrgID: storetest.TenantA.OrgID, Role: auth.RoleViewer}, time.Now())
	if err == nil {
		err = st.CreateToken(testCtx(t), row)
	}
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{Required: true}, st, log)
	if err != nil {
		t.Fatal(err)
	}
	srv = httptest.NewServer(pages.New(st, pages.Options{Log: log, Auth: a}))
	t.Cleanup(srv.Close)
	return srv, tok, st
}

func noRedirects() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// TestLogin: the login page turns a valid token into a session cookie that
// scripts cannot read and other sites do not send on their forms, and sends
// the visitor back where they were going, never to another host; a bad
// token is refused; signing out ends the session.
func TestLogin(t *testing.T) {
	srv, viewer, _ := authPages(t)
	post := func(path string, form url.Values, cookie *http.Cookie, header map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		if cookie != nil {
			req.AddCookie(cookie)
		}
		resp, err := noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	for next, want := range map[string]string{
		"/runs/r1?x=1": "/runs/r1?x=1", "": "/", "//evil.example/x": "/", "https://evil.example/": "/", `/\evil.example`: "/",
	} {
		resp := post("/login", url.Values{"token": {viewer}, "next": {next}}, nil, nil)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
			t.Errorf("login, next %q: %d to %q, want 303 to %q", next, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	resp := post("/login", url.Values{"token": {viewer}}, nil, nil)
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == auth.SessionCookie {
			session = c
		}
	}
	if session == nil || session.Value != viewer || !session.HttpOnly || session.SameSite != http.SameSiteLaxMode || session.Path != "/" || session.MaxAge <= 0 {
		t.Fatalf("session cookie = %+v", session)
	}
	get := func(path string, c *http.Cookie) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, srv.URL+path, nil)
		if c != nil {
			req.AddCookie(c)
		}
		resp, err := noRedirects().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	if s := get("/", session).StatusCode; s != http.StatusOK {
		t.Errorf("runs page with the session: %d", s)
	}
	if s := get("/", nil).StatusCode; s != http.StatusUnauthorized {
		t.Errorf("runs page without a session: %d", s)
	}
	if s := get("/", &http.Cookie{Name: auth.SessionCookie, Value: "tw_forged"}).StatusCode; s != http.StatusUnauthorized {
		t.Errorf("runs page with a forged session: %d", s)
	}
	if s := post("/login", url.Values{"token": {"tw_0123456789abcdef_" + strings.Repeat("x", 43)}}, nil, nil).StatusCode; s != http.StatusUnauthorized {
		t.Errorf("login with an unknown token: %d", s)
	}
	if s := post("/login", url.Values{}, nil, nil).StatusCode; s != http.StatusBadRequest {
		t.Errorf("login without a token: %d", s)
	}

	// Cross-origin POSTs are refused before anything else: a login from
	// another site (login CSRF), a decision with the victim's session.
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {"Origin": "https://evil.example"},
	} {
		if s := post("/login", url.Values{"token": {viewer}}, nil, h).StatusCode; s != http.StatusForbidden {
			t.Errorf("login with %v: %d, want 403", h, s)
		}
		// Without a session, not the 401 of the login page: refused first.
		if s := post("/runs/r1/calls/abcdef/decision", url.Values{"decision": {"approve"}}, nil, h).StatusCode; s != http.StatusForbidden {
			t.Errorf("decision with %v: %d, want 403", h, s)
		}
	}
	// Same-origin (the pages' own forms) passes.
	if s := post("/login", url.Values{"token": {viewer}}, nil, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": srv.URL}).StatusCode; s != http.StatusSeeOther {
		t.Errorf("same-origin login: %d", s)
	}

	resp = post("/logout", nil, session, nil)
	cleared := false
	for _, c := range resp.Cookies() {
		cleared = cleared || (c.Name == auth.SessionCookie && c.MaxAge < 0)
	}
	if resp.StatusCode != http.StatusSeeOther || !cleared {
		t.Errorf("logout: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
}

// TestSessionCookieSecure: the session cookie carries the credential, so it
// is Secure (sent over HTTPS only) whatever the recorder terminates itself:
// behind a proxy, to a client that says nothing about where it is, to a
// plain-HTTP page beyond loopback. It is not Secure only to a browser on
// plain HTTP at a loopback address (`toolwire dev` at http://127.0.0.1),
// or with Options.InsecureCookie (TOOLWIRE_INSECURE_COOKIE=1). Signing out
// clears it with the same attributes.
func TestSessionCookieSecure(t *testing.T) {
	st := sqlitetest.Store(t)
	log := slog.New(slog.DiscardHandler)
	tok, row, err := auth.NewToken(auth.TokenSpec{Name: "viewer-a", OrgID: storetest.TenantA.OrgID, Role: auth.RoleViewer}, time.Now())
	if err == nil {
		err = st.CreateToken(testCtx(t), row)
	}
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{Required: true}, st, log)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(insecure bool) *httptest.Server {
		srv := httptest.NewServer(pages.New(st, pages.Options{Log: log, Auth: a, InsecureCookie: insecure}))
		t.Cleanup(srv.Close)
		return srv
	}
	secure, insecure := serve(false), serve(true)
	port := func(srv *httptest.Server) string { u, _ := url.Parse(srv.URL); return u.Port() }

	for _, tc := range []struct {
		name    string
		srv     *httptest.Server
		host    string
		headers map[string]string
		secure  bool
	}{
		{"no origin (curl)", secure, "", nil, true},
		{"a browser at http://127.0.0.1 (toolwire dev)", secure, "", map[string]string{"Origin": secure.URL}, false},
		{"a browser at http://localhost", secure, "localhost:" + port(secure), map[string]string{"Origin": "http://localhost:" + port(secure)}, false},
		{"a browser at http://[::1]", secure, "[::1]:" + port(secure), map[string]string{"Origin": "http://[::1]:" + port(secure)}, false},
		{"a browser at 127.0.0.1, by its Referer", secure, "", map[string]string{"Referer": secure.URL + "/login"}, false},
		{"a browser at https:// behind a proxy", secure, "recorder.example.com",
			map[string]string{"Origin": "https://recorder.example.com", "X-Forwarded-Proto": "https"}, true},
		{"a proxy forwarding a loopback Host", secure, "",
			map[string]string{"Origin": "https://recorder.example.com", "Sec-Fetch-Site": "same-origin"}, true},
		{"a browser on plain HTTP beyond loopback", secure, "recorder.example.com", map[string]string{"Origin": "http://recorder.example.com"}, true},
		{"InsecureCookie, plain HTTP beyond loopback", insecure, "recorder.example.com", map[string]string{"Origin": "http://recorder.example.com"}, false},
		{"InsecureCookie, no origin", insecure, "", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/login", "/logout"} {
				req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, tc.srv.URL+path, strings.NewReader(url.Values{"token": {tok}}.Encode()))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				if tc.host != "" {
					req.Host = tc.host
				}
				for k, v := range tc.headers {
					req.Header.Set(k, v)
				}
				if path == "/logout" {
					req.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: tok})
				}
				resp, err := noRedirects().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				var c *http.Cookie
				for _, rc := range resp.Cookies() {
					if rc.Name == auth.SessionCookie {
						c = rc
					}
				}
				if resp.StatusCode != http.StatusSeeOther || c == nil {
					t.Fatalf("%s: %d, cookies %v", path, resp.StatusCode, resp.Cookies())
				}
				if c.Secure != tc.secure || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode {
					t.Errorf("%s: cookie %+v: Secure %t, want %t", path, c, c.Secure, tc.secure)
				}
			}
		})
	}
}

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

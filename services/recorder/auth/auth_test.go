package auth_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tokenStore is a migrated SQLite store: the tokens table as the recorder has it.
func tokenStore(t *testing.T) store.Store {
	t.Helper()
	return sqlitetest.Store(t)
}

func issue(t *testing.T, s store.Tokens, spec auth.TokenSpec, at time.Time) (string, store.Token) {
	t.Helper()
	tok, row, err := auth.NewToken(spec, at)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateToken(t.Context(), row); err != nil {
		t.Fatal(err)
	}
	return tok, row
}

func TestPrincipalSees(t *testing.T) {
	a := envelope.Tenant{OrgID: "acme", WorkspaceID: "eu", UserID: "u1"}
	b := envelope.Tenant{OrgID: "globex", WorkspaceID: "eu"}
	for _, tc := range []struct {
		p    auth.Principal
		t    envelope.Tenant
		sees bool
	}{
		{auth.Principal{OrgID: "acme"}, a, true},
		{auth.Principal{OrgID: "acme", WorkspaceID: "eu"}, a, true},
		{auth.Principal{OrgID: "acme", WorkspaceID: "us"}, a, false},
		{auth.Principal{OrgID: "acme"}, b, false},
		{auth.Principal{OrgID: "acme"}, envelope.Tenant{}, false}, // a run of unknown tenant
		{auth.Principal{OrgID: auth.AllTenants}, envelope.Tenant{}, true},
		{auth.Principal{OrgID: auth.AllTenants}, b, true},
		{auth.Principal{}, envelope.Tenant{}, false}, // the zero principal sees nothing
		{auth.Principal{}, a, false},
	} {
		if got := tc.p.Sees(tc.t); got != tc.sees {
			t.Errorf("%+v sees %+v = %t", tc.p, tc.t, got)
		}
	}
	for _, tc := range []struct {
		have, want auth.Role
		can        bool
	}{
		{auth.RoleViewer, auth.RoleViewer, true}, {auth.RoleViewer, auth.RoleApprover, false},
		{auth.RoleApprover, auth.RoleViewer, true}, {auth.RoleApprover, auth.RoleAdmin, false},
		{auth.RoleAdmin, auth.RoleApprover, true}, {"", auth.RoleViewer, false}, {auth.RoleAdmin, "", false},
	} {
		if got := (auth.Principal{Role: tc.have}).Can(tc.want); got != tc.can {
			t.Errorf("%q can %q = %t", tc.have, tc.want, got)
		}
	}
}

// TestAPITokens: a token authenticates as what it was bound to; a wrong
// secret, an unknown id, a revoked or expired token or a malformed one do
// not, and nothing but the hash of its secret is stored.
func TestAPITokens(t *testing.T) {
	s := tokenStore(t)
	now := time.Now()
	a, err := auth.New(auth.Config{Required: true, AdminToken: "the-admin-token"}, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	viewer, row := issue(t, s, auth.TokenSpec{Name: "ci", OrgID: "acme", WorkspaceID: "eu", Role: auth.RoleViewer}, now)
	if strings.Contains(string(row.Hash), viewer[len(viewer)-43:]) || len(row.Hash) != 32 {
		t.Fatalf("stored hash %x: want the 32-byte SHA-256 of the secret", row.Hash)
	}
	p, err := a.Check(t.Context(), viewer)
	if err != nil || p != (auth.Principal{Name: "ci", Via: "token", OrgID: "acme", WorkspaceID: "eu", Role: auth.RoleViewer}) {
		t.Fatalf("Check(viewer) = %+v, %v", p, err)
	}
	p, err = a.Check(t.Context(), "the-admin-token")
	if err != nil || !p.AllTenants() || p.Role != auth.RoleAdmin {
		t.Fatalf("Check(admin token) = %+v, %v", p, err)
	}

	expired, _ := issue(t, s, auth.TokenSpec{Name: "old", OrgID: "acme", Role: auth.RoleViewer, TTL: time.Hour}, now.Add(-2*time.Hour))
	revoked, rrow := issue(t, s, auth.TokenSpec{Name: "gone", OrgID: "acme", Role: auth.RoleAdmin}, now)
	if err := s.RevokeToken(t.Context(), rrow.ID, now); err != nil {
		t.Fatal(err)
	}
	other, _, _ := auth.NewToken(auth.TokenSpec{Name: "never stored", OrgID: "acme", Role: auth.RoleViewer}, now)
	wrongSecret := viewer[:len(viewer)-1] + map[bool]string{true: "B", false: "A"}[strings.HasSuffix(viewer, "A")]
	for name, cred := range map[string]string{
		"expired": expired, "revoked": revoked, "unknown id": other, "wrong secret": wrongSecret,
		"malformed": "tw_123_abc", "not ours": "hello", "admin token prefix": "the-admin-token-and-more",
	} {
		if p, err := a.Check(t.Context(), cred); !errors.Is(err, auth.ErrBadCredentials) {
			t.Errorf("%s: Check = %+v, %v; want ErrBadCredentials", name, p, err)
		}
	}
}

// TestAuthenticate: with authentication off a request without credentials
// is the local operator; on, it is refused; credentials presented are
// always checked, from the bearer header or the session cookie.
func TestAuthenticate(t *testing.T) {
	s := tokenStore(t)
	tok, _ := issue(t, s, auth.TokenSpec{Name: "web", OrgID: "acme", Role: auth.RoleApprover}, time.Now())
	off, err := auth.New(auth.Config{}, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	on, err := auth.New(auth.Config{Required: true}, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := func(header, cookie string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		if cookie != "" {
			r.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: cookie})
		}
		return r
	}
	for _, tc := range []struct {
		name string
		a    *auth.Authenticator
		r    *http.Request
		want string // the principal's name, or the error
	}{
		{"off, anonymous", off, req("", ""), "local"},
		{"nil authenticator, anonymous", nil, req("", ""), "local"},
		{"off, a token", off, req("Bearer "+tok, ""), "web"},
		{"off, a bad token", off, req("Bearer tw_nope", ""), auth.ErrBadCredentials.Error()},
		{"on, anonymous", on, req("", ""), auth.ErrNoCredentials.Error()},
		{"on, bearer", on, req("bearer "+tok, ""), "web"},
		{"on, cookie", on, req("", tok), "web"},
		{"on, basic auth", on, req("Basic dXNlcjpwYXNz", ""), auth.ErrBadCredentials.Error()},
		{"on, header wins over cookie", on, req("Bearer tw_bad", tok), auth.ErrBadCredentials.Error()},
	} {
		p, err := tc.a.Authenticate(tc.r)
		got := p.Name
		if err != nil {
			got = err.Error()
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if auth.Open.Can(auth.RoleAdmin) || !auth.Open.AllTenants() || !auth.Open.Can(auth.RoleApprover) {
		t.Errorf("Open = %+v: want an approver of every tenant, not an admin", auth.Open)
	}
}

func TestTokenSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		spec auth.TokenSpec
		want string
	}{
		{auth.TokenSpec{Name: "x", OrgID: "acme", Role: auth.RoleViewer}, ""},
		{auth.TokenSpec{Name: "x", OrgID: "*", Role: auth.RoleAdmin}, ""},
		{auth.TokenSpec{Name: "x", OrgID: "*", Role: auth.RoleAdmin, WorkspaceID: "eu"}, "names no workspace"},
		{auth.TokenSpec{Name: "x", OrgID: "*", Role: auth.RoleApprover}, "only an admin token"},
		{auth.TokenSpec{OrgID: "acme", Role: auth.RoleViewer}, "needs a name"},
		{auth.TokenSpec{Name: "x", OrgID: "a b", Role: auth.RoleViewer}, `org "a b"`},
		{auth.TokenSpec{Name: "x", OrgID: "acme", WorkspaceID: "e/u", Role: auth.RoleViewer}, `workspace "e/u"`},
		{auth.TokenSpec{Name: "x", OrgID: "acme", Role: "root"}, `role "root"`},
	} {
		err := tc.spec.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.spec, err)
			}
			continue
		}
		if !errors.Is(err, auth.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// FuzzParseToken: any string either parses into an id and secret that make
// the same token again, or is refused as bad credentials; never a panic.
func FuzzParseToken(f *testing.F) {
	tok, _, _ := auth.NewToken(auth.TokenSpec{Name: "f", OrgID: "acme", Role: auth.RoleViewer}, time.Now())
	for _, s := range []string{tok, "tw_", "tw_0123456789abcdef_", "", "tw_0123456789ABCDEF_" + strings.Repeat("a", 43)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, secret, err := auth.ParseToken(s)
		if err != nil {
			if !errors.Is(err, auth.ErrBadCredentials) {
				t.Fatalf("ParseToken(%q): %v is not ErrBadCredentials", s, err)
			}
			return
		}
		if auth.TokenPrefix+id+"_"+secret != s || auth.ValidateTokenID(id) != nil {
			t.Fatalf("ParseToken(%q) = %q, %q", s, id, secret)
		}
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

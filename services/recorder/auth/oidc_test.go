package auth_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// issuer is an OpenID Connect provider in a test: discovery and a JWKS
// holding one RSA key it signs ID tokens with.
type issuer struct {
	srv *httptest.Server
	key *rsa.PrivateKey
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is := &issuer{key: key}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": is.srv.URL, "jwks_uri": is.srv.URL + "/jwks", "authorization_endpoint": is.srv.URL + "/auth",
			"token_endpoint": is.srv.URL + "/token", "id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
			{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	return is
}

// sign makes an ID token with the standard claims for audience "toolwire",
// changed by edit, signed with key (the issuer's unless given).
func (is *issuer) sign(t *testing.T, extra map[string]any, edit func(*jwt.Claims), key *rsa.PrivateKey) string {
	t.Helper()
	if key == nil {
		key = is.key
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c := jwt.Claims{Issuer: is.srv.URL, Subject: "user-42", Audience: jwt.Audience{"toolwire"},
		IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}
	if edit != nil {
		edit(&c)
	}
	raw, err := jwt.Signed(sig).Claims(c).Claims(extra).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestOIDC: ID tokens of the configured issuer authenticate, their claims
// naming the tenant and the role; tokens for another audience, expired,
// signed by another key, from another issuer, unsigned, or without the
// claims that bind a tenant and a role are refused.
func TestOIDC(t *testing.T) {
	is := newIssuer(t)
	a, err := auth.New(auth.Config{OIDC: auth.OIDCConfig{Issuer: is.srv.URL, Audience: "toolwire", RoleClaim: "groups"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Required() {
		t.Fatal("an OIDC issuer turns authentication on")
	}
	good := map[string]any{"org_id": "acme", "workspace_id": "eu", "groups": []string{"staff", "viewer", "approver"}, "email": "ann@acme.example"}
	p, err := a.Check(ctxT(t), is.sign(t, good, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := (auth.Principal{Name: "ann@acme.example", Via: "oidc", OrgID: "acme", WorkspaceID: "eu", Role: auth.RoleApprover}); p != want {
		t.Fatalf("principal = %+v, want %+v (the most powerful role of the list)", p, want)
	}
	p, err = a.Check(ctxT(t), is.sign(t, map[string]any{"org_id": "acme", "groups": "viewer"}, nil, nil))
	if err != nil || p.Name != "user-42" || p.WorkspaceID != "" || p.Role != auth.RoleViewer {
		t.Fatalf("a role as a string, no workspace, no email: %+v, %v", p, err)
	}

	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"another audience": is.sign(t, good, func(c *jwt.Claims) { c.Audience = jwt.Audience{"someone-else"} }, nil),
		"expired":          is.sign(t, good, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(time.Now().Add(-time.Minute)) }, nil),
		"another issuer":   is.sign(t, good, func(c *jwt.Claims) { c.Issuer = "https://evil.example" }, nil),
		"another key":      is.sign(t, good, nil, other),
		"no org":           is.sign(t, map[string]any{"groups": "admin"}, nil, nil),
		"org for all":      is.sign(t, map[string]any{"org_id": "*", "groups": "admin"}, nil, nil),
		"no role":          is.sign(t, map[string]any{"org_id": "acme", "groups": []string{"staff"}}, nil, nil),
		"bad workspace":    is.sign(t, map[string]any{"org_id": "acme", "workspace_id": "a/b", "groups": "viewer"}, nil, nil),
		"unsigned":         unsigned(t, is.srv.URL, good),
	} {
		if p, err := a.Check(ctxT(t), tok); !errors.Is(err, auth.ErrBadCredentials) {
			t.Errorf("%s: %+v, %v; want ErrBadCredentials", name, p, err)
		}
	}
}

// TestOIDCIssuerDown: while the issuer cannot be discovered, tokens cannot be
// checked (ErrUnavailable, a 503), not refused as invalid.
func TestOIDCIssuerDown(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	a, err := auth.New(auth.Config{OIDC: auth.OIDCConfig{Issuer: url, Audience: "toolwire"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(ctxT(t), "a.b.c"); !errors.Is(err, auth.ErrUnavailable) {
		t.Fatalf("issuer down: %v, want ErrUnavailable", err)
	}
	for _, bad := range []auth.OIDCConfig{{Issuer: "accounts.example", Audience: "x"}, {Issuer: "https://id.example"}} {
		if _, err := auth.New(auth.Config{OIDC: bad}, nil, nil); !errors.Is(err, auth.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
}

// unsigned is a token with alg "none".
func unsigned(t *testing.T, iss string, claims map[string]any) string {
	t.Helper()
	c := map[string]any{"iss": iss, "sub": "x", "aud": "toolwire", "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range claims {
		c[k] = v
	}
	body, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc(body) + "."
}

// TestOIDCMalformedScopeClaims: a claim that binds the token's scope (org,
// workspace, role) or names its holder (email) and is present but malformed
// refuses the token with ErrBadClaim, saying which claim: never read as
// absent, which for the workspace would widen the token to the whole org.
// Absent stays absent.
func TestOIDCMalformedScopeClaims(t *testing.T) {
	is := newIssuer(t)
	a, err := auth.New(auth.Config{OIDC: auth.OIDCConfig{Issuer: is.srv.URL, Audience: "toolwire"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	with := func(kv ...any) map[string]any {
		c := map[string]any{"org_id": "acme", "workspace_id": "eu", "toolwire_role": "viewer"}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == absent {
				delete(c, kv[i].(string))
				continue
			}
			c[kv[i].(string)] = kv[i+1]
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		claims map[string]any
		claim  string // named by the error
	}{
		{"workspace as a list", with("workspace_id", []string{"eu"}), "workspace_id"},
		{"workspace as an object", with("workspace_id", map[string]any{"id": "eu"}), "workspace_id"},
		{"workspace as a number", with("workspace_id", 7), "workspace_id"},
		{"workspace as a boolean", with("workspace_id", true), "workspace_id"},
		{"workspace null", with("workspace_id", nil), "workspace_id"},
		{"workspace empty", with("workspace_id", ""), "workspace_id"},
		{"workspace with a slash", with("workspace_id", "eu/us"), "workspace_id"},
		{"workspace with a newline", with("workspace_id", "eu\nus"), "workspace_id"},
		{"workspace with a space", with("workspace_id", "eu us"), "workspace_id"},
		{"workspace with a star", with("workspace_id", "*"), "workspace_id"},
		{"org as a list", with("org_id", []string{"acme"}), "org_id"},
		{"org as an object", with("org_id", map[string]any{"id": "acme"}), "org_id"},
		{"org as a number", with("org_id", 7), "org_id"},
		{"org null", with("org_id", nil), "org_id"},
		{"org empty", with("org_id", ""), "org_id"},
		{"org with a slash", with("org_id", "acme/eu"), "org_id"},
		{"org absent", with("org_id", absent), "org_id"},
		{"role as a number", with("toolwire_role", 3), "toolwire_role"},
		{"role as an object", with("toolwire_role", map[string]any{"role": "admin"}), "toolwire_role"},
		{"role null", with("toolwire_role", nil), "toolwire_role"},
		{"role empty", with("toolwire_role", ""), "toolwire_role"},
		{"role list with a number", with("toolwire_role", []any{"viewer", 7}), "toolwire_role"},
		{"role list with a list", with("toolwire_role", []any{[]string{"admin"}}), "toolwire_role"},
		{"role list empty", with("toolwire_role", []string{}), "toolwire_role"},
		{"role unknown", with("toolwire_role", "root"), "toolwire_role"},
		{"role absent", with("toolwire_role", absent), "toolwire_role"},
		{"email as a list", with("email", []string{"ann@acme.example"}), "email"},
		{"email with a newline", with("email", "ann@acme.example\nadmin"), "email"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := a.Check(ctxT(t), is.sign(t, tc.claims, nil, nil))
			if !errors.Is(err, auth.ErrBadClaim) || !errors.Is(err, auth.ErrBadCredentials) {
				t.Fatalf("%+v, %v; want ErrBadClaim", p, err)
			}
			if !strings.Contains(err.Error(), `"`+tc.claim+`"`) {
				t.Errorf("error %q does not name the claim %q", err, tc.claim)
			}
		})
	}
	// Absent stays absent: no workspace claim is the whole org, no email the
	// subject; an empty email is no email.
	for _, tc := range []struct {
		name   string
		claims map[string]any
		want   auth.Principal
	}{
		{"no workspace", with("workspace_id", absent), auth.Principal{Name: "user-42", Via: "oidc", OrgID: "acme", Role: auth.RoleViewer}},
		{"workspace", with(), auth.Principal{Name: "user-42", Via: "oidc", OrgID: "acme", WorkspaceID: "eu", Role: auth.RoleViewer}},
		{"empty email", with("email", ""), auth.Principal{Name: "user-42", Via: "oidc", OrgID: "acme", WorkspaceID: "eu", Role: auth.RoleViewer}},
		{"groups with other names", with("toolwire_role", []string{"staff", "admin"}), auth.Principal{Name: "user-42", Via: "oidc", OrgID: "acme", WorkspaceID: "eu", Role: auth.RoleAdmin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := a.Check(ctxT(t), is.sign(t, tc.claims, nil, nil))
			if err != nil || p != tc.want {
				t.Fatalf("%+v, %v; want %+v", p, err, tc.want)
			}
		})
	}
}

// absent, as a claim's value in TestOIDCMalformedScopeClaims, removes it.
var absent = &struct{ absent bool }{true}

// TestOIDCMalformedClaimOverHTTP: the API (its Unauthenticated) refuses a token whose workspace
// claim is malformed with 401, saying which claim, instead of serving the
// whole org.
func TestOIDCMalformedClaimOverHTTP(t *testing.T) {
	is := newIssuer(t)
	a, err := auth.New(auth.Config{OIDC: auth.OIDCConfig{Issuer: is.srv.URL, Audience: "toolwire"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := a.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("served %+v", auth.FromContext(r.Context()))
	}), nil, api.Unauthenticated)
	for _, ws := range []any{[]string{"eu"}, map[string]any{"id": "eu"}, 7} {
		tok := is.sign(t, map[string]any{"org_id": "acme", "workspace_id": ws, "toolwire_role": "viewer"}, nil, nil)
		req := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "workspace_id") {
			t.Errorf("workspace claim %v: %d %s", ws, rec.Code, rec.Body)
		}
	}
}

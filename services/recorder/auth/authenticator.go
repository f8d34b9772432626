package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/toolwire/toolwire/services/recorder/store"
)

// SessionCookie is the cookie the login page sets: it holds the credential
// the user pasted (an API token or an OIDC token), HttpOnly and SameSite=Lax,
// so that the pages, their live stream and their forms authenticate as the
// user without script access to it.
const SessionCookie = "toolwire_session"

// Config says how requests authenticate. The zero value is authentication
// off: every request acts as the local operator (Open), which is how
// `toolwire dev` serves on loopback.
type Config struct {
	// Required turns authentication on: a request without valid credentials
	// is refused (401), and every read is scoped to its principal's tenant.
	Required bool
	// AdminToken, when set, authenticates as an admin of every tenant (the
	// registry's admin routes need it when authentication is off).
	AdminToken string
	// OIDC, when its Issuer is set, accepts OpenID Connect ID tokens as
	// bearer tokens (and turns authentication on).
	OIDC OIDCConfig
}

// On reports whether c requires authentication.
func (c Config) On() bool { return c.Required || c.OIDC.Issuer != "" }

// Validate checks c.
func (c Config) Validate() error {
	if c.OIDC.Issuer != "" {
		return c.OIDC.Validate()
	}
	return nil
}

// Open is the principal of every request when authentication is off: the
// local operator, who reads every tenant and decides approvals. The
// registry's admin routes still need the admin token.
var Open = Principal{Name: "local", Via: "none", OrgID: AllTenants, Role: RoleApprover}

// Authenticator checks the credentials of requests. A nil *Authenticator
// authenticates nobody and treats every request as Open: the behaviour of
// authentication off.
type Authenticator struct {
	cfg    Config
	tokens store.Tokens
	oidc   *oidcVerifier
	// adminDigest is the SHA-256 of the admin token; nil without one.
	adminDigest []byte
	log         *slog.Logger
	now         func() time.Time
}

// New returns an authenticator for cfg that finds API tokens in tokens (nil:
// no API tokens).
func New(cfg Config, tokens store.Tokens, log *slog.Logger) (*Authenticator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	a := &Authenticator{cfg: cfg, tokens: tokens, log: log, now: time.Now}
	if cfg.AdminToken != "" {
		d := sha256.Sum256([]byte(cfg.AdminToken))
		a.adminDigest = d[:]
	}
	if cfg.OIDC.Issuer != "" {
		a.oidc = newOIDCVerifier(cfg.OIDC)
	}
	return a, nil
}

// Required reports whether requests must authenticate.
func (a *Authenticator) Required() bool { return a != nil && a.cfg.On() }

// AdminConfigured reports whether any credential can be an admin of every
// tenant, which the registry's admin routes need.
func (a *Authenticator) AdminConfigured() bool {
	return a != nil && (a.cfg.AdminToken != "" || a.cfg.On())
}

// Credential returns the credential a request carries: its bearer token,
// else its session cookie; "" when it carries none.
func Credential(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, _ := strings.Cut(h, " ")
		if strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return "\x00" // a header that is not a bearer token: never valid
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		return c.Value
	}
	return ""
}

// Authenticate returns the principal of r. Credentials presented are always
// checked, whether or not authentication is required; without any, the
// request is Open when authentication is off and ErrNoCredentials when on.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	cred := Credential(r)
	if cred == "" {
		if a.Required() {
			return Principal{}, ErrNoCredentials
		}
		return Open, nil
	}
	if a == nil {
		return Principal{}, ErrBadCredentials
	}
	return a.Check(r.Context(), cred)
}

// Check returns the principal of a credential: the admin token, an API
// token, or (when configured) an OIDC ID token.
func (a *Authenticator) Check(ctx context.Context, cred string) (Principal, error) {
	if a == nil {
		return Principal{}, ErrBadCredentials
	}
	if a.isAdminToken(cred) {
		return Principal{Name: "admin", Via: "admin-token", OrgID: AllTenants, Role: RoleAdmin}, nil
	}
	if strings.HasPrefix(cred, TokenPrefix) {
		return a.checkToken(ctx, cred)
	}
	if a.oidc != nil && strings.Count(cred, ".") == 2 {
		return a.oidc.verify(ctx, cred)
	}
	return Principal{}, ErrBadCredentials
}

// isAdminToken reports whether cred is the admin token. It compares the
// SHA-256 digests of both in constant time: comparing the strings
// themselves (subtle.ConstantTimeCompare returns at once when the lengths
// differ) would tell a caller timing it how long the admin token is.
func (a *Authenticator) isAdminToken(cred string) bool {
	if len(a.adminDigest) == 0 {
		return false
	}
	got := sha256.Sum256([]byte(cred))
	return subtle.ConstantTimeCompare(got[:], a.adminDigest) == 1
}

func (a *Authenticator) checkToken(ctx context.Context, cred string) (Principal, error) {
	id, secret, err := ParseToken(cred)
	if err != nil {
		return Principal{}, err
	}
	if a.tokens == nil {
		return Principal{}, ErrBadCredentials
	}
	t, err := a.tokens.Token(ctx, id)
	if errors.Is(err, store.ErrTokenNotFound) {
		return Principal{}, fmt.Errorf("%w: unknown token %s", ErrBadCredentials, id)
	}
	if err != nil {
		a.log.Warn("auth: token lookup failed", "token_id", id, "err", err)
		return Principal{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if subtle.ConstantTimeCompare(HashSecret(secret), t.Hash) != 1 {
		return Principal{}, fmt.Errorf("%w: token %s: wrong secret", ErrBadCredentials, id)
	}
	if t.RevokedAt != nil {
		return Principal{}, fmt.Errorf("%w: token %s was revoked at %s", ErrBadCredentials, id, t.RevokedAt.Format(time.RFC3339))
	}
	if t.ExpiresAt != nil && !a.now().Before(*t.ExpiresAt) {
		return Principal{}, fmt.Errorf("%w: token %s expired at %s", ErrBadCredentials, id, t.ExpiresAt.Format(time.RFC3339))
	}
	role, err := ParseRole(t.Role)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: token %s: %w", ErrBadCredentials, id, err)
	}
	return Principal{Name: t.Name, Via: "token", OrgID: t.OrgID, WorkspaceID: t.WorkspaceID, Role: role}, nil
}

// Middleware authenticates every request that public does not exempt, puts
// its principal in the request's context (FromContext) and calls next;
// a request that does not authenticate goes to deny instead, with the
// error (ErrNoCredentials, ErrBadCredentials or ErrUnavailable). A public
// request gets its principal too when it authenticates, and none otherwise.
func (a *Authenticator) Middleware(next http.Handler, public func(*http.Request) bool,
	deny func(http.ResponseWriter, *http.Request, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := a.Authenticate(r)
		if err == nil {
			next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
			return
		}
		if public != nil && public(r) {
			next.ServeHTTP(w, r)
			return
		}
		if a != nil && !errors.Is(err, ErrNoCredentials) {
			a.log.Info("auth: request refused", "path", r.URL.Path, "err", err)
		}
		deny(w, r, err)
	})
}

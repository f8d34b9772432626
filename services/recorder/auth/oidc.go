package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coreos/go-oidc/v3/oidc"
)

// OIDCConfig maps OpenID Connect ID tokens to principals. Tokens are checked
// with github.com/coreos/go-oidc/v3: it discovers the issuer's keys
// (/.well-known/openid-configuration, then its JWKS, refreshed when an
// unknown key id appears), checks the signature, the issuer, the audience and
// the expiry, and refuses unsigned tokens and unexpected algorithms. It is
// the OIDC client library most Go projects use (Kubernetes' and Dex's
// lineage), kept by CoreOS/Red Hat, and does only verification, which is all
// a bearer-token API needs.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL, exactly as its tokens' iss says.
	Issuer string
	// Audience is the client id tokens must be issued to (their aud).
	Audience string
	// OrgClaim names the claim holding the tenant's org (required in every
	// token, a string); default "org_id".
	OrgClaim string
	// WorkspaceClaim names the claim holding the workspace; absent: every
	// workspace of the org. Present, it must be a workspace id (a string):
	// any other value (a list, an object, a number, null, "") refuses the
	// token rather than widen it to the whole org. Default "workspace_id".
	WorkspaceClaim string
	// RoleClaim names the claim holding the role: a string, or a list of
	// which the most powerful known role wins (a groups claim works: other
	// names are ignored); default "toolwire_role". A token without a known
	// role, or with a role claim of another type (a list holding anything
	// but strings, a number, an object), is refused.
	RoleClaim string
	// HTTPClient fetches discovery and keys; default http.DefaultClient.
	HTTPClient *http.Client
}

// Defaults of OIDCConfig.
const (
	DefaultOrgClaim       = "org_id"
	DefaultWorkspaceClaim = "workspace_id"
	DefaultRoleClaim      = "toolwire_role"
	oidcDiscoveryTimeout  = 10 * time.Second
	oidcRetryAfter        = 10 * time.Second
)

// WithDefaults fills in the claim names.
func (c OIDCConfig) WithDefaults() OIDCConfig {
	if c.OrgClaim == "" {
		c.OrgClaim = DefaultOrgClaim
	}
	if c.WorkspaceClaim == "" {
		c.WorkspaceClaim = DefaultWorkspaceClaim
	}
	if c.RoleClaim == "" {
		c.RoleClaim = DefaultRoleClaim
	}
	return c
}

// Validate checks c.
func (c OIDCConfig) Validate() error {
	var errs []error
	if !strings.HasPrefix(c.Issuer, "https://") && !strings.HasPrefix(c.Issuer, "http://") {
		errs = append(errs, fmt.Errorf("%w OIDC issuer %q: want its URL (https://...)", ErrInvalid, c.Issuer))
	}
	if c.Audience == "" {
		errs = append(errs, fmt.Errorf("%w OIDC config: an audience (the client id tokens are issued to) is required with an issuer", ErrInvalid))
	}
	return errors.Join(errs...)
}

// oidcVerifier discovers the issuer on first use (so that a recorder starts
// while its provider is down), and again after a failure, at most every
// oidcRetryAfter.
type oidcVerifier struct {
	cfg OIDCConfig

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
	failedAt time.Time
	lastErr  error
}

func newOIDCVerifier(cfg OIDCConfig) *oidcVerifier { return &oidcVerifier{cfg: cfg.WithDefaults()} }

func (v *oidcVerifier) get(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.verifier != nil {
		return v.verifier, nil
	}
	if !v.failedAt.IsZero() && time.Since(v.failedAt) < oidcRetryAfter {
		return nil, v.lastErr
	}
	client := v.cfg.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	// The key set outlives this request: it refreshes keys for later ones,
	// so it gets the request's values without its cancellation.
	keyCtx := oidc.ClientContext(context.WithoutCancel(ctx), client)
	dctx, cancel := context.WithTimeout(keyCtx, oidcDiscoveryTimeout)
	defer cancel()
	p, err := oidc.NewProvider(dctx, v.cfg.Issuer)
	if err != nil {
		v.failedAt, v.lastErr = time.Now(), fmt.Errorf("%w: OIDC discovery of %s: %w", ErrUnavailable, v.cfg.Issuer, err)
		return nil, v.lastErr
	}
	var meta struct {
		JWKS string   `json:"jwks_uri"`
		Algs []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := p.Claims(&meta); err != nil || meta.JWKS == "" {
		v.failedAt, v.lastErr = time.Now(), fmt.Errorf("%w: OIDC discovery of %s: no jwks_uri", ErrUnavailable, v.cfg.Issuer)
		return nil, v.lastErr
	}
	keys := oidc.NewRemoteKeySet(keyCtx, meta.JWKS)
	v.verifier = oidc.NewVerifier(v.cfg.Issuer, keys, &oidc.Config{ClientID: v.cfg.Audience, SupportedSigningAlgs: meta.Algs})
	return v.verifier, nil
}

func (v *oidcVerifier) verify(ctx context.Context, raw string) (Principal, error) {
	ver, err := v.get(ctx)
	if err != nil {
		return Principal{}, err
	}
	tok, err := ver.Verify(ctx, raw)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: OIDC token: %w", ErrBadCredentials, err)
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return Principal{}, fmt.Errorf("%w: OIDC token claims: %w", ErrBadCredentials, err)
	}
	who := tok.Subject
	org, present, err := stringClaim(claims, v.cfg.OrgClaim)
	if err == nil && (!present || org == "" || org == AllTenants || !tenantPartRE.MatchString(org)) {
		err = fmt.Errorf("has no valid %q claim (the tenant's org): want an org id (letters, digits, '.', '_', ':', '@', '-')", v.cfg.OrgClaim)
	}
	if err != nil {
		return Principal{}, fmt.Errorf("%w: OIDC token of %q: %w", ErrBadClaim, who, err)
	}
	// An absent workspace claim is the whole org; one present must name a
	// workspace: read as absent, a malformed one would widen the token to
	// every workspace of its org.
	ws, present, err := stringClaim(claims, v.cfg.WorkspaceClaim)
	if err == nil && present && !tenantPartRE.MatchString(ws) {
		err = fmt.Errorf("%q claim %q is not a workspace id (letters, digits, '.', '_', ':', '@', '-'); leave the claim out for the whole org", v.cfg.WorkspaceClaim, ws)
	}
	if err != nil {
		return Principal{}, fmt.Errorf("%w: OIDC token of %q: %w", ErrBadClaim, who, err)
	}
	role, err := roleOfClaim(claims, v.cfg.RoleClaim)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: OIDC token of %q: %w", ErrBadClaim, who, err)
	}
	name := tok.Subject
	email, present, err := stringClaim(claims, "email")
	if err == nil && present && !printable(email) {
		err = fmt.Errorf("claim \"email\" %q is not an address", email)
	}
	if err != nil {
		return Principal{}, fmt.Errorf("%w: OIDC token of %q: %w", ErrBadClaim, who, err)
	}
	if email != "" {
		name = email
	}
	return Principal{Name: name, Via: "oidc", OrgID: org, WorkspaceID: ws, Role: role}, nil
}

// stringClaim reads a claim that must be a string when present: present
// false when the token does not carry it, an error when it carries anything
// else (a list, an object, a number, a boolean or null).
func stringClaim(claims map[string]any, name string) (val string, present bool, err error) {
	v, ok := claims[name]
	if !ok {
		return "", false, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", true, fmt.Errorf("claim %q is %s, not a string", name, jsonKind(v))
	}
	return s, true, nil
}

// jsonKind names the JSON type of a decoded value, for errors.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case float64, json.Number:
		return "a number"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("a %T", v)
}

// printable reports whether s has no control characters.
func printable(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// roleOfClaim reads the role claim: a role name, or a list of strings (a
// groups claim) of which the most powerful role wins, other names being
// ignored. It is an error when the claim is absent, of another JSON type, a
// list holding anything but strings, or names no role.
func roleOfClaim(claims map[string]any, name string) (Role, error) {
	v, ok := claims[name]
	if !ok {
		return "", fmt.Errorf("has no %q claim naming viewer, producer, approver or admin", name)
	}
	var best Role
	consider := func(s string) {
		if r, err := ParseRole(s); err == nil && r.rank() > best.rank() {
			best = r
		}
	}
	switch c := v.(type) {
	case string:
		consider(c)
	case []any:
		for i, e := range c {
			s, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("claim %q: element %d is %s, not a string", name, i, jsonKind(e))
			}
			consider(s)
		}
	default:
		return "", fmt.Errorf("claim %q is %s, not a role or a list of them", name, jsonKind(v))
	}
	if best == "" {
		return "", fmt.Errorf("claim %q names none of %s", name, roleNames)
	}
	return best, nil
}

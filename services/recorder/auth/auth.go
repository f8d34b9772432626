// Package auth is who may read and decide what on the recorder's HTTP
// server: the roles, the principal a request acts as, the API tokens the CLI
// issues (kept hashed in the store), the operator's admin token and OpenID
// Connect bearer tokens, and the middleware that authenticates each request.
//
// A principal is bound to a tenant: an org and optionally one of its
// workspaces (or, for an operator, every tenant). Reads are scoped to it:
// a run of another tenant is not found (404), never forbidden, so that its
// existence does not leak. Roles are ordered: a viewer reads, a producer
// also submits and cancels runs (an upstream system's token), an approver
// also decides approvals (on the timeline page or over the API), an admin
// also manages the tool registry (an admin of every tenant only, since the
// registry is shared).
package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Role is what a principal may do, in increasing order of power.
type Role string

// The roles.
const (
	RoleViewer Role = "viewer"
	// RoleProducer may also submit its tenant's runs and cancel them: what
	// an upstream system needs, and no decision on a call.
	RoleProducer Role = "producer"
	// RoleApprover may also decide approvals (and submit and cancel).
	RoleApprover Role = "approver"
	RoleAdmin    Role = "admin"
)

// Roles lists the roles from the least to the most powerful.
func Roles() []Role { return []Role{RoleViewer, RoleProducer, RoleApprover, RoleAdmin} }

// roleNames is Roles as a sentence, for errors.
const roleNames = "viewer, producer, approver, admin"

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleProducer:
		return 2
	case RoleApprover:
		return 3
	case RoleAdmin:
		return 4
	}
	return 0
}

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	r := Role(strings.ToLower(strings.TrimSpace(s)))
	if r.rank() == 0 {
		return "", fmt.Errorf("%w: role %q is not one of %s", ErrInvalid, s, roleNames)
	}
	return r, nil
}

// AllTenants is the org of a principal (and of an API token) that sees every
// tenant: an operator's.
const AllTenants = "*"

// Principal is who a request acts as.
type Principal struct {
	// Name says who, for logs and for the decisions they make: the token's
	// name, the OIDC subject's email or subject, "admin" for the admin
	// token, "local" when authentication is off.
	Name string
	// Via is how the request authenticated: "token", "admin-token", "oidc",
	// or "none" when authentication is off.
	Via string
	// OrgID is the tenant's org; AllTenants for an operator.
	OrgID string
	// WorkspaceID narrows the tenant to one workspace of the org; "": all.
	WorkspaceID string
	Role        Role
}

// AllTenants reports whether p sees every tenant.
func (p Principal) AllTenants() bool { return p.OrgID == AllTenants }

// Sees reports whether p may read what tenant t owns. A run whose tenant is
// not known (yet) is seen by operators only.
func (p Principal) Sees(t envelope.Tenant) bool {
	if p.AllTenants() {
		return true
	}
	if p.OrgID == "" || t.OrgID != p.OrgID {
		return false
	}
	return p.WorkspaceID == "" || t.WorkspaceID == p.WorkspaceID
}

// Can reports whether p's role is at least r.
func (p Principal) Can(r Role) bool { return p.Role.rank() >= r.rank() && r.rank() > 0 }

// Errors of authentication. Their messages are safe to show the client.
var (
	// ErrNoCredentials: the request carries no credentials and they are
	// required.
	ErrNoCredentials = errors.New("authentication required")
	// ErrBadCredentials: the credentials are not valid (unknown, revoked,
	// expired, badly signed, or lacking the claims that bind a tenant).
	ErrBadCredentials = errors.New("invalid credentials")
	// ErrBadClaim wraps ErrBadCredentials: a signed token carries a claim
	// that binds its scope (org, workspace, role) or names its holder, and
	// the claim is malformed (another JSON type, empty, characters an id
	// does not have). Its message says which claim and is safe to show.
	ErrBadClaim = fmt.Errorf("%w: malformed claim", ErrBadCredentials)
	// ErrUnavailable: the credentials could not be checked now (the store
	// or the identity provider did not answer); retrying may help.
	ErrUnavailable = errors.New("credentials cannot be checked now")
	// ErrInvalid: an argument (a role, a tenant, a token) is malformed.
	ErrInvalid = errors.New("invalid")
)

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the middleware put in ctx. Without one
// (a handler served without the middleware) it returns the zero principal,
// which sees nothing and may do nothing.
func FromContext(ctx context.Context) Principal {
	p, _ := ctx.Value(principalKey{}).(Principal)
	return p
}

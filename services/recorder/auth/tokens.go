package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/toolwire/toolwire/services/recorder/store"
)

// An API token is "tw_<id>_<secret>": id is 16 hex digits (8 random bytes),
// the key the store finds the token by, shown by `toolwire tokens list` and
// used to revoke it; secret is 32 random bytes in unpadded base64url. The
// store keeps only SHA-256(secret). A fast hash is the right one here: the
// secret is 256 random bits, not a password, so there is nothing to guess
// and a slow KDF (bcrypt, argon2) would only cost CPU on every request; the
// hash makes a leaked tokens table useless for authenticating, and the
// comparison is constant-time.
const (
	TokenPrefix = "tw_"
	idBytes     = 8
	secretBytes = 32
)

var (
	tokenRE = regexp.MustCompile(`^tw_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$`)
	idRE    = regexp.MustCompile(`^[0-9a-f]{16}$`)
	// A tenant id part as events carry it.
	tenantPartRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`)
)

// TokenSpec is what a new token is bound to.
type TokenSpec struct {
	Name        string
	OrgID       string // AllTenants: every tenant (admin only)
	WorkspaceID string // "": every workspace of the org
	Role        Role
	// TTL, when positive, makes the token expire that long after creation.
	TTL time.Duration
}

// Validate checks s.
func (s TokenSpec) Validate() error {
	var errs []string
	if strings.TrimSpace(s.Name) == "" || len(s.Name) > 200 {
		errs = append(errs, "a token needs a name of 1 to 200 characters (who or what uses it)")
	}
	switch {
	case s.OrgID == AllTenants:
		if s.Role != RoleAdmin {
			errs = append(errs, "only an admin token may cover every tenant (org "+AllTenants+")")
		}
		if s.WorkspaceID != "" {
			errs = append(errs, "a token for every tenant names no workspace")
		}
	case !tenantPartRE.MatchString(s.OrgID):
		errs = append(errs, fmt.Sprintf("org %q: want the org id runs carry (letters, digits, '.', '_', ':', '@', '-'), or %s for every tenant", s.OrgID, AllTenants))
	}
	if s.WorkspaceID != "" && !tenantPartRE.MatchString(s.WorkspaceID) {
		errs = append(errs, fmt.Sprintf("workspace %q: want a workspace id (letters, digits, '.', '_', ':', '@', '-')", s.WorkspaceID))
	}
	if s.Role.rank() == 0 {
		errs = append(errs, fmt.Sprintf("role %q is not one of %s", s.Role, roleNames))
	}
	if s.TTL < 0 {
		errs = append(errs, "a token's lifetime must be positive")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w token: %s", ErrInvalid, strings.Join(errs, "; "))
	}
	return nil
}

// NewToken makes a token for spec: the token to hand its user (shown once,
// never stored) and the row to store.
func NewToken(spec TokenSpec, now time.Time) (token string, row store.Token, err error) {
	if err := spec.Validate(); err != nil {
		return "", store.Token{}, err
	}
	id := make([]byte, idBytes)
	secret := make([]byte, secretBytes)
	_, _ = rand.Read(id) // crypto/rand.Read never fails (Go 1.24+)
	_, _ = rand.Read(secret)
	sec := base64.RawURLEncoding.EncodeToString(secret)
	row = store.Token{ID: hex.EncodeToString(id), Name: spec.Name, OrgID: spec.OrgID, WorkspaceID: spec.WorkspaceID,
		Role: string(spec.Role), Hash: HashSecret(sec), CreatedAt: now.UTC().Truncate(time.Microsecond)}
	if spec.TTL > 0 {
		exp := row.CreatedAt.Add(spec.TTL)
		row.ExpiresAt = &exp
	}
	return TokenPrefix + row.ID + "_" + sec, row, nil
}

// ParseToken splits an API token into its id and secret.
func ParseToken(s string) (id, secret string, err error) {
	m := tokenRE.FindStringSubmatch(s)
	if m == nil {
		return "", "", fmt.Errorf("%w: not a toolwire API token (tw_<16 hex>_<43 base64url>)", ErrBadCredentials)
	}
	return m[1], m[2], nil
}

// ValidateTokenID checks a token id as `toolwire tokens revoke` takes it.
func ValidateTokenID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("%w token id %q: want the 16 hex digits `toolwire tokens list` shows", ErrInvalid, id)
	}
	return nil
}

// HashSecret is the digest the store keeps of a token's secret.
func HashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

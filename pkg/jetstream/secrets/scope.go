package secrets

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Level is how broad a secret's scope is.
type Level string

// Levels, from the narrowest; a secret resolves at the narrowest level that
// holds it: user, then workspace, then org (docs/policy.md, Secrets).
const (
	LevelUser      Level = "user"
	LevelWorkspace Level = "workspace"
	LevelOrg       Level = "org"
)

// ParseLevel parses "user", "workspace" or "org".
func ParseLevel(s string) (Level, error) {
	switch l := Level(s); l {
	case LevelUser, LevelWorkspace, LevelOrg:
		return l, nil
	}
	return "", fmt.Errorf("%w: scope %q is not one of user, workspace, org", ErrInvalid, s)
}

// ErrInvalid is wrapped when a scope, a name or a value is not acceptable.
var ErrInvalid = errors.New("invalid secret")

const maxIDLen = 256

// Scope is where a secret lives: an org, a workspace of an org, or a user of
// an org (a user's secrets follow them into every workspace of the org).
type Scope struct {
	Level       Level  `json:"level"`
	OrgID       string `json:"org_id"`
	WorkspaceID string `json:"workspace_id,omitempty"`
	UserID      string `json:"user_id,omitempty"`
}

// OrgScope is the scope of an org.
func OrgScope(org string) Scope { return Scope{Level: LevelOrg, OrgID: org} }

// WorkspaceScope is the scope of a workspace of an org.
func WorkspaceScope(org, workspace string) Scope {
	return Scope{Level: LevelWorkspace, OrgID: org, WorkspaceID: workspace}
}

// UserScope is the scope of a user of an org.
func UserScope(org, user string) Scope { return Scope{Level: LevelUser, OrgID: org, UserID: user} }

// NewScope builds the scope of a level from the ids; ids the level does not use
// must be empty, so that a mistaken flag is an error rather than ignored.
func NewScope(level Level, org, workspace, user string) (Scope, error) {
	s := Scope{Level: level, OrgID: org, WorkspaceID: workspace, UserID: user}
	return s, s.Validate()
}

// Validate checks that the scope has exactly the ids its level needs.
func (s Scope) Validate() error {
	var problems []string
	check := func(what, id string, want bool) {
		switch {
		case want && strings.TrimSpace(id) == "":
			problems = append(problems, fmt.Sprintf("%s scope needs a %s id", s.Level, what))
		case !want && id != "":
			problems = append(problems, fmt.Sprintf("%s scope takes no %s id", s.Level, what))
		case len(id) > maxIDLen || !utf8.ValidString(id):
			problems = append(problems, fmt.Sprintf("%s id must be valid UTF-8 of at most %d bytes", what, maxIDLen))
		}
	}
	switch s.Level {
	case LevelOrg:
		check("org", s.OrgID, true)
		check("workspace", s.WorkspaceID, false)
		check("user", s.UserID, false)
	case LevelWorkspace:
		check("org", s.OrgID, true)
		check("workspace", s.WorkspaceID, true)
		check("user", s.UserID, false)
	case LevelUser:
		check("org", s.OrgID, true)
		check("workspace", s.WorkspaceID, false)
		check("user", s.UserID, true)
	default:
		problems = append(problems, fmt.Sprintf("scope level %q is not one of user, workspace, org", s.Level))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(problems, "; "))
	}
	return nil
}

// String names the scope for people: "org acme", "workspace acme/research",
// "user acme/u-42".
func (s Scope) String() string {
	switch s.Level {
	case LevelWorkspace:
		return "workspace " + s.OrgID + "/" + s.WorkspaceID
	case LevelUser:
		return "user " + s.OrgID + "/" + s.UserID
	}
	return string(s.Level) + " " + s.OrgID
}

// ScopesFor lists the scopes a tenant's secrets resolve from, narrowest
// first: user (when the tenant names a user), workspace (when it names a
// workspace), org.
func ScopesFor(t envelope.Tenant) []Scope {
	var out []Scope
	if t.UserID != "" {
		out = append(out, UserScope(t.OrgID, t.UserID))
	}
	if t.WorkspaceID != "" {
		out = append(out, WorkspaceScope(t.OrgID, t.WorkspaceID))
	}
	return append(out, OrgScope(t.OrgID))
}

// enc encodes an id as one KV key token: unpadded base64url, whose alphabet
// (letters, digits, '-', '_') KV keys accept whatever the id holds.
func enc(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// prefix is the KV key prefix of the scope's secrets, ending in '.'.
func (s Scope) prefix() string {
	switch s.Level {
	case LevelWorkspace:
		return "workspace." + enc(s.OrgID) + "." + enc(s.WorkspaceID) + "."
	case LevelUser:
		return "user." + enc(s.OrgID) + "." + enc(s.UserID) + "."
	}
	return "org." + enc(s.OrgID) + "."
}

// key is the KV key of a secret: the scope's prefix and the name. It is also
// the additional data that a sealed value authenticates, so that a value
// copied to another scope or name does not open.
func (s Scope) key(name string) string { return s.prefix() + name }

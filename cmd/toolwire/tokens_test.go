package main

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
)

// TestTokensCommand: a token created by the CLI authenticates against the
// recorder's database with its org, workspace and role; list shows it
// without its secret; revoke ends it; bad input is refused before anything
// is written.
func TestTokensCommand(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	db := sqlite.URL(filepath.Join(t.TempDir(), "fresh", "recorder.db")) // not created yet: the command migrates
	tok, msg, err := runCLI(t, "", "tokens", "create", "--database-url", db, "--name", "ci dashboard", "--org", "acme", "--workspace", "eu",
		"--role", "approver", "--ttl", "24h")
	require.NoError(t, err, msg)
	tok = strings.TrimSpace(tok)
	id, _, err := auth.ParseToken(tok)
	require.NoError(t, err, "stdout holds the token alone: %q", tok)
	require.Contains(t, msg, "token "+id+" (ci dashboard): approver of acme/eu")

	ctx := t.Context()
	tokens, done, err := recorder.OpenTokens(ctx, db, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer done()
	a, err := auth.New(auth.Config{Required: true}, tokens, nil)
	require.NoError(t, err)
	p, err := a.Check(ctx, tok)
	require.NoError(t, err)
	require.Equal(t, auth.Principal{Name: "ci dashboard", Via: "token", OrgID: "acme", WorkspaceID: "eu", Role: auth.RoleApprover}, p)

	out, _, err := runCLI(t, "", "tokens", "list", "--database-url", db)
	require.NoError(t, err)
	require.Regexp(t, `ID\s+NAME\s+TENANT\s+ROLE\s+CREATED\s+EXPIRES\s+STATE`, out)
	require.Regexp(t, id+`\s+ci dashboard\s+acme/eu\s+approver\s+\S+\s+\S+\s+active`, out)
	_, secret, _ := auth.ParseToken(tok)
	require.NotContains(t, out, secret, "list never shows a secret")
	for _, format := range [][]string{{"--json"}, {"-o", "json"}} {
		out, _, err = runCLI(t, "", append([]string{"tokens", "list", "--database-url", db}, format...)...)
		require.NoError(t, err)
		var listed []map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
		require.Len(t, listed, 1)
		require.Equal(t, id, listed[0]["id"])
		require.Equal(t, "ci dashboard", listed[0]["name"])
		require.Equal(t, "acme", listed[0]["org_id"])
		require.Equal(t, "eu", listed[0]["workspace_id"])
		require.Equal(t, "approver", listed[0]["role"])
		require.Nil(t, listed[0]["revoked_at"])
		require.NotContains(t, out, secret, "list --json never shows a secret")
		require.NotContains(t, out, "hash", "nor its hash")
	}

	out, _, err = runCLI(t, "", "tokens", "revoke", id, "--database-url", db)
	require.NoError(t, err)
	require.Equal(t, "revoked: token "+id+"\n", out)
	_, err = a.Check(ctx, tok)
	require.ErrorIs(t, err, auth.ErrBadCredentials)
	require.ErrorContains(t, err, "revoked")
	out, _, err = runCLI(t, "", "tokens", "list", "--database-url", db)
	require.NoError(t, err)
	require.Contains(t, out, "revoked ")

	// An operator's admin token for every tenant, from DATABASE_URL.
	t.Setenv("DATABASE_URL", db)
	tok, _, err = runCLI(t, "", "tokens", "create", "--name", "ops", "--org", "*", "--role", "admin")
	require.NoError(t, err)
	p, err = a.Check(ctx, strings.TrimSpace(tok))
	require.NoError(t, err)
	require.True(t, p.AllTenants() && p.Can(auth.RoleAdmin), "%+v", p)

	// A producer's token (an upstream system's: submits and cancels its
	// tenant's runs over the HTTP API, decides nothing).
	tok, msg, err = runCLI(t, "", "tokens", "create", "--name", "ci-producer", "--org", "acme", "--workspace", "eu", "--role", "producer")
	require.NoError(t, err, msg)
	require.Contains(t, msg, "producer of acme/eu")
	p, err = a.Check(ctx, strings.TrimSpace(tok))
	require.NoError(t, err)
	require.Equal(t, auth.RoleProducer, p.Role)
	require.True(t, p.Can(auth.RoleProducer) && !p.Can(auth.RoleApprover), "%+v", p)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "--name", "x", "--org", "acme", "--role", "owner"}, `role "owner" is not one of viewer, producer, approver, admin`},
		{[]string{"create", "--name", "x", "--org", "*", "--role", "viewer"}, "only an admin token may cover every tenant"},
		{[]string{"create", "--org", "acme"}, "needs a name"},
		{[]string{"create", "--name", "x"}, `org ""`},
		{[]string{"create", "--name", "x", "--org", "acme/eu"}, `org "acme/eu"`},
		{[]string{"create", "--name", "x", "--org", "acme", "--ttl", "-1h"}, "lifetime must be positive"},
		{[]string{"revoke", "nothex"}, "want the 16 hex digits"},
		{[]string{"revoke", "0123456789abcdef"}, "token not found"},
		{[]string{"list", "--database-url", ""}, "--database-url (or DATABASE_URL) is required"},
	} {
		_, _, err := runCLI(t, "", append([]string{"tokens"}, tc.args...)...)
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}

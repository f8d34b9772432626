package main

import (
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

func TestSecretsCommands(t *testing.T) {
	env := eventstest.Start(t)
	key := "k1:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("K", 32)))
	t.Setenv(secrets.EnvMasterKeys, key)
	t.Setenv(secrets.EnvMasterKeyID, "")

	out, err := cli(t, env.URL, "s3cr3t-value\n", "secrets", "set", "API_KEY", "--scope", "workspace", "--org", "acme", "--workspace", "research")
	require.NoError(t, err, out)
	require.Equal(t, "secret API_KEY set in workspace acme/research (12 bytes)\n", out, "one trailing newline is not part of the value")
	out, err = cli(t, env.URL, "user-value", "secrets", "set", "API_KEY", "--scope", "user", "--org", "acme", "--user", "jane")
	require.NoError(t, err, out)

	// The executor's view: resolved narrowest first, the exact bytes.
	k, err := secrets.KeyringFromEnv(func(n string) string { return map[string]string{secrets.EnvMasterKeys: key}[n] })
	require.NoError(t, err)
	store, err := secrets.Open(t.Context(), env.JS, k)
	require.NoError(t, err)
	r, err := store.Resolve(t.Context(), envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "bob"}, "API_KEY")
	require.NoError(t, err)
	require.Equal(t, "s3cr3t-value", string(r.Value))
	r, err = store.Resolve(t.Context(), envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "jane"}, "API_KEY")
	require.NoError(t, err)
	require.Equal(t, "user-value", string(r.Value))

	out, err = cli(t, env.URL, "", "secrets", "list", "--scope", "workspace", "--org", "acme", "--workspace", "research")
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`(?m)^API_KEY\s+workspace acme/research\s+k1\s+\d{4}-`), out)
	require.NotContains(t, out, "s3cr3t")
	out, err = cli(t, env.URL, "", "secrets", "list", "--scope", "workspace", "--org", "acme", "--workspace", "research", "--json")
	require.NoError(t, err)
	var listed []secrets.Info
	require.NoError(t, json.Unmarshal([]byte(out), &listed), out)
	require.Len(t, listed, 1)
	require.Equal(t, "API_KEY", listed[0].Name)
	require.Equal(t, secrets.Scope{Level: secrets.LevelWorkspace, OrgID: "acme", WorkspaceID: "research"}, listed[0].Scope)
	require.NotContains(t, out, "s3cr3t")
	// The names set and rm keep: nothing for reindex to do.
	out, err = cli(t, env.URL, "", "secrets", "reindex")
	require.NoError(t, err, out)
	require.Equal(t, "0 secret names added or removed\n", out)
	out, err = cli(t, env.URL, "", "secrets", "list", "--scope", "user", "--org", "nobody", "--user", "u", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, "[]", out, "none is [], not null")

	for _, tc := range []struct {
		stdin string
		args  []string
		err   string
	}{
		{"v", []string{"secrets", "set", "API_KEY", "s3cr3t", "--scope", "org", "--org", "acme"},
			"its value is read from standard input, never from an argument"},
		{"", []string{"secrets", "set", "API_KEY", "--scope", "org", "--org", "acme"}, "no value on standard input"},
		{"value", []string{"secrets", "set", "API_KEY", "--org", "acme"}, "--scope is required"},
		{"value", []string{"secrets", "set", "API_KEY", "--scope", "team", "--org", "acme"}, `scope "team" is not one of user, workspace, org`},
		{"value", []string{"secrets", "set", "API_KEY", "--scope", "user", "--org", "acme"}, "user scope needs a user id"},
		{"value", []string{"secrets", "set", "API_KEY", "--scope", "org", "--org", "acme", "--user", "jane"}, "org scope takes no user id"},
		{"value", []string{"secrets", "set", "api-key", "--scope", "org", "--org", "acme"}, `secret name "api-key"`},
		{"", []string{"secrets", "rm", "NOPE", "--scope", "org", "--org", "acme"}, "secret NOPE in org acme: secret not found"},
	} {
		_, err := cli(t, env.URL, tc.stdin, tc.args...)
		require.ErrorContains(t, err, tc.err, strings.Join(tc.args, " "))
	}

	out, err = cli(t, env.URL, "", "secrets", "rm", "API_KEY", "--scope", "user", "--org", "acme", "--user", "jane")
	require.NoError(t, err)
	require.Equal(t, "secret API_KEY removed from user acme/jane\n", out)

	// Rotation: a new current key, then reseal, then the old key can go.
	newKey, err := cli(t, "", "", "secrets", "keygen", "--id", "k2")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(newKey, "k2:"))
	t.Setenv(secrets.EnvMasterKeys, key+","+strings.TrimSpace(newKey))
	t.Setenv(secrets.EnvMasterKeyID, "k2")
	out, err = cli(t, env.URL, "", "secrets", "rotate")
	require.NoError(t, err)
	require.Equal(t, "1 secrets resealed\n", out)
	t.Setenv(secrets.EnvMasterKeys, strings.TrimSpace(newKey))
	t.Setenv(secrets.EnvMasterKeyID, "")
	k2, err := secrets.KeyringFromEnv(func(n string) string { return map[string]string{secrets.EnvMasterKeys: strings.TrimSpace(newKey)}[n] })
	require.NoError(t, err)
	store2, err := secrets.Open(t.Context(), env.JS, k2)
	require.NoError(t, err)
	v, err := store2.Get(t.Context(), secrets.WorkspaceScope("acme", "research"), "API_KEY")
	require.NoError(t, err)
	require.Equal(t, "s3cr3t-value", string(v))

	// Without keys, set refuses; list still works.
	t.Setenv(secrets.EnvMasterKeys, "")
	_, err = cli(t, env.URL, "value", "secrets", "set", "X", "--scope", "org", "--org", "acme")
	require.ErrorIs(t, err, secrets.ErrNoKeyring)
	_, err = cli(t, env.URL, "", "secrets", "list", "--scope", "org", "--org", "acme")
	require.NoError(t, err)
}

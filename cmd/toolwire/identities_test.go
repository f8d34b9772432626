package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/stack"
)

// TestCLIWithDevIdentities: against a dev stack with identities, the CLI run
// from the dev's folder finds the operator's seed by itself; from anywhere
// else it is refused at once, with where to find the credentials, unless
// TOOLWIRE_NATS_NKEY_SEED_FILE names a seed; a producer's seed submits runs
// but cannot touch the registry.
func TestCLIWithDevIdentities(t *testing.T) {
	for _, k := range []string{service.EnvNATSSeedFile, service.EnvNATSCreds, service.EnvNATSInbox} {
		t.Setenv(k, "")
	}
	home := t.TempDir()
	st, err := stack.Start(t.Context(), stack.Options{DataDir: filepath.Join(home, devDataDir), Identities: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	t.Chdir(home)
	out, errOut, err := runCLI(t, "", "tools", "list", "--nats", st.URL)
	require.NoError(t, err, errOut)
	require.Contains(t, out, "echo@1.0.0")

	t.Chdir(t.TempDir())
	_, _, err = runCLI(t, "", "tools", "list", "--nats", st.URL)
	require.ErrorContains(t, err, "refused the CLI (no credentials")
	require.ErrorContains(t, err, service.EnvNATSSeedFile)

	t.Setenv(service.EnvNATSSeedFile, st.Identities.SeedFile(identity.Operator))
	_, errOut, err = runCLI(t, "", "tools", "list", "--nats", st.URL)
	require.NoError(t, err, errOut)

	t.Setenv(service.EnvNATSSeedFile, st.Identities.SeedFile(identity.Producer))
	t.Setenv(service.EnvNATSInbox, identity.Producer.InboxPrefix())
	out, errOut, err = runCLI(t, "", "run", "--demo", "--run-id", "cli-producer", "--nats", st.URL)
	require.NoError(t, err, errOut)
	require.Contains(t, out, `"response"`)
	_, _, err = runCLI(t, "", "tools", "block", "echo@1.0.0", "--timeout", "2s", "--nats", st.URL)
	require.Error(t, err, "a producer cannot change the registry")
	require.ErrorContains(t, err, "deadline exceeded", "refused by the server: no answer to the registry's requests")

	// The dev's seed is left there, but this server takes anyone (a dev
	// with --nats-auth=false): the CLI connects without it.
	t.Setenv(service.EnvNATSSeedFile, "")
	t.Setenv(service.EnvNATSInbox, "")
	open, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, open.Stop(context.Background())) })
	t.Chdir(home)
	_, errOut, err = runCLI(t, "", "tools", "list", "--nats", open.URL)
	require.NoError(t, err, errOut)

	t.Setenv(service.EnvNATSSeedFile, filepath.Join(home, "missing.nk"))
	_, _, err = runCLI(t, "", "tools", "list", "--nats", st.URL)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestIdentitiesCommand: the seeds land in --dir, private, and the printed
// configuration is one nats-server takes.
func TestIdentitiesCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ids")
	out, errOut, err := runCLI(t, "", "identities", "--dir", dir)
	require.NoError(t, err, errOut)
	require.Contains(t, errOut, dir)
	var o server.Options
	require.NoError(t, o.ProcessConfigString(out))
	require.Len(t, o.Nkeys, len(identity.Roles()))
	for _, r := range identity.Roles() {
		fi, err := os.Stat(identity.SeedFile(dir, r))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	}
	again, _, err := runCLI(t, "", "identities", "--dir", dir)
	require.NoError(t, err)
	require.Equal(t, out, again, "existing seeds are kept")

	// Producers limited to a tenant: their users, seeds and inbox prefixes.
	out, errOut, err = runCLI(t, "", "identities", "--dir", dir, "--tenant", "acme", "--tenant", "globex/eu")
	require.NoError(t, err, errOut)
	o = server.Options{}
	require.NoError(t, o.ProcessConfigString(out))
	require.Len(t, o.Nkeys, len(identity.Roles())+2)
	keys, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	for _, u := range o.Nkeys {
		switch u.Nkey {
		case keys.TenantPublic(identity.Tenant{Org: "acme"}):
			require.Equal(t, "tenant:acme", u.Account.Name)
			require.Equal(t, []string{"toolwire.intake.acme.>", "$JS.API.INFO"}, u.Permissions.Publish.Allow)
		case keys.TenantPublic(identity.Tenant{Org: "globex", Workspace: "eu"}):
			require.Equal(t, "tenant:globex/eu", u.Account.Name)
			require.Equal(t, []string{"toolwire.intake.globex.eu.*", "$JS.API.INFO"}, u.Permissions.Publish.Allow)
		}
	}
	for _, tn := range keys.Tenants() {
		require.Contains(t, errOut, service.EnvNATSSeedFile+"="+keys.TenantSeedFile(tn))
		require.Contains(t, errOut, service.EnvNATSInbox+"="+identity.TenantInboxPrefix(keys.TenantPublic(tn)))
	}
	again, _, err = runCLI(t, "", "identities", "--dir", dir)
	require.NoError(t, err)
	require.Equal(t, out, again, "the tenants are kept")

	// A worker's identity: its own account, its queues only.
	out, errOut, err = runCLI(t, "", "identities", "--dir", dir, "--worker", "billing+reports")
	require.NoError(t, err, errOut)
	o = server.Options{}
	require.NoError(t, o.ProcessConfigString(out))
	w := identity.Worker{Queues: []string{"billing", "reports"}}
	keys, err = identity.LoadOrCreate(dir)
	require.NoError(t, err)
	require.Contains(t, errOut, service.EnvNATSSeedFile+"="+keys.WorkerSeedFile(w))
	found := false
	for _, u := range o.Nkeys {
		if u.Nkey == keys.WorkerPublic(w) {
			found = true
			require.Equal(t, "worker:billing+reports", u.Account.Name)
			require.Contains(t, u.Permissions.Subscribe.Allow, "toolwire.worker.billing.*")
			require.NotContains(t, u.Permissions.Publish.Allow, "toolwire.call.*.*.completed")
		}
	}
	require.True(t, found, "the worker's user is in the config")
	_, _, err = runCLI(t, "", "identities", "--dir", dir, "--worker", "billing")
	require.ErrorIs(t, err, identity.ErrWorker, "a queue belongs to one worker identity")

	_, _, err = runCLI(t, "", "identities", "--dir", dir, "--tenant", "acme.corp")
	require.ErrorIs(t, err, identity.ErrTenant)
	require.ErrorContains(t, err, `--tenant "acme.corp"`)
}

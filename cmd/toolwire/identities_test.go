package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestIdentitiesOut: --out writes the accounts block to a file nats-server
// includes, the same file again at every run (the seeds are kept, a worker
// added before is kept too); a folder it cannot write in is named in the
// error.
func TestIdentitiesOut(t *testing.T) {
	home := t.TempDir()
	dir, out := filepath.Join(home, "seeds"), filepath.Join(home, "accounts.conf")
	stdout, errOut, err := runCLI(t, "", "identities", "--dir", dir, "--out", out, "--worker", "example")
	require.NoError(t, err, errOut)
	require.Empty(t, stdout, "the block goes to the file, not to stdout")
	require.Contains(t, errOut, out)
	first, err := os.ReadFile(out)
	require.NoError(t, err)
	fi, err := os.Stat(out)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), fi.Mode().Perm(), "public keys only: the server may run as another user")

	conf := filepath.Join(home, "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte("jetstream { store_dir: \""+filepath.Join(home, "js")+"\" }\ninclude ./accounts.conf\n"), 0o600))
	o, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	require.True(t, o.JetStream)
	keys, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	var accounts []string
	for _, a := range o.Accounts {
		accounts = append(accounts, a.Name)
	}
	require.Subset(t, accounts, []string{identity.SystemAccount, identity.ProducerAccount,
		identity.WorkerAccount(identity.Worker{Queues: []string{"example"}})})
	require.Len(t, o.Nkeys, len(identity.Roles())+1)

	// A restart: the same seeds, the same file, no temporary file left.
	_, errOut, err = runCLI(t, "", "identities", "--dir", dir, "--out", out)
	require.NoError(t, err, errOut)
	again, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, string(first), string(again), "existing seeds are reused")
	again2, err := identity.LoadOrCreate(dir)
	require.NoError(t, err)
	require.Equal(t, keys.Public(identity.Executor), again2.Public(identity.Executor))
	entries, err := os.ReadDir(home)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"seeds", "accounts.conf", "nats.conf"}, names)

	// Not a folder it can write in (a file stands where the folder should
	// be: this test may run as root, whom no mode stops).
	blocked := filepath.Join(home, "nats.conf", "accounts.conf")
	_, _, err = runCLI(t, "", "identities", "--dir", dir, "--out", blocked)
	require.Error(t, err)
	require.ErrorContains(t, err, "--out")
	require.ErrorContains(t, err, "cannot write in the folder of "+blocked)
	require.ErrorIs(t, err, syscall.ENOTDIR)
}

// TestIdentitiesCopySeed: copy-seed turns a seed another user's group may
// read (a Kubernetes Secret volume's, with an fsGroup) into one the binaries
// take, and refuses what is no user seed.
func TestIdentitiesCopySeed(t *testing.T) {
	home := t.TempDir()
	keys, err := identity.LoadOrCreate(filepath.Join(home, "seeds"))
	require.NoError(t, err)
	src := filepath.Join(home, "secret.nk")
	b, err := os.ReadFile(keys.SeedFile(identity.Executor))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(src, b, 0o440))
	_, err = identity.PublicKey(src)
	require.ErrorIs(t, err, identity.ErrSeedFile, "the binaries refuse a group-readable seed")

	dst := filepath.Join(home, "seed.nk")
	for range 2 { // an init container runs again when its pod restarts
		_, errOut, err := runCLI(t, "", "identities", "copy-seed", src, dst)
		require.NoError(t, err, errOut)
		require.Contains(t, errOut, keys.Public(identity.Executor))
		pub, err := identity.PublicKey(dst)
		require.NoError(t, err)
		require.Equal(t, keys.Public(identity.Executor), pub)
		fi, err := os.Stat(dst)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	}

	bad := filepath.Join(home, "bad.nk")
	require.NoError(t, os.WriteFile(bad, []byte("not a seed\n"), 0o400))
	_, _, err = runCLI(t, "", "identities", "copy-seed", bad, filepath.Join(home, "bad-copy.nk"))
	require.ErrorIs(t, err, identity.ErrSeedFile)
	require.ErrorContains(t, err, bad)
	require.NoFileExists(t, filepath.Join(home, "bad-copy.nk"), "nothing is left where a binary would read it")
	_, _, err = runCLI(t, "", "identities", "copy-seed", bad, dst)
	require.ErrorIs(t, err, identity.ErrSeedFile)
	pub, err := identity.PublicKey(dst)
	require.NoError(t, err, "a bad seed leaves the good copy in place")
	require.Equal(t, keys.Public(identity.Executor), pub)
	entries, err := os.ReadDir(home)
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.HasPrefix(e.Name(), "."), "temporary file %s left behind", e.Name())
	}

	_, _, err = runCLI(t, "", "identities", "copy-seed", filepath.Join(home, "missing.nk"), dst)
	require.ErrorIs(t, err, os.ErrNotExist)
}

package service_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/embedded"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

func TestCommonFromEnvIdentityRejects(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		msg  string
	}{
		{"seed and creds", map[string]string{service.EnvNATSSeedFile: "/a.nk", service.EnvNATSCreds: "/a.creds"}, "set either TOOLWIRE_NATS_NKEY_SEED_FILE or NATS_CREDS, not both"},
		{"inbox with a dot", map[string]string{service.EnvNATSInbox: "_INBOX.x"}, "want one subject token"},
		{"inbox wildcard", map[string]string{service.EnvNATSInbox: "_INBOX_>"}, "want one subject token"},
		{"inbox too long", map[string]string{service.EnvNATSInbox: string(make([]byte, 65))}, "TOOLWIRE_NATS_INBOX_PREFIX"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := service.CommonFromEnv("policy", ":8082", envOf(tc.env))
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// TestRunWithIdentity: a service binary on a server with toolwire's roles
// connects with the seed its environment names, its replies under its
// role's inbox; a missing or unknown seed fails the start at once, saying
// why.
func TestRunWithIdentity(t *testing.T) {
	keys, err := identity.LoadOrCreate(filepath.Join(t.TempDir(), "ids"))
	require.NoError(t, err)
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Users: keys.ServerUsers()})
	require.NoError(t, err)
	t.Cleanup(func() { embedded.Stop(s) })
	opts, err := identity.ConnectOptions(identity.Operator, keys.SeedFile(identity.Operator))
	require.NoError(t, err)
	op, err := nats.Connect(s.ClientURL(), opts...)
	require.NoError(t, err)
	defer op.Close()
	ojs, err := jetstream.New(op)
	require.NoError(t, err)
	require.NoError(t, events.Provision(t.Context(), ojs, events.StoreConfig{Replicas: 1}))

	started := make(chan service.Deps, 1)
	build := func(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
		started <- d
		return &component{}, nil, nil
	}
	env := func(seed string) func(string) string {
		return envOf(map[string]string{
			service.EnvNATSURL: s.ClientURL(), service.EnvHTTPAddr: "127.0.0.1:0", service.EnvLogLevel: "error",
			service.EnvNATSSeedFile: seed,
		})
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, "policy", ":0", env(keys.SeedFile(identity.Policy)), build) }()
	var d service.Deps
	select {
	case d = <-started:
	case err := <-done:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the service never started")
	}
	require.Equal(t, keys.SeedFile(identity.Policy), d.Common.NATSSeedFile)
	// It is the policy user: its replies come under its own inbox, and a
	// request through JetStream's API gets an answer.
	require.Contains(t, d.Conn.NewRespInbox(), identity.Policy.InboxPrefix()+".")
	_, err = d.JS.Stream(ctx, events.StreamCalls)
	require.NoError(t, err)
	cancel()
	require.NoError(t, <-done)

	for name, seed := range map[string]string{
		"missing": filepath.Join(t.TempDir(), "none.nk"),
		"unknown": func() string {
			other, err := identity.LoadOrCreate(t.TempDir())
			require.NoError(t, err)
			return other.SeedFile(identity.Policy)
		}(),
	} {
		err := service.Run(t.Context(), "policy", ":0", env(seed), build)
		require.Error(t, err, name)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "%s: refused at once, not after the start-up bound", name)
		if name == "missing" {
			require.ErrorIs(t, err, os.ErrNotExist)
			require.ErrorContains(t, err, service.EnvNATSSeedFile)
		} else {
			require.ErrorIs(t, err, nats.ErrAuthorization)
		}
	}
}

package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// A Start that fails part way releases what it had set up (the registry
// watch, the approval watch, the consumers already started: each holds a
// subscription of the service's connection, and their goroutines are
// checked by TestMain), and leaves the service stopped.
func TestFailedStartReleasesWhatItSetUp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(ctx context.Context, js jetstream.JetStream) error
		err     string
	}{
		{name: "approvals bucket missing", err: "open approvals",
			breakIt: func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteKeyValue(ctx, events.BucketApprovals)
			}},
		{name: "calls stream missing", err: "stream " + events.StreamCalls,
			breakIt: func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteStream(ctx, events.StreamCalls)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := eventstest.Start(t)
			ctx := t.Context()
			require.NoError(t, tc.breakIt(ctx, env.JS))
			nc := env.Connect(t)
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			// A first request sets up the connection's response subscription,
			// which stays; everything after it must go.
			_, err = js.AccountInfo(ctx)
			require.NoError(t, err)
			subs := nc.NumSubscriptions()

			svc, err := orchestrator.New(service.Deps{Conn: nc, JS: js}, orchestrator.Config{})
			require.NoError(t, err)
			require.ErrorContains(t, svc.Start(ctx), tc.err)
			require.Equal(t, subs, nc.NumSubscriptions(), "every watch and consumer is gone")
			require.False(t, svc.Running())
			require.ErrorIs(t, svc.Start(ctx), service.ErrStopped)
			require.NoError(t, svc.Stop(ctx))
		})
	}
}

// Start is refused once started and after Stop; Stop is idempotent.
func TestStartStop(t *testing.T) {
	env := eventstest.Start(t)
	svc, err := orchestrator.New(service.Deps{Conn: env.Conn, JS: env.JS}, orchestrator.Config{})
	require.NoError(t, err)
	require.NoError(t, svc.Stop(t.Context()), "a Stop before Start")
	svc, err = orchestrator.New(service.Deps{Conn: env.Conn, JS: env.JS}, orchestrator.Config{})
	require.NoError(t, err)
	require.NoError(t, svc.Start(t.Context()))
	require.True(t, svc.Running())
	require.ErrorIs(t, svc.Start(t.Context()), service.ErrAlreadyStarted)
	require.NoError(t, svc.Stop(t.Context()))
	require.NoError(t, svc.Stop(t.Context()))
	require.ErrorIs(t, svc.Start(t.Context()), service.ErrStopped)
	<-svc.Done()
}

// Build reads the environment, then applies the options: what the binary and
// `toolwire dev` run.
func TestBuild(t *testing.T) {
	env := eventstest.Start(t)
	mine := provider.Func(func(context.Context, provider.Request) (envelope.ModelResponse, error) {
		return envelope.ModelResponse{Content: "mine"}, nil
	})
	d := service.Deps{Conn: env.Conn, JS: env.JS, Getenv: func(k string) string {
		return map[string]string{orchestrator.EnvConcurrency: "8", orchestrator.EnvOpenAIKey: "sk-example"}[k]
	}}
	svc, err := orchestrator.Build(d, orchestrator.WithProviders(orchestrator.Providers{"mine": mine}),
		func(c *orchestrator.Config) { c.ModelTimeout = time.Second })
	require.NoError(t, err)
	cfg := svc.Config()
	require.Equal(t, 8, cfg.Concurrency)
	require.Equal(t, time.Second, cfg.ModelTimeout)
	require.Equal(t, "sk-example", cfg.OpenAI.APIKey)
	require.Equal(t, []string{"mine", "openai", "scripted"}, cfg.Providers.Names())

	d.Getenv = func(k string) string { return map[string]string{orchestrator.EnvConcurrency: "0"}[k] }
	_, err = orchestrator.Build(d)
	require.EqualError(t, err, `orchestrator configuration: TOOLWIRE_ORCHESTRATOR_CONCURRENCY="0": want a whole number from 1 to 4096`)
}

package executor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
)

// TestHeartbeatsAnnounceTheQueues: a started executor is a live worker of
// each queue it serves (the registry shows it with its id and tools), keeps
// beating while it runs, and leaves its queues at Stop.
func TestHeartbeatsAnnounceTheQueues(t *testing.T) {
	env := eventstest.Start(t)
	s := newExecutor(t, testDeps(t, env, nil), Config{ID: "ex-beat", Heartbeat: time.Second}, WithQueues("default", "text"))
	start(t, s)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = s.Stop(context.Background())
		}
	})

	ws, err := registry.ListWorkers(t.Context(), env.JS, time.Now())
	require.NoError(t, err)
	byQ := registry.ByQueue(ws)
	for _, q := range []string{"default", "text"} {
		require.Len(t, byQ[q], 1, "queue %s", q)
		w := byQ[q][0]
		require.Equal(t, "ex-beat", w.ID)
		require.Equal(t, 3*time.Second, w.TTL)
		require.True(t, slices.Contains(w.Tools, "echo@1.0.0"), "tools %v", w.Tools)
	}
	first := byQ["text"][0].SeenAt

	// It beats again while it runs: the beat moves on.
	require.Eventually(t, func() bool {
		ws, err := registry.ListWorkers(t.Context(), env.JS, time.Now())
		return err == nil && len(ws) == 2 && ws[1].SeenAt.After(first)
	}, 10*time.Second, 50*time.Millisecond)

	require.NoError(t, s.Stop(t.Context()))
	stopped = true
	ws, err = registry.ListWorkers(t.Context(), env.JS, time.Now())
	require.NoError(t, err)
	require.Empty(t, ws, "a stopped executor serves no queue")
}

func TestHeartbeatConfig(t *testing.T) {
	require.Equal(t, DefaultHeartbeat, Config{}.WithDefaults().Heartbeat)
	for _, d := range []time.Duration{time.Millisecond, time.Hour} {
		require.ErrorContains(t, Config{Heartbeat: d}.Validate(), "heartbeat")
	}
	c, err := ConfigFromEnv(servicetest.Getenv(map[string]string{EnvHeartbeat: "2s"}))
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, c.Heartbeat)
	_, err = ConfigFromEnv(servicetest.Getenv(map[string]string{EnvHeartbeat: "10ms"}))
	require.ErrorContains(t, err, EnvHeartbeat)
}

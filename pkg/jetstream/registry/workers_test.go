package registry_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

func worker(queue, instance string, ttl time.Duration) registry.Worker {
	return registry.Worker{Queue: queue, Instance: instance, ID: "host-" + instance, Tools: []string{"upper@1.0.0"},
		StartedAt: time.Now().UTC(), TTL: ttl}
}

func TestWorkerHeartbeats(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)
	now := time.Now()
	require.NoError(t, registry.Beat(ctx, env.JS, worker("text", "a1", time.Minute), now))
	require.NoError(t, registry.Beat(ctx, env.JS, worker("text", "b2", time.Minute), now))
	require.NoError(t, registry.Beat(ctx, env.JS, worker("default", "a1", time.Minute), now))
	// A second beat replaces the first: one key per queue and process.
	require.NoError(t, registry.Beat(ctx, env.JS, worker("text", "a1", time.Minute), now.Add(time.Second)))

	ws, err := registry.ListWorkers(ctx, env.JS, now.Add(2*time.Second))
	require.NoError(t, err)
	require.Len(t, ws, 3)
	byQ := registry.ByQueue(ws)
	require.Len(t, byQ["text"], 2)
	require.Len(t, byQ["default"], 1)
	require.Equal(t, []string{"upper@1.0.0"}, byQ["text"][0].Tools)
	require.WithinDuration(t, now.Add(time.Second), byQ["text"][0].SeenAt, time.Millisecond)

	// A beat that no longer holds does not count, whatever the bucket keeps.
	ws, err = registry.ListWorkers(ctx, env.JS, now.Add(2*time.Minute))
	require.NoError(t, err)
	require.Empty(t, ws)

	// Leave removes the worker at once.
	require.NoError(t, registry.Leave(ctx, env.JS, "text", "b2"))
	ws, err = registry.ListWorkers(ctx, env.JS, now)
	require.NoError(t, err)
	require.Len(t, registry.ByQueue(ws)["text"], 1)
}

func TestWorkerHeartbeatExpiresInTheBucket(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)
	require.NoError(t, registry.Beat(ctx, env.JS, worker("short", "x1", time.Second), time.Now()))
	kv, err := env.JS.KeyValue(ctx, "toolwire_workers")
	require.NoError(t, err)
	_, err = kv.Get(ctx, registry.WorkerKey("short", "x1"))
	require.NoError(t, err)
	// The server drops the key with its per-message TTL: a dead worker's
	// beat leaves no value behind.
	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, registry.WorkerKey("short", "x1"))
		return err != nil
	}, 10*time.Second, 100*time.Millisecond)
}

func TestWorkerHeartbeatRefusals(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)
	long := make([]string, registry.MaxWorkerTools+1)
	for i := range long {
		long[i] = "t@1.0.0"
	}
	for name, w := range map[string]registry.Worker{
		"bad queue":       worker("Bad.Queue", "a1", time.Minute),
		"bad instance":    worker("text", "a.b", time.Minute),
		"empty instance":  worker("text", "", time.Minute),
		"ttl too short":   worker("text", "a1", time.Millisecond),
		"ttl too long":    worker("text", "a1", time.Hour),
		"too many tools":  {Queue: "text", Instance: "a1", TTL: time.Minute, Tools: long},
		"too much health": {Queue: "text", Instance: "a1", TTL: time.Minute, Health: make([]registry.ToolHealth, registry.MaxWorkerTools+1)},
	} {
		require.Error(t, registry.Beat(ctx, env.JS, w, time.Now()), name)
	}
}

func TestWatchWorkersWait(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)
	ws, err := registry.WatchWorkers(ctx, env.JS, nil)
	require.NoError(t, err)
	defer ws.Stop()

	// Nobody serves "text": the wait ends at its bound, naming it.
	start := time.Now()
	missing, err := ws.Wait(ctx, []string{"text", "text"}, 300*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, []string{"text"}, missing)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

	// A worker that starts during the wait ends it.
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = registry.Beat(ctx, env.JS, worker("text", "a1", time.Minute), time.Now())
	}()
	missing, err = ws.Wait(ctx, []string{"text"}, 20*time.Second)
	require.NoError(t, err)
	require.Empty(t, missing)
	require.Len(t, ws.Live("text"), 1)

	// One that leaves is gone from the view.
	require.NoError(t, registry.Leave(ctx, env.JS, "text", "a1"))
	require.Eventually(t, func() bool { return len(ws.Live("text")) == 0 }, 5*time.Second, 20*time.Millisecond)
}

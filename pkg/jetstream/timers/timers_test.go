package timers_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/timers"
)

func startTimers(t *testing.T, env *eventstest.Env, h timers.TimerHandler) {
	t.Helper()
	tr, err := timers.NewTimerRunner(env.JS, timers.TimerConfig{Durable: "test-timers", Kind: "run", Handler: h,
		Backoff: shortBackoff, Logger: quietLogger()})
	require.NoError(t, err)
	require.NoError(t, tr.Start(testCtx(t)))
	eventstest.StopAtCleanup(t, tr)
}

// startFiring starts a timer runner whose handler hands each fired timer's
// id to the channel it returns.
func startFiring(t *testing.T, env *eventstest.Env) <-chan string {
	t.Helper()
	got := make(chan string, 1)
	startTimers(t, env, func(_ context.Context, _, id string) error { got <- id; return nil })
	return got
}

// requireFired waits for the timer want to fire on got; after 10s the test
// fails with why.
func requireFired(t *testing.T, got <-chan string, want, why string) {
	t.Helper()
	select {
	case id := <-got:
		require.Equal(t, want, id)
	case <-time.After(10 * time.Second):
		t.Fatal(why)
	}
}

// A timer fires once, after its time, on the consumer; a failing handler is
// called again until it succeeds; the fired timer leaves nothing behind.
func TestTimerFiresOnceAfterItsTime(t *testing.T) {
	env := eventstest.Start(t)
	var (
		mu    sync.Mutex
		fired = map[string][]time.Time{}
		fails atomic.Int32
	)
	start := time.Now()
	startTimers(t, env, func(_ context.Context, kind, id string) error {
		require.Equal(t, "run", kind)
		if id == "flaky" && fails.Add(1) <= 2 {
			return errors.New("state unreadable")
		}
		mu.Lock()
		defer mu.Unlock()
		fired[id] = append(fired[id], time.Now())
		return nil
	})
	ctx := testCtx(t)
	require.NoError(t, timers.ArmTimer(ctx, env.JS, "run", "r1", start.Add(time.Second)))
	require.NoError(t, timers.ArmTimer(ctx, env.JS, "run", "r1", start.Add(time.Second)), "arming again is a no-op")
	require.NoError(t, timers.ArmTimer(ctx, env.JS, "run", "flaky", start.Add(1500*time.Millisecond)))
	require.NoError(t, timers.ArmTimer(ctx, env.JS, "run", "later", start.Add(time.Hour)))

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fired["r1"]) == 1 && len(fired["flaky"]) == 1
	}, 15*time.Second, 20*time.Millisecond)
	mu.Lock()
	require.False(t, fired["r1"][0].Before(start.Add(time.Second)), "not before its time")
	require.NotContains(t, fired, "later")
	mu.Unlock()
	require.EqualValues(t, 3, fails.Load())
	require.Eventually(t, func() bool { return streamMsgs(t, env.JS, provision.StreamTimers) == 1 }, 5*time.Second, 20*time.Millisecond,
		"only the armed timer is left: the fired ones' markers are deleted")
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	require.Len(t, fired["r1"], 1, "fired once")
	mu.Unlock()
}

// A timer that fires while no runner is there fires when one starts.
func TestTimerFiresAfterARestart(t *testing.T) {
	env := eventstest.Start(t)
	require.NoError(t, timers.ArmTimer(testCtx(t), env.JS, "run", "r2", time.Now().Add(time.Second)))
	time.Sleep(2500 * time.Millisecond) // fired with nobody listening
	requireFired(t, startFiring(t, env), "r2", "the timer that fired meanwhile was not handled")
}

// A timer started without waiting (StartTimer) is stored once Wait returns,
// and fires as one armed with ArmTimer does.
func TestStartedTimerFires(t *testing.T) {
	env := eventstest.Start(t)
	got := startFiring(t, env)
	ctx := testCtx(t)
	a, err := timers.StartTimer(env.JS, "run", "r3", time.Now().Add(time.Second))
	require.NoError(t, err)
	require.NoError(t, a.Wait(ctx))
	again, err := timers.StartTimer(env.JS, "run", "later", time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.NoError(t, again.Wait(ctx))
	require.EqualValues(t, 2, streamMsgs(t, env.JS, provision.StreamTimers), "both are stored once Wait returns")
	requireFired(t, got, "r3", "the started timer did not fire")
}

// A started timer that cannot be stored says so in Wait; its bad arguments
// are refused at once, as ArmTimer refuses them.
func TestStartTimerFailures(t *testing.T) {
	env := eventstest.Start(t)
	_, err := timers.StartTimer(env.JS, "run", "a.b", time.Now().Add(time.Minute))
	require.ErrorIs(t, err, events.ErrUnsafeID)
	_, err = timers.StartTimer(env.JS, "run", "a", time.Now().Add(timers.MaxTimer+time.Hour))
	require.ErrorContains(t, err, "further than")

	ctx := testCtx(t)
	require.NoError(t, env.JS.DeleteStream(ctx, provision.StreamTimers))
	a, err := timers.StartTimer(env.JS, "run", "lost", time.Now().Add(time.Minute))
	require.NoError(t, err, "sent: the failure comes back in Wait")
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.ErrorContains(t, a.Wait(wctx), "arm timer toolwire.timer.run.lost")
}

func TestArmTimerRejects(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)
	require.ErrorIs(t, timers.ArmTimer(ctx, env.JS, "run", "a.b", time.Now().Add(time.Minute)), events.ErrUnsafeID)
	require.ErrorIs(t, timers.ArmTimer(ctx, env.JS, "r*n", "a", time.Now().Add(time.Minute)), events.ErrUnsafeID)
	require.ErrorContains(t, timers.ArmTimer(ctx, env.JS, "run", "a", time.Now().Add(timers.MaxTimer+time.Hour)), "further than")
	_, err := timers.NewTimerRunner(env.JS, timers.TimerConfig{Durable: "d", Kind: "run"})
	require.ErrorContains(t, err, "nil handler")
}

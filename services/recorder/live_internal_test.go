package recorder

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
)

// TestLiveNudgesTheStreamsOfWatchedRuns: watching a run nudges every
// consumer at once (what the run stored before is fetched), then the
// consumer of each stream the run's events go by on; another run's events
// nudge nothing; once the last of its watchers stops, the run is no longer
// followed.
func TestLiveNudgesTheStreamsOfWatchedRuns(t *testing.T) {
	env := eventstest.Start(t)
	nc := env.Connect(t)
	l := newLive(nc, eventstest.QuietLogger())
	nudged := make(chan string, 64)
	for _, s := range []string{events.StreamRuns, events.StreamCalls, events.StreamSandbox} {
		l.setNudge(s, func() { nudged <- s })
	}
	next := func() string {
		select {
		case s := <-nudged:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no nudge")
			return ""
		}
	}
	stop1 := l.Watch("watched")
	stop2 := l.Watch("watched")
	got := map[string]bool{}
	for range 3 {
		got[next()] = true
	}
	require.Len(t, got, 3, "a new watch fetches every stream once")
	publish := func(subject string) {
		require.NoError(t, nc.Publish(subject, nil))
		require.NoError(t, nc.Flush())
	}
	publish("toolwire.run.other.started") // not watched
	publish("toolwire.call.watched.0123.completed")
	require.Equal(t, events.StreamCalls, next())
	publish("toolwire.sandbox.watched.0123.completed")
	require.Equal(t, events.StreamSandbox, next())
	publish("toolwire.run.watched.completed")
	require.Equal(t, events.StreamRuns, next())

	stop1()
	stop1() // once per Watch
	l.mu.Lock()
	require.Contains(t, l.runs, "watched", "a second watcher still waits")
	l.mu.Unlock()
	stop2()
	l.mu.Lock()
	require.NotContains(t, l.runs, "watched")
	l.mu.Unlock()
	publish("toolwire.run.watched.cancel_requested")
	select {
	case s := <-nudged:
		t.Fatalf("a run no one watches nudged %s", s)
	default:
	}
	require.NotPanics(t, func() { l.Watch("not a token")() }, "an unsafe run id is not followed")
}

package recorder

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
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

// TestDeltaBuffer: the buffer holds the deltas of the run's current model
// call, from its last discarded attempt on, within its bounds, and none of
// a call whose turn is recorded; a call that starts over without its
// discarded delta is announced discarded all the same.
func TestDeltaBuffer(t *testing.T) {
	text := func(iteration, attempt, seq int) events.Delta {
		return events.Delta{RunID: "r", Iteration: iteration, Attempt: attempt, Seq: seq, Text: "x"}
	}
	discarded := func(iteration, attempt, seq int) events.Delta {
		return events.Delta{RunID: "r", Iteration: iteration, Attempt: attempt, Seq: seq, Discarded: true}
	}
	type step struct {
		add     *events.Delta
		drop    int // a turn recorded
		relayed []events.Delta
	}
	ptr := func(d events.Delta) *events.Delta { return &d }
	for _, tc := range []struct {
		name  string
		steps []step
		held  []events.Delta
	}{
		{"the current call's", []step{
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{text(1, 1, 1)}},
			{add: ptr(text(1, 1, 2)), relayed: []events.Delta{text(1, 1, 2)}},
		}, []events.Delta{text(1, 1, 1), text(1, 1, 2)}},
		{"a new call replaces the last", []step{
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{text(1, 1, 1)}},
			{add: ptr(text(2, 1, 1)), relayed: []events.Delta{text(2, 1, 1)}},
			{add: ptr(text(1, 1, 2))}, // a straggler of a call that is over
		}, []events.Delta{text(2, 1, 1)}},
		{"from the last discarded attempt on", []step{
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{text(1, 1, 1)}},
			{add: ptr(discarded(1, 1, 2)), relayed: []events.Delta{discarded(1, 1, 2)}},
			{add: ptr(text(1, 2, 3)), relayed: []events.Delta{text(1, 2, 3)}},
		}, []events.Delta{discarded(1, 1, 2), text(1, 2, 3)}},
		{"a call redelivered after its discarded delta starts at seq 1", []step{
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{text(1, 1, 1)}},
			{add: ptr(discarded(1, 1, 2)), relayed: []events.Delta{discarded(1, 1, 2)}},
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{text(1, 1, 1)}},
		}, []events.Delta{discarded(1, 1, 2), text(1, 1, 1)}},
		{"a call that starts over without saying so", []step{
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{text(1, 1, 1)}},
			{add: ptr(text(1, 1, 2)), relayed: []events.Delta{text(1, 1, 2)}},
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{discarded(1, 1, 3), text(1, 1, 1)}},
		}, []events.Delta{discarded(1, 1, 3), text(1, 1, 1)}},
		{"none of a call whose turn is recorded", []step{
			{add: ptr(text(1, 1, 1)), relayed: []events.Delta{text(1, 1, 1)}},
			{drop: 1},
			{add: ptr(text(1, 1, 2))},
		}, nil},
		{"a turn recorded keeps the next call's", []step{
			{add: ptr(text(2, 1, 1)), relayed: []events.Delta{text(2, 1, 1)}},
			{drop: 1},
		}, []events.Delta{text(2, 1, 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b deltaBuffer
			for i, s := range tc.steps {
				if s.add == nil {
					b.drop(s.drop)
					continue
				}
				got, full := b.add(*s.add, 10)
				require.False(t, full)
				require.Equal(t, s.relayed, got, "step %d", i)
			}
			require.Equal(t, tc.held, nilIfEmpty(b.held()))
		})
	}
}

func nilIfEmpty(ds []events.Delta) []events.Delta {
	if len(ds) == 0 {
		return nil
	}
	return ds
}

// TestDeltaBufferBounds: past maxBufferedDeltas deltas or maxBufferedBytes
// bytes of one call, the buffer keeps no more (and says so once), while
// every delta is still relayed; a discarded attempt makes room again.
func TestDeltaBufferBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
		room int
	}{
		{"deltas", 1, maxBufferedDeltas},
		{"bytes", maxBufferedBytes / 10, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b deltaBuffer
			fulls := 0
			for seq := 1; seq <= tc.room+5; seq++ {
				out, full := b.add(events.Delta{RunID: "r", Iteration: 1, Attempt: 1, Seq: seq, Text: "x"}, tc.size)
				require.Len(t, out, 1, "relayed all the same")
				if full {
					fulls++
				}
			}
			require.Equal(t, 1, fulls)
			require.Len(t, b.held(), tc.room)
			_, full := b.add(events.Delta{RunID: "r", Iteration: 1, Attempt: 1, Seq: tc.room + 6, Discarded: true}, tc.size)
			require.False(t, full)
			require.Len(t, b.held(), 1)
		})
	}
}

// TestLiveRelaysDeltas: Deltas hands a reader the deltas held of the run's
// current call, then the next ones, valid ones only; a turn recorded voids
// what is held of its call; the last reader gone, the run is not followed.
func TestLiveRelaysDeltas(t *testing.T) {
	env := eventstest.Start(t)
	nc := env.Connect(t)
	l := newLive(nc, eventstest.QuietLogger())
	pub := env.Connect(t)
	send := func(d events.Delta) {
		subj, err := events.DeltaSubject(d.RunID, d.Iteration)
		require.NoError(t, err)
		b, err := events.EncodeDelta(d)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(subj, b))
		require.NoError(t, pub.Flush())
	}
	next := func(ch <-chan events.Delta) events.Delta {
		select {
		case d := <-ch:
			return d
		case <-time.After(10 * time.Second):
			t.Fatal("no delta")
			return events.Delta{}
		}
	}
	d := func(seq int) events.Delta {
		return events.Delta{RunID: "run-d", Iteration: 1, Attempt: 1, Seq: seq, Text: "x"}
	}

	held, first, stop1 := l.Deltas("run-d")
	require.Empty(t, held)
	send(d(1))
	require.NoError(t, pub.Publish("toolwire.delta.run-d.1", []byte(`{"bad":true}`)))
	send(d(2))
	require.Equal(t, d(1), next(first))
	require.Equal(t, d(2), next(first), "the invalid delta is dropped")

	held, second, stop2 := l.Deltas("run-d")
	require.Equal(t, []events.Delta{d(1), d(2)}, held)
	send(d(3))
	require.Equal(t, d(3), next(first))
	require.Equal(t, d(3), next(second))

	l.recorded([]store.Record{{Event: store.EventRow{RunID: "run-d", Type: events.TypeTurnCompleted}, Turn: &store.TurnRow{RunID: "run-d", Iteration: 1}}})
	held, _, stop3 := l.Deltas("run-d")
	require.Empty(t, held, "the turn is recorded")
	stop3()
	stop1()
	stop2()
	stop2() // once per Deltas
	l.mu.Lock()
	require.NotContains(t, l.runs, "run-d")
	l.mu.Unlock()
}

package orchestrator

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

// gatedKV holds every Update while closed, so that a test can make changes
// queue up behind a write in flight and be applied as one group.
type gatedKV struct {
	jetstream.KeyValue
	closed  atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if g.closed.Load() {
		g.entered <- struct{}{}
		<-g.open
	}
	return g.KeyValue.Update(ctx, key, value, rev)
}

// The envelope of a call whose turn is not yet recorded in the run's state
// is applied even when the recording of that turn lands in the same group
// of writes, after the envelope's change found no such call: the change is
// made again once the turn is in, and the call is done. (Deciding by the
// state written, which has the call, dropped the envelope and left the run
// waiting for ever: found by the bench's three-turn scenario.)
func TestEnvelopeOfALaggingTurnGroupedWithItsRecording(t *testing.T) {
	env := eventstest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kv, err := env.JS.KeyValue(ctx, events.BucketRunState)
	require.NoError(t, err)
	g := &gatedKV{KeyValue: kv, entered: make(chan struct{}, 1), open: make(chan struct{})}
	s := &Service{states: newStateStore(g), history: &history{js: env.JS}}
	s.Log = slog.New(slog.DiscardHandler)
	s.history.runs, err = env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	s.history.calls, err = env.JS.Stream(ctx, events.StreamCalls)
	require.NoError(t, err)

	const run = "lagging-1"
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	_, err = s.states.create(ctx, &RunState{V: stateVersion, RunID: run, Iteration: 2, Phase: PhaseCalling,
		Trigger: triggerCall(id('a')), Pending: []PendingCall{{CallID: id('a'), Seq: 1, Name: "echo", Version: "1.0.0", Done: true}}})
	require.NoError(t, err)
	turn2 := events.Turn{RunID: run, Iteration: 2, Tenant: envelope.Tenant{OrgID: "acme"}, Agent: "a",
		Verdict: events.LoopVerdict{Allowed: true}, Response: &envelope.ModelResponse{},
		Calls: []events.TurnCall{
			{CallID: id('b'), Seq: 2, Name: "echo", Version: "1.0.0", Input: []byte(`{}`), Queue: envelope.DefaultQueue},
			{CallID: id('c'), Seq: 3, Name: "echo", Version: "1.0.0", Input: []byte(`{}`), Queue: envelope.DefaultQueue},
		}}
	o, err := events.NewTurnCompleted("/test", turn2, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, o)

	queued := func(n int) {
		require.Eventually(t, func() bool {
			s.states.mu.Lock()
			sl := s.states.runs[run]
			s.states.mu.Unlock()
			if sl == nil {
				return false
			}
			sl.mu.Lock()
			defer sl.mu.Unlock()
			return len(sl.queue) == n
		}, 10*time.Second, time.Millisecond)
	}
	// A write in flight, held at the server's door.
	g.closed.Store(true)
	held := make(chan error, 1)
	go func() {
		_, _, err := s.states.update(ctx, run, func(st *RunState) (bool, error) { st.Spend++; return true, nil })
		held <- err
	}()
	<-g.entered
	// Behind it: the envelope of call b, then the recording of turn 2.
	type result struct {
		st    *RunState
		known bool
		err   error
	}
	got := make(chan result, 1)
	go func() {
		st, known, err := s.withCall(ctx, run, id('b'), func(st *RunState, c *PendingCall) bool {
			if c.Done {
				return false
			}
			c.Done = true
			return true
		})
		got <- result{st, known, err}
	}()
	queued(1)
	recorded := make(chan error, 1)
	go func() {
		_, _, err := s.states.update(ctx, run, func(st *RunState) (bool, error) { return st.recordTurn(&turn2), nil })
		recorded <- err
	}()
	queued(2)
	g.closed.Store(false)
	close(g.open)

	require.NoError(t, <-held)
	require.NoError(t, <-recorded)
	r := <-got
	require.NoError(t, r.err)
	require.True(t, r.known, "a call of the run's current turn")
	require.True(t, r.st.call(id('b')).Done, "the envelope was applied")
	require.False(t, r.st.call(id('c')).Done)
	st, _, err := s.states.read(ctx, run)
	require.NoError(t, err)
	require.True(t, st.call(id('b')).Done, "and written")
}

// The envelope of a call while the run calls its model for a turn that is
// not stored yet is kept for another try (an error), not dropped as a call
// of no run: the turn is published before its calls are approved, so the
// envelope can only be early for it, or a stale read's.
func TestEnvelopeBeforeItsTurnIsStoredIsTriedAgain(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	kv, err := env.JS.KeyValue(ctx, events.BucketRunState)
	require.NoError(t, err)
	s := &Service{states: newStateStore(kv), history: &history{js: env.JS}}
	s.Log = slog.New(slog.DiscardHandler)
	s.history.runs, err = env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	const run = "early-1"
	o, err := events.NewRunRequested("/test", envelope.RunRequest{RunID: run, Tenant: envelope.Tenant{OrgID: "acme"},
		Agent:    envelope.Agent{Name: "a", Model: envelope.Model{Provider: "scripted", Name: "m"}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, o)
	_, err = s.states.create(ctx, &RunState{V: stateVersion, RunID: run, Iteration: 1, Phase: PhaseCalling, Trigger: triggerRequest})
	require.NoError(t, err)
	called := false
	_, known, err := s.withCall(ctx, run, strings.Repeat("d", 64), func(*RunState, *PendingCall) bool { called = true; return true })
	require.ErrorIs(t, err, errNotRecorded)
	require.ErrorContains(t, err, "turn 1 is not recorded yet")
	require.False(t, known)
	require.False(t, called)
}

package orchestrator

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// twoReplicas returns two state stores on one run-state bucket, as two
// orchestrator replicas would have.
func twoReplicas(t *testing.T) (*stateStore, *stateStore) {
	t.Helper()
	env := eventstest.Start(t)
	kv, err := env.JS.KeyValue(t.Context(), provision.BucketRunState)
	require.NoError(t, err)
	return newStateStore(kv), newStateStore(kv)
}

func setIteration(n int) func(*RunState) (bool, error) {
	return func(s *RunState) (bool, error) {
		if s.Iteration >= n {
			return false, nil
		}
		s.Iteration = n
		return true, nil
	}
}

// A replica's remembered state goes stale when another replica writes; its
// next write is refused by the revision check and re-applied to a fresh read,
// and a decision not to write, taken on the stale state, is checked on a
// fresh read before it stands.
func TestStoreStaleSnapshots(t *testing.T) {
	ctx := t.Context()
	a, b := twoReplicas(t)
	_, err := a.create(ctx, &RunState{RunID: "r1", Iteration: 1, Phase: PhaseAwaitingTools})
	require.NoError(t, err)

	// b moves the run on; a still remembers iteration 1.
	_, _, err = b.update(ctx, "r1", setIteration(3))
	require.NoError(t, err)

	// a's change is applied to what b wrote, not to its stale copy.
	var seen []int
	st, rev, err := a.update(ctx, "r1", func(s *RunState) (bool, error) {
		seen = append(seen, s.Iteration)
		s.EnabledTools = append(s.EnabledTools, "from_a@1.0.0")
		return true, nil
	})
	require.NoError(t, err)
	require.Equal(t, []int{1, 3}, seen, "applied to the stale copy, refused, then applied to a fresh read")
	require.Equal(t, 3, st.Iteration)
	require.Equal(t, []string{"from_a@1.0.0"}, st.EnabledTools)

	// b now remembers a stale state; "nothing to do" on it is checked afresh.
	seen = nil
	st, _, err = b.update(ctx, "r1", func(s *RunState) (bool, error) {
		seen = append(seen, len(s.EnabledTools))
		return false, nil
	})
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, seen, "a no-op on a remembered state is confirmed on a fresh read")
	require.Equal(t, []string{"from_a@1.0.0"}, st.EnabledTools)

	fresh, freshRev, err := b.get(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, rev, freshRev)
	require.Equal(t, st.EnabledTools, fresh.EnabledTools)
}

// Concurrent changes of one run in one replica are all applied, each once in
// the state written, without a conflict between them; a run without state is
// errNoRunState; a change's error is its own.
func TestStoreGroupsConcurrentChanges(t *testing.T) {
	ctx := t.Context()
	a, _ := twoReplicas(t)
	_, err := a.create(ctx, &RunState{RunID: "r2", Iteration: 1})
	require.NoError(t, err)

	const n = 50
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, _, errs[i] = a.update(ctx, "r2", func(s *RunState) (bool, error) {
				if i == 7 {
					return false, errors.New("change 7 fails")
				}
				s.Calls++
				return true, nil
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i == 7 {
			require.EqualError(t, err, "change 7 fails")
			continue
		}
		require.NoError(t, err)
	}
	st, _, err := a.get(ctx, "r2")
	require.NoError(t, err)
	require.Equal(t, n-1, st.Calls, "every other change applied exactly once")

	_, _, err = a.update(ctx, "nope", setIteration(2))
	require.ErrorIs(t, err, errNoRunState)

	// The ended run's snapshot is dropped once nobody holds it.
	_, _, err = a.update(ctx, "r2", func(s *RunState) (bool, error) {
		s.Phase = PhaseComplete
		return true, nil
	})
	require.NoError(t, err)
	a.mu.Lock()
	_, cached := a.runs["r2"]
	a.mu.Unlock()
	require.False(t, cached)
}

// stashedRun is a new run's state as the request's handler keeps it.
func stashedRun(id string) *RunState {
	return &RunState{V: stateVersion, RunID: id, Iteration: 1, Phase: PhaseAwaitingTools,
		Pending: []PendingCall{{CallID: "c1", Seq: 1, Name: "echo", Version: "1.0.0"}}}
}

// kvRevision is the run's revision in KV; 0 when KV holds none.
func kvRevision(t *testing.T, st *stateStore, runID string) uint64 {
	t.Helper()
	_, rev, err := st.read(t.Context(), runID)
	require.NoError(t, err)
	return rev
}

// A new run's state is kept in the replica until a change of it is written
// (which creates it in KV) or it is flushed; a run that ends on the stash is
// never written; a stash is refused where a state is known, and gives way to
// the state another replica wrote.
func TestStoreStash(t *testing.T) {
	ctx := t.Context()
	a, b := twoReplicas(t)
	markDone := func(s *RunState) (bool, error) {
		if s.Pending[0].Done {
			return false, nil
		}
		s.Pending[0].Done = true
		return true, nil
	}

	t.Run("a change creates it", func(t *testing.T) {
		require.True(t, a.stash(stashedRun("s1")))
		require.NotNil(t, a.peek("s1"), "the stash is the replica's snapshot")
		require.Zero(t, kvRevision(t, a, "s1"), "nothing written yet")
		got, rev, err := a.get(ctx, "s1")
		require.NoError(t, err)
		require.Zero(t, rev)
		require.Equal(t, "s1", got.RunID, "get answers with the stash while KV has none")

		st, rev, err := a.update(ctx, "s1", markDone)
		require.NoError(t, err)
		require.NotZero(t, rev)
		require.True(t, st.Pending[0].Done)
		require.Equal(t, rev, kvRevision(t, a, "s1"), "created in KV by the change")
		require.False(t, a.stash(stashedRun("s1")), "a state is known: no stash over it")
	})

	t.Run("a run that ends on the stash is never written", func(t *testing.T) {
		require.True(t, a.stash(stashedRun("s2")))
		st, rev, err := a.update(ctx, "s2", func(s *RunState) (bool, error) {
			s.Pending, s.Phase = nil, PhaseComplete
			return true, nil
		})
		require.NoError(t, err)
		require.Zero(t, rev)
		require.True(t, st.Done())
		require.Zero(t, kvRevision(t, a, "s2"))
		require.NoError(t, a.flush(ctx, "s2"), "an ended run has nothing to flush")
		require.Zero(t, kvRevision(t, a, "s2"))
		require.Nil(t, a.peek("s2"), "an ended run is forgotten once no handler holds it")
	})

	t.Run("flush writes it as it is", func(t *testing.T) {
		require.True(t, a.stash(stashedRun("s3")))
		require.NoError(t, a.flush(ctx, "s3"))
		rev := kvRevision(t, a, "s3")
		require.NotZero(t, rev)
		require.NoError(t, a.flush(ctx, "s3"), "once written, a flush writes nothing")
		require.Equal(t, rev, kvRevision(t, a, "s3"))
		got, _, err := b.get(ctx, "s3")
		require.NoError(t, err)
		require.Equal(t, PhaseAwaitingTools, got.Phase)
		require.False(t, got.Pending[0].Done)
	})

	t.Run("gives way to another replica's state", func(t *testing.T) {
		require.True(t, a.stash(stashedRun("s4")))
		// b rebuilt the run from the stream and recorded the call.
		other := stashedRun("s4")
		_, err := b.create(ctx, other)
		require.NoError(t, err)
		_, _, err = b.update(ctx, "s4", markDone)
		require.NoError(t, err)

		// a's change is applied to b's state, not created over it.
		var seen []bool
		st, rev, err := a.update(ctx, "s4", func(s *RunState) (bool, error) {
			seen = append(seen, s.Pending[0].Done)
			s.Spend = 1
			return true, nil
		})
		require.NoError(t, err)
		require.Equal(t, []bool{false, true}, seen, "applied to the stash, refused, then to b's state")
		require.True(t, st.Pending[0].Done)
		require.Equal(t, rev, kvRevision(t, a, "s4"))

		// A decision not to write on a stash is checked against KV too.
		require.True(t, b.stash(stashedRun("s5")))
		_, err = a.create(ctx, stashedRun("s5"))
		require.NoError(t, err)
		_, _, err = a.update(ctx, "s5", markDone)
		require.NoError(t, err)
		seen = nil
		st, _, err = b.update(ctx, "s5", func(s *RunState) (bool, error) {
			seen = append(seen, s.Pending[0].Done)
			return false, nil
		})
		require.NoError(t, err)
		require.Equal(t, []bool{false, true}, seen, "a no-op on the stash is confirmed on KV's state")
		require.True(t, st.Pending[0].Done)
	})
}

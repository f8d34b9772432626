package orchestrator

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

// twoReplicas returns two state stores on one run-state bucket, as two
// orchestrator replicas would have.
func twoReplicas(t *testing.T) (*stateStore, *stateStore) {
	t.Helper()
	env := eventstest.Start(t)
	kv, err := env.JS.KeyValue(t.Context(), events.BucketRunState)
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

package cancels

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// TestCancelledRunsAreBounded: the set of cancelled runs forgets the
// oldest past its size and every run past its age.
func TestCancelledRunsAreBounded(t *testing.T) {
	now := time.Now()
	c := New(0, 0, func() time.Time { return now })
	tenant := envelope.Tenant{OrgID: "acme"}
	for i := range DefaultMax + 10 {
		c.Cancel(events.CancelRequest{RunID: "r" + strconv.Itoa(i), Tenant: tenant})
	}
	c.mu.Lock()
	require.Len(t, c.runs, DefaultMax)
	require.Len(t, c.order, DefaultMax)
	c.mu.Unlock()
	c.Cancel(events.CancelRequest{RunID: "last", Tenant: tenant})
	_, ok := c.Said("last", tenant)
	require.True(t, ok)
	now = now.Add(DefaultAge + time.Second)
	_, ok = c.Said("last", tenant)
	require.False(t, ok, "forgotten past its age")
	c.mu.Lock()
	require.Empty(t, c.runs)
	c.mu.Unlock()
}

// A cancel cuts the run's work of the tenants it covers, with its Cause;
// work of a run known cancelled is not tracked and says why; untracked
// work is not cut.
func TestCancelCutsTheRunsWork(t *testing.T) {
	c := New(0, 0, nil)
	acme, acmeWS, globex := envelope.Tenant{OrgID: "acme"}, envelope.Tenant{OrgID: "acme", WorkspaceID: "ws1"}, envelope.Tenant{OrgID: "globex"}
	track := func(runID string, tn envelope.Tenant) (context.Context, func()) {
		ctx, cut := context.WithCancelCause(context.Background())
		untrack, said := c.Track(runID, tn, cut)
		require.Empty(t, said)
		return ctx, untrack
	}
	mine, _ := track("r1", acmeWS)
	other, _ := track("r1", globex)
	done, untrack := track("r1", acme)
	untrack()
	elsewhere, _ := track("r2", acme)

	n := c.Cancel(events.CancelRequest{RunID: "r1", Tenant: acme, By: "ops", Reason: "why"})
	require.Equal(t, 1, n)
	require.Equal(t, "cancelled by ops: why", CancelledBy(mine))
	require.NoError(t, other.Err(), "another tenant's work under the run id")
	require.NoError(t, done.Err(), "work over before the cancel")
	require.NoError(t, elsewhere.Err(), "another run's work")

	_, said := c.Track("r1", acmeWS, func(error) { t.Fatal("not tracked") })
	require.Equal(t, "cancelled by ops: why", said)
	_, said = c.Track("r1", globex, func(error) {})
	require.Empty(t, said, "the cancel does not cover globex")
	require.Empty(t, CancelledBy(context.Background()))
}

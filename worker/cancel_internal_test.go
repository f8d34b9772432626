package worker

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// TestCallCancels: a cancel stops the call it names, with a cause that says
// why; one that comes before its call (the call waited for a slot) keeps
// the call from running; the cancels of calls not seen are bounded.
func TestCallCancels(t *testing.T) {
	c := newCallCancels()
	const call = "0123456789abcdef"

	ctx, cut := context.WithCancelCause(t.Context())
	defer cut(nil)
	untrack, said := c.track("run-1", call, cut)
	require.NotNil(t, untrack)
	require.Empty(t, said)
	require.True(t, c.cancel(events.WorkerCancel{RunID: "run-1", CallID: call, Reason: "cancelled by ops"}))
	require.Error(t, ctx.Err(), "the call's context ended")
	require.Equal(t, "cancelled by ops", cancelledBy(ctx))
	untrack()

	require.False(t, c.cancel(events.WorkerCancel{RunID: "run-2", CallID: call, Reason: "cancelled early"}), "not running here")
	untrack, said = c.track("run-2", call, func(error) { t.Fatal("a call cancelled before it came does not run") })
	require.Nil(t, untrack)
	require.Equal(t, "cancelled early", said)

	for i := range maxEarlyCancels + 10 {
		c.cancel(events.WorkerCancel{RunID: "run-x" + strconv.Itoa(i), CallID: call})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.early, maxEarlyCancels)
	require.Len(t, c.order, maxEarlyCancels)
	require.Empty(t, c.running)
}

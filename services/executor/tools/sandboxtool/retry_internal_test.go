package sandboxtool

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// A hiccup of the servers is waited out; a real failure is not retried;
// the call's timeout ends the wait with its cause.
func TestRetryTransient(t *testing.T) {
	calls := 0
	err := retryTransient(t.Context(), func() error {
		calls++
		if calls < 3 {
			return fmt.Errorf("publish: %w", jetstream.ErrNoStreamResponse)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls)

	calls = 0
	bad := errors.New("invalid job")
	require.ErrorIs(t, retryTransient(t.Context(), func() error { calls++; return bad }), bad)
	require.Equal(t, 1, calls)

	timeout := errors.New("tool timed out")
	ctx, cancel := context.WithTimeoutCause(t.Context(), 100*time.Millisecond, timeout)
	defer cancel()
	err = retryTransient(ctx, func() error { return nats.ErrNoResponders })
	require.ErrorIs(t, err, timeout)
	require.ErrorIs(t, err, nats.ErrNoResponders)
}

package client

import (
	"context"
	"time"
)

// WithFollowDrain bounds c's wait for call events after a run's end by d, and
// has it take the last call event's sequence from lastCall.
func WithFollowDrain(c *Client, d time.Duration, lastCall func(context.Context, string) (uint64, error)) {
	c.drain, c.lastCall = d, lastCall
}

package publish

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Stored reports whether stream holds a message on subject. Handlers use it to
// see whether an effect of theirs (an event with a deterministic subject) is
// already durable, so that a redelivery neither redoes the work nor repeats
// the effect.
func Stored(ctx context.Context, stream jetstream.Stream, subject string) (bool, error) {
	_, err := stream.GetLastMsgForSubject(ctx, subject)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	}
	return false, fmt.Errorf("look up %s: %w", subject, err)
}

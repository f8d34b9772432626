package eventstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Drained waits, up to within, until the durable consumer of stream has
// acknowledged every message the stream holds now that the consumer
// consumes (its filters): what its handler publishes for them is stored by
// then. It waits for the last of them by its sequence, because a consumer's
// pending counts catch up with its stream asynchronously: right after a
// message is stored they may still say 0, and a wait on NumPending == 0
// alone can end before the message is even delivered. A consumer that does
// not exist yet is waited for too.
func Drained(t testing.TB, js jetstream.JetStream, stream, durable string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var (
		last  uint64
		known bool
		err   error
	)
	for ; ; time.Sleep(10 * time.Millisecond) {
		if err = ctx.Err(); err != nil {
			t.Fatalf("eventstest: consumer %s of %s has not handled what the stream held (through seq %d) within %s: last error %v",
				durable, stream, last, within, err)
		}
		var c jetstream.Consumer
		if c, err = js.Consumer(ctx, stream, durable); err != nil {
			continue
		}
		var info *jetstream.ConsumerInfo
		if info, err = c.Info(ctx); err != nil {
			continue
		}
		if !known {
			if last, err = lastConsumed(ctx, js, stream, info.Config); err != nil {
				continue
			}
			known = true
		}
		if info.AckFloor.Stream >= last && info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
	}
}

// lastConsumed is the sequence of the last message of stream that a
// consumer of cfg consumes (0: none).
func lastConsumed(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) == 0 {
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.LastSeq, nil
	}
	var last uint64
	for _, f := range filters {
		m, err := s.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}

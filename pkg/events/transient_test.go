package events_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/internal/natstest"
)

func TestIsTransient(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("bad input"), false},
		{"no responders", fmt.Errorf("publish: %w", nats.ErrNoResponders), true},
		{"request timeout", fmt.Errorf("load run r1: %w", nats.ErrTimeout), true},
		{"no response from stream", fmt.Errorf("publish: %w", jetstream.ErrNoStreamResponse), true},
		{"leader changed", jetstream.ErrConsumerLeadershipChanged, true},
		{"deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), true},
		{"cancelled is not", fmt.Errorf("get: %w", context.Canceled), false},
		{"503 from the API", fmt.Errorf("update: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream cluster not available"}), true},
		{"stream offline (its node is down)", fmt.Errorf("open TOOLWIRE_CALLS: %w", &jetstream.APIError{Code: 500, ErrorCode: 10118, Description: "stream is offline"}), true},
		{"consumer offline", &jetstream.APIError{Code: 500, ErrorCode: 10119, Description: "consumer is offline"}, true},
		{"no leader", &jetstream.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster can not handle request"}, true},
		{"offline for a reason that stays", &jetstream.APIError{Code: 500, ErrorCode: 10194, Description: "stream is offline: unsupported"}, false},
		{"400 from the API", fmt.Errorf("update: %w", &jetstream.APIError{Code: 400, Description: "bad request"}), false},
		{"not found", jetstream.ErrKeyNotFound, false},
		{"marked", events.Transient(errors.New("the outcomes bucket hiccupped")), true},
		{"marked, wrapped", fmt.Errorf("outcome: %w", events.Transient(errors.New("hiccup"))), true},
		{"permanent wins", events.Permanent(fmt.Errorf("x: %w", nats.ErrTimeout)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, events.IsTransient(tc.err))
		})
	}
	require.ErrorIs(t, events.Transient(errors.New("x")), events.ErrTransient)
	require.NoError(t, events.Transient(nil))
}

// An infrastructure failure is retried in place: the server delivers the
// message once, its budget (MaxDeliver 2) is untouched however many times
// the handler is called, and nothing is dead-lettered.
func TestRunnerRetriesTransientInPlace(t *testing.T) {
	env := natstest.Start(t)
	log := &attemptLog{failures: 5, err: fmt.Errorf("publish turn: %w", jetstream.ErrNoStreamResponse)}
	startRunner(t, env, events.RunnerConfig{Spec: callsSpec(2), Handler: log.handle})
	publish(t, env, callStarted(t, 1))

	info := requireAllAcked(t, env, 1)
	require.EqualValues(t, 1, info.Delivered.Consumer, "delivered once: the retries were in place")
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6}, log.seen(), "each retry says it is one")
	require.Zero(t, streamMsgs(t, env.JS, events.StreamDLQ))
}

// A handler failure after transient ones counts once against the budget;
// only handler failures lead to the dead letters.
func TestRunnerCountsOnlyHandlerFailures(t *testing.T) {
	env := natstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, events.RunnerConfig{Spec: callsSpec(2), Handler: func(context.Context, *events.Delivery) error {
		if calls.Add(1)%3 != 0 {
			return nats.ErrNoResponders // two transient failures, then the handler's own
		}
		return errors.New("tool registry says no")
	}})
	publish(t, env, callStarted(t, 1))

	dl := waitDLQ(t, env)
	require.Equal(t, "tool registry says no", dl.Header.Get(events.HeaderDLQError))
	require.Equal(t, "2", dl.Header.Get(events.HeaderDLQDeliveries))
	require.EqualValues(t, 6, calls.Load(), "two deliveries, each with two retries in place")
}

// Past TransientRetryFor the message is handed back (a redelivery), still
// not dead-lettered by a transient failure.
func TestRunnerHandsBackAfterTransientBound(t *testing.T) {
	env := natstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, events.RunnerConfig{Spec: callsSpec(5), TransientRetryFor: 25 * time.Millisecond,
		Handler: func(context.Context, *events.Delivery) error {
			if calls.Add(1) <= 4 {
				return events.Transient(errors.New("kv hiccup"))
			}
			return nil
		}})
	publish(t, env, callStarted(t, 1))
	info := requireAllAcked(t, env, 1)
	require.Greater(t, info.Delivered.Consumer, uint64(1), "handed back at least once")
	require.Zero(t, streamMsgs(t, env.JS, events.StreamDLQ))
}

// A batch's transient failures are retried in place too; the others of the
// batch are settled as the handler said.
func TestRunnerBatchRetriesTransientInPlace(t *testing.T) {
	env := natstest.Start(t)
	for i := 1; i <= 4; i++ {
		publish(t, env, callStarted(t, i))
	}
	flaky := callStarted(t, 3).Event.ID()
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	startRunner(t, env, events.RunnerConfig{Poll: 10 * time.Millisecond, Concurrency: 16,
		Batch: func(_ context.Context, ds []*events.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			errs := make([]error, len(ds))
			for i, d := range ds {
				seen[d.Event.ID()]++
				if d.Event.ID() == flaky && seen[flaky] <= 3 {
					errs[i] = fmt.Errorf("write: %w", nats.ErrTimeout)
				}
			}
			return errs
		}})
	info := requireAllAcked(t, env, 4)
	require.EqualValues(t, 4, info.Delivered.Consumer, "each delivered once")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 4, seen[flaky])
	for i := 1; i <= 4; i++ {
		if id := callStarted(t, i).Event.ID(); id != flaky {
			require.Equal(t, 1, seen[id])
		}
	}
}

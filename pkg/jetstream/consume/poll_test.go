package consume_test

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// A batch runner keeps every message of a batch in hand alive
// (InProgress every third of AckWait) while its handler runs, however long
// that is: a batch that takes two and a half ack waits, and the fetch held
// behind it, are each delivered once.
func TestBatchRunnerKeepsSlowBatchesAlive(t *testing.T) {
	env := eventstest.Start(t)
	const ackWait = time.Second
	var (
		calls    atomic.Int32
		mu       sync.Mutex
		attempts = map[string][]uint64{}
		first    = make(chan struct{})
	)
	startRunner(t, env, consume.RunnerConfig{Poll: 10 * time.Millisecond, Concurrency: 16,
		Spec: provision.ConsumerSpec{Stream: events.StreamCalls, Durable: durable,
			Filters: []string{"toolwire.call.>"}, AckWait: ackWait},
		Batch: func(ctx context.Context, ds []*consume.Delivery) []error {
			mu.Lock()
			for _, d := range ds {
				attempts[d.Event.ID()] = append(attempts[d.Event.ID()], d.Attempt)
			}
			mu.Unlock()
			if calls.Add(1) == 1 {
				close(first)
				select { // a slow database: only InProgress keeps the batch
				case <-time.After(5 * ackWait / 2):
				case <-ctx.Done():
					return []error{ctx.Err()}
				}
			}
			return make([]error, len(ds))
		}})
	env.Publish(t, callStarted(t, 1), callStarted(t, 2))
	<-first
	env.Publish(t, callStarted(t, 3)) // the next fetch, in hand meanwhile

	info := requireAllAckedWithin(t, env, 3, 10*time.Second)
	require.Zero(t, info.NumRedelivered)
	require.EqualValues(t, 3, info.Delivered.Consumer, "each message delivered once")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, attempts, 3)
	for id, a := range attempts {
		require.Equal(t, []uint64{1}, a, "attempts of %s", id)
	}
}

// A polling runner rides out a restart of its server (same address, same
// store): it asks for nothing while disconnected, fetches again once the
// connection is back, and every event, published before and after, is
// handled once.
func TestPollingRunnerResumesAfterAServerRestart(t *testing.T) {
	env := eventstest.Start(t)
	nc, err := nats.Connect(env.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	r, err := consume.NewRunner(js, consume.RunnerConfig{Poll: 10 * time.Millisecond, Spec: provision.ConsumerSpec{
		Stream: events.StreamCalls, Durable: durable, Filters: []string{"toolwire.call.>"}, AckWait: 2 * time.Second},
		Logger: quietLogger(), Backoff: shortBackoff,
		Batch: func(_ context.Context, ds []*consume.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			for _, d := range ds {
				seen[d.Event.ID()]++
			}
			return make([]error, len(ds))
		}})
	require.NoError(t, err)
	require.NoError(t, r.Start(testCtx(t)))
	eventstest.StopAtCleanup(t, r)
	pub := publish.NewPublisher(js)
	require.NoError(t, pub.Publish(testCtx(t), callStarted(t, 1)))
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return seen[callStarted(t, 1).Event.ID()] == 1 },
		5*time.Second, 10*time.Millisecond)

	addr, dir := env.Server.Addr().String(), filepath.Dir(env.Server.StoreDir())
	embedded.Stop(env.Server)
	require.Eventually(t, func() bool { return !nc.IsConnected() }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // polls that would have gone out while it is down
	s, err := embedded.Start(embedded.Options{Listen: addr, StoreDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { embedded.Stop(s) })
	require.Eventually(t, nc.IsConnected, 10*time.Second, 5*time.Millisecond)
	reconnected := time.Now()

	require.NoError(t, pub.Publish(testCtx(t), callStarted(t, 2)))
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return seen[callStarted(t, 2).Event.ID()] == 1 },
		10*time.Second, 5*time.Millisecond)
	t.Logf("handled %s after the reconnect", time.Since(reconnected).Round(time.Millisecond))
	c, err := js.Consumer(testCtx(t), events.StreamCalls, durable)
	require.NoError(t, err)
	info, err := c.Info(testCtx(t))
	require.NoError(t, err)
	require.Zero(t, info.NumRedelivered)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{callStarted(t, 1).Event.ID(): 1, callStarted(t, 2).Event.ID(): 1}, seen)
}

package events_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/clustertest"
)

// TestProvisionOnAForming3NodeCluster: provisioning on the first node of a
// cluster still forming is retried until the cluster has its quorum, then
// creates every stream with three replicas; starting a service with fewer
// replicas than that is refused with the message, and changes nothing.
func TestProvisionOnAForming3NodeCluster(t *testing.T) {
	c := clustertest.New(t, "provision-test")
	c.StartNode(0)
	nc, err := nats.Connect(c.URL(0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	ctx := testCtx(t)
	var retries atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- events.ProvisionRetrying(ctx, js, events.StoreConfig{Replicas: 3}, func(int, error) { retries.Add(1) })
	}()
	require.Eventually(t, func() bool { return retries.Load() >= 1 }, 30*time.Second, 10*time.Millisecond,
		"the lone node cannot place three replicas yet")
	c.StartNode(1)
	c.StartNode(2)
	require.NoError(t, <-done)

	before := snapshot(ctx, t, js)
	for name, st := range before {
		require.Equal(t, 3, st.Config.Replicas, name)
	}
	err = events.Provision(ctx, js, events.StoreConfig{Replicas: 1})
	require.ErrorIs(t, err, events.ErrWouldLower)
	var lowered *events.LoweringError
	require.ErrorAs(t, err, &lowered)
	require.Equal(t, []string{"replicas 3 -> 1"}, lowered.Stores[events.StreamRuns])
	require.Equal(t, []string{"replicas 3 -> 1"}, lowered.Stores["KV_"+events.BucketRunState])
	require.Equal(t, []string{"replicas 3 -> 1"}, lowered.Stores["OBJ_"+events.ObjectBlobs])
	require.Len(t, lowered.Stores, len(before), "every store named")
	require.Equal(t, before, snapshot(ctx, t, js), "nothing changed")
	require.NoError(t, events.Provision(ctx, js, events.StoreConfig{Replicas: 3}), "the same settings again are fine")
}

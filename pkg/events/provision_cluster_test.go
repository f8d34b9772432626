package events_test

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// freePorts returns n ports free on 127.0.0.1 a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		require.NoError(t, ln.Close())
	}
	return ports
}

// clusterNode starts node i of a three-node JetStream cluster whose route
// ports are routes.
func clusterNode(t *testing.T, i int, routes []int) *server.Server {
	t.Helper()
	var urls []*url.URL
	for j, p := range routes {
		if j != i {
			u, err := url.Parse("nats://127.0.0.1:" + strconv.Itoa(p))
			require.NoError(t, err)
			urls = append(urls, u)
		}
	}
	s, err := server.NewServer(&server.Options{
		ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoSigs: true, NoLog: true,
		Cluster: server.ClusterOpts{Name: "provision-test", Host: "127.0.0.1", Port: routes[i]},
		Routes:  urls,
	})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// TestProvisionOnAForming3NodeCluster: provisioning on the first node of a
// cluster still forming is retried until the cluster has its quorum, then
// creates every stream with three replicas; starting a service with fewer
// replicas than that is refused with the message, and changes nothing.
func TestProvisionOnAForming3NodeCluster(t *testing.T) {
	routes := freePorts(t, 3)
	first := clusterNode(t, 0, routes)
	nc, err := nats.Connect(first.ClientURL())
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
	clusterNode(t, 1, routes)
	clusterNode(t, 2, routes)
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

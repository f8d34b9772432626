package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
)

// TestConsumerLagIsScraped: the consumer metrics report each consumer's
// backlog and what its handlers hold, as the server counts them when
// scraped; two runners of one durable (two replicas) are one series; a
// stopped group's consumers are no longer reported.
func TestConsumerLagIsScraped(t *testing.T) {
	env := eventstest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "LAG", Subjects: []string{"lag.>"}})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	m := service.NewMetrics(reg, "executor")
	c := service.NewConsumerMetrics(m)
	require.NoError(t, m.Err())

	// Handlers that hold what they get until released: two at once.
	release := make(chan struct{})
	held := make(chan struct{}, 16)
	handler := func(ctx context.Context, _ *consume.Delivery) error {
		held <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	g := &consume.Runners{Observer: c}
	spec := provision.ConsumerSpec{Stream: "LAG", Durable: "lagger", Filters: []string{"lag.>"}, MaxAckPending: 2}
	for range 2 { // two replicas of one durable
		_, err := g.Start(ctx, env.JS, consume.RunnerConfig{Spec: spec, Handler: handler, Concurrency: 1,
			Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
	}
	pub := publish.NewPublisher(env.JS)
	for i := range 10 {
		o, err := events.Build("dev.toolwire.test.v1", fmt.Sprintf("lag-%d", i), fmt.Sprintf("lag.%d", i),
			events.Attrs{Source: "/test", Time: time.Now()}, map[string]int{"n": i})
		require.NoError(t, err)
		require.NoError(t, pub.Publish(ctx, o))
	}
	for range 2 {
		select {
		case <-held:
		case <-ctx.Done():
			t.Fatal("the handlers never got their events")
		}
	}
	want := `
# HELP toolwire_executor_consumer_ack_pending Events delivered to a consumer and not yet acknowledged (in its handlers, or held by a replica that died until their ack wait), by stream and consumer.
# TYPE toolwire_executor_consumer_ack_pending gauge
toolwire_executor_consumer_ack_pending{consumer="lagger",stream="LAG"} 2
# HELP toolwire_executor_consumer_pending Events of a consumer's subjects not yet delivered to it (its backlog; what an autoscaler watches), by stream and consumer, as the server counts them when scraped.
# TYPE toolwire_executor_consumer_pending gauge
toolwire_executor_consumer_pending{consumer="lagger",stream="LAG"} 8
`
	// The server counts the deliveries as they go out; ask until they settle.
	for {
		err := testutil.GatherAndCompare(reg, strings.NewReader(want), "toolwire_executor_consumer_pending",
			"toolwire_executor_consumer_ack_pending")
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("lag never reported as the server counts it: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}

	close(release)
	require.NoError(t, g.Stop(ctx))
	// Once the cached answer is past, the stopped consumers are gone.
	for {
		n, err := testutil.GatherAndCount(reg, "toolwire_executor_consumer_pending")
		require.NoError(t, err)
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("a stopped group's consumers are still reported")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

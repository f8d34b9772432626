package eventstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartProvisions(t *testing.T) {
	env := eventstest.Start(t)
	require.True(t, env.Conn.IsConnected())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{events.StreamRuns, events.StreamCalls, events.StreamSandbox, events.StreamDLQ} {
		_, err := env.JS.Stream(ctx, name)
		require.NoError(t, err, name)
	}
	// A second connection and JetStream handle reach the same server.
	js := env.JetStream(t)
	_, err := js.KeyValue(ctx, provision.BucketTools)
	require.NoError(t, err)

	// Two environments are independent.
	other := eventstest.Start(t)
	require.NotEqual(t, env.URL, other.URL)
}

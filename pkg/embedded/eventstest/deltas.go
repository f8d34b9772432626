package eventstest

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// PublishDeltas publishes ds as the orchestrator does (services/
// orchestrator/stream.go): each encoded, on its iteration's core NATS
// subject; then flushes, so that the server has them.
func PublishDeltas(t testing.TB, nc *nats.Conn, ds ...events.Delta) {
	t.Helper()
	for _, d := range ds {
		subj, err := events.DeltaSubject(d.RunID, d.Iteration)
		require.NoError(t, err)
		b, err := events.EncodeDelta(d)
		require.NoError(t, err)
		require.NoError(t, nc.Publish(subj, b))
	}
	require.NoError(t, nc.Flush())
}

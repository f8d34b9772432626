package bench

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestObserverCountsAnEnvelopeBeforeItsTurn: a call whose envelope reaches
// the observer before its turn (a loaded server can send them so) is counted
// as misordered, not timed, and not waited for; a call in order is timed.
func TestObserverCountsAnEnvelopeBeforeItsTurn(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(srv.Shutdown)
	require.True(t, srv.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	obs, err := newObserver(nc)
	require.NoError(t, err)
	t.Cleanup(obs.close)

	require.NoError(t, obs.recording(true, 0))
	for _, subj := range []string{
		"toolwire.run.r1.turn.1.completed", "toolwire.call.r1.c1.completed", // in order
		"toolwire.call.r2.c1.completed", "toolwire.run.r2.turn.1.completed", // envelope first
	} {
		require.NoError(t, nc.Publish(subj, nil))
	}
	start := time.Now()
	require.NoError(t, obs.recording(false, 2))
	require.Less(t, time.Since(start), callsLag, "both calls are accounted for: no wait for a call that will never be timed")
	lat, misordered := obs.calls()
	require.Len(t, lat, 1)
	require.Positive(t, lat[0])
	require.Equal(t, 1, misordered)

	require.NoError(t, obs.recording(true, 0))
	lat, misordered = obs.calls()
	require.Empty(t, lat, "a new recording starts afresh")
	require.Zero(t, misordered)
}

package cancels_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
)

// Listen hands every valid cancel request it hears to the runs and to
// heard, and every other message on the subject to invalid.
func TestListen(t *testing.T) {
	env := eventstest.Start(t)
	runs := cancels.New(0, 0, nil)
	heard, invalid := make(chan string, 4), make(chan string, 4)
	stop, err := cancels.Listen(env.JS.Conn(), runs,
		func(req events.CancelRequest, _ int) { heard <- req.RunID },
		func(subject string, _ error) { invalid <- subject })
	require.NoError(t, err)
	defer stop()

	tenant := envelope.Tenant{OrgID: "acme"}
	out, err := events.NewCancelRequested("/test", events.CancelRequest{RunID: "r1", Tenant: tenant, Reason: "why"}, events.RunTrace{})
	require.NoError(t, err)
	m, err := out.Msg()
	require.NoError(t, err)
	require.NoError(t, env.JS.Conn().PublishMsg(m))
	// The same request on another run's subject, and what is no event.
	m.Subject = "toolwire.run.r2.cancel_requested"
	require.NoError(t, env.JS.Conn().PublishMsg(m))
	require.NoError(t, env.JS.Conn().PublishMsg(&nats.Msg{Subject: "toolwire.run.r3.cancel_requested", Data: []byte("{")}))

	wait := func(ch chan string) string {
		select {
		case s := <-ch:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("nothing heard")
			return ""
		}
	}
	require.Equal(t, "r1", wait(heard))
	require.Equal(t, "toolwire.run.r2.cancel_requested", wait(invalid))
	require.Equal(t, "toolwire.run.r3.cancel_requested", wait(invalid))
	said, ok := runs.Said("r1", tenant)
	require.True(t, ok)
	require.Equal(t, "cancelled: why", said)
	_, ok = runs.Said("r2", tenant)
	require.False(t, ok)
}

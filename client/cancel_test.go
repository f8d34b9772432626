package client_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
)

// Cancel publishes the run's cancel request for the run's tenant, answers
// an unknown run with ErrNoRun and a run that has ended with its end; Wait
// returns a cancelled run with ErrRunCancelled.
func TestCancel(t *testing.T) {
	env := eventstest.Start(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()

	_, err := c.Cancel(ctx, "client-nobody", "", "")
	require.ErrorIs(t, err, client.ErrNoRun)
	_, err = c.Cancel(ctx, "bad.id", "", "")
	require.ErrorIs(t, err, events.ErrUnsafeID)

	req := request("client-cancel")
	require.NoError(t, c.Submit(ctx, req))
	got, err := c.Cancel(ctx, req.RunID, "runaway", "alice")
	require.NoError(t, err)
	require.Equal(t, client.Cancelled{RunID: req.RunID, Status: client.StatusCancelling, Cancelled: true}, got)
	runs, err := env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	m, err := runs.GetLastMsgForSubject(ctx, "toolwire.run.client-cancel.cancel_requested")
	require.NoError(t, err)
	ev, err := events.Decode(natsOf(m.Subject, m.Header, m.Data))
	require.NoError(t, err)
	var cr events.CancelRequest
	require.NoError(t, events.DecodeData(ev, &cr))
	require.Equal(t, req.Tenant, cr.Tenant, "the run's tenant, read from its request")
	require.Equal(t, "cancelled by alice: runaway", cr.Said())

	// The run ends cancelled (as the orchestrator would end it).
	end, err := events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: req.RunID, Tenant: req.Tenant,
		Status: events.StatusCancelled, Reason: cr.Said(), Outputs: outputsOf(t, "")}, "", events.RunTrace{})
	require.NoError(t, err)
	_, err = env.JS.PublishMsg(ctx, mustMsg(t, end))
	require.NoError(t, err)
	st, err := c.Wait(ctx, req.RunID)
	require.ErrorIs(t, err, client.ErrRunCancelled)
	require.Equal(t, events.StatusCancelled, st.Status)

	again, err := c.Cancel(ctx, req.RunID, "", "")
	require.NoError(t, err)
	require.Equal(t, client.Cancelled{RunID: req.RunID, Status: events.StatusCancelled}, again, "a run that ended answers its end")
}

func natsOf(subject string, h nats.Header, data []byte) *nats.Msg {
	return &nats.Msg{Subject: subject, Header: h, Data: data}
}

func mustMsg(t *testing.T, o events.Outgoing) *nats.Msg {
	t.Helper()
	m, err := o.Msg()
	require.NoError(t, err)
	return m
}

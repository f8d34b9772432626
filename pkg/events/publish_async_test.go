package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/internal/natstest"
)

func TestPublishAsync(t *testing.T) {
	env := natstest.Start(t)
	pub := events.NewPublisher(env.JS)
	ctx := testCtx(t)

	out := constructedOut(t, "call completed")
	pd, err := pub.PublishAsync(ctx, out)
	require.NoError(t, err)
	require.NoError(t, pd.Wait(ctx), "stored once its PubAck arrived")
	require.NoError(t, pd.Retry(ctx), "a retried publish is not an error")
	require.EqualValues(t, 1, streamMsgs(t, env.JS, events.StreamCalls), "Nats-Msg-Id drops the retried copy")

	m := lastMsg(t, env.JS, events.StreamCalls, out.Subject)
	got, err := events.Decode(m)
	require.NoError(t, err)
	requireSameEvent(t, &out.Event, got)
}

func TestPublishAsyncRejectsWhatCannotBeStored(t *testing.T) {
	env := natstest.Start(t)
	pub := events.NewPublisher(env.JS)
	ctx := testCtx(t)

	out := constructedOut(t, "call completed")
	out.Subject = "no.stream.takes.this"
	pd, err := pub.PublishAsync(ctx, out)
	if err == nil {
		err = pd.Wait(ctx)
	}
	require.Error(t, err, "a subject no stream stores has no PubAck")
	require.Contains(t, err.Error(), out.Event.ID())
}

package publish_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

func TestStored(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	stream, err := env.JS.Stream(ctx, events.StreamCalls)
	require.NoError(t, err)
	out := callStarted(t, 1)

	ok, err := publish.Stored(ctx, stream, out.Subject)
	require.NoError(t, err)
	require.False(t, ok, "nothing published yet")

	require.NoError(t, publish.NewPublisher(env.JS).Publish(ctx, out))
	ok, err = publish.Stored(ctx, stream, out.Subject)
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, env.JS.DeleteStream(ctx, events.StreamCalls))
	_, err = publish.Stored(ctx, stream, out.Subject)
	require.ErrorContains(t, err, "look up "+out.Subject)
}

package client_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
)

// followLabel names what Follow delivered: an event's type, or
// delta <iteration>.<seq>.
func followLabel(e client.Event) string {
	if e.Delta != nil {
		return fmt.Sprintf("delta %d.%d", e.Delta.Iteration, e.Delta.Seq)
	}
	return e.Event.Type()
}

// TestFollowWithDeltas: WithDeltas has Follow deliver the run's deltas
// among its events: the first model call's after the events before it, the
// second's after the first turn's call has completed (though it streamed
// before the call's events were read), none of a call after its turn, no
// invalid one; without WithDeltas, none.
func TestFollowWithDeltas(t *testing.T) {
	env := eventstest.Start(t)
	nc := env.Connect(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()
	req := request("client-deltas")
	require.NoError(t, c.Submit(ctx, req))
	evs := runEvents(t, req, events.RunStatus{Outputs: outputsOf(t, "said hi")})
	turn1, callEvents, end := evs[0], evs[1:3], evs[3]

	got := make(chan string, 64)
	plain := make(chan string, 64)
	done := make(chan error, 2)
	go func() {
		_, err := c.Follow(ctx, req.RunID, func(e client.Event) bool { got <- followLabel(e); return true }, client.WithDeltas())
		done <- err
	}()
	go func() {
		_, err := c.Follow(ctx, req.RunID, func(e client.Event) bool { plain <- followLabel(e); return true })
		done <- err
	}()
	next := func(ch <-chan string) string {
		t.Helper()
		select {
		case s := <-ch:
			return s
		case <-time.After(20 * time.Second):
			t.Fatal("Follow delivered nothing")
			return ""
		}
	}
	// Once the request is delivered, Follow's subscriptions are in place.
	require.Equal(t, events.TypeRunRequested, next(got))
	require.Equal(t, events.TypeRunRequested, next(plain))

	d := func(iteration, seq int) events.Delta {
		return events.Delta{RunID: req.RunID, Iteration: iteration, Attempt: 1, Seq: seq, Text: "x"}
	}
	eventstest.PublishDeltas(t, nc, d(1, 1))
	require.NoError(t, nc.Publish("toolwire.delta.client-deltas.1", []byte(`{"run_id":"client-deltas","iteration":1}`)))
	eventstest.PublishDeltas(t, nc, d(1, 2))
	require.Equal(t, "delta 1.1", next(got))
	require.Equal(t, "delta 1.2", next(got), "the invalid delta is dropped")

	env.Publish(t, turn1)
	require.Equal(t, events.TypeTurnCompleted, next(got))
	eventstest.PublishDeltas(t, nc, d(1, 3), d(2, 1)) // a straggler of the first call; the second streams
	env.Publish(t, callEvents...)
	require.Equal(t, []string{events.TypeCallApproved, events.TypeCallCompleted, "delta 2.1"},
		[]string{next(got), next(got), next(got)}, "the second call's delta after the call it follows; none of the first after its turn")

	env.Publish(t, end)
	require.Equal(t, events.TypeRunCompleted, next(got))
	for range 2 {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("Follow did not return at the run's end")
		}
	}
	close(got)
	require.Empty(t, drain(got), "nothing after the end")
	close(plain)
	require.Equal(t, []string{events.TypeTurnCompleted, events.TypeCallApproved, events.TypeCallCompleted, events.TypeRunCompleted},
		drain(plain), "without WithDeltas, no delta")
}

func drain(ch <-chan string) []string {
	var out []string
	for s := range ch {
		out = append(out, s)
	}
	return out
}

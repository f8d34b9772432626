package executor

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// acked waits until the executor's consumer has acknowledged every call
// published so far: its handler has settled each, run or not.
func acked(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	eventstest.Drained(t, js, events.StreamCalls, Durable, 20*time.Second)
}

// TestCallsOfRunsThatAreOver: a call is never started once its run is over —
// past the run's deadline (a writes call above all), or delivered late for a
// run whose end is stored — and no event of it is stored; a call running at
// its run's deadline is cut there, TIMEOUT, saying so.
func TestCallsOfRunsThatAreOver(t *testing.T) {
	var ran atomic.Int32
	writes := newTestTool("counted_write", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		ran.Add(1)
		return json.RawMessage(`{"ok":true}`), nil
	})
	writes.def.Metadata.SideEffects = envelope.SideEffectsWrites
	slow := newTestTool("slow_read", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	slow.def.TimeoutMS = 30_000
	env := eventstest.Start(t)
	js := env.JetStream(t)
	pub := publish.NewPublisher(js)
	schemas := newEventSchemas(t)

	// Stored while no executor runs (a queue waiting through an outage):
	// a call of a run that ended meanwhile, and one whose deadline passed.
	ended := callRequest(t, "run-ended", 1, "counted_write", "1.0.0", `{}`)
	future := time.Now().Add(time.Hour).UTC()
	ended.RunDeadline = &future
	publishApproved(t, pub, ended)
	out, err := events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: "run-ended", Status: events.StatusFailed,
		Code: envelope.CodeProviderError, Reason: "model call failed"}, "", events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, pub.Publish(t.Context(), out))
	past := time.Now().Add(-time.Second).UTC()
	late := callRequest(t, "run-late", 1, "counted_write", "1.0.0", `{}`)
	late.RunDeadline = &past
	publishApproved(t, pub, late)
	time.Sleep(staleCall + 200*time.Millisecond) // both are stale by the time they are delivered

	s := startExecutor(t, env, Config{ID: "executor-over"}, WithTools(writes, slow))
	acked(t, js)
	require.Zero(t, ran.Load(), "no call of a run that is over starts")
	for _, req := range []events.CallRequest{ended, late} {
		for _, verb := range []events.Verb{events.VerbStarted, events.VerbCompleted} {
			subj, err := events.CallSubject(req.RunID, req.CallID, verb)
			require.NoError(t, err)
			require.Zero(t, count(t, js, subj), "%s: nothing of the call is stored", subj)
		}
	}
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.runOver.WithLabelValues("counted_write@1.0.0", "ended")))
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.runOver.WithLabelValues("counted_write@1.0.0", "deadline")))

	// A live run's call goes on, and is cut at the run's deadline.
	w := watchRun(t, js, "run-cut")
	soon := time.Now().Add(300 * time.Millisecond).UTC()
	cut := callRequest(t, "run-cut", 1, "slow_read", "1.0.0", `{}`)
	cut.RunDeadline = &soon
	publishApproved(t, pub, cut)
	got := w.envelopeOf(t, schemas, cut)
	require.NotNil(t, got.Error)
	require.Equal(t, envelope.CodeTimeout, got.Error.Code)
	require.Contains(t, got.Error.Message, "stopped at its run's deadline")
	require.Contains(t, got.Error.Message, "its own limit is 30s")
	require.Less(t, got.Latency(), 5*time.Second, "cut at the run's deadline, not the tool's 30 s")
}

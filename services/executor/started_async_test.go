package executor

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/eventstest"
)

// call.started is published without waiting for its PubAck before the tool
// runs; a delivery that failed after completed was stored but before started
// was is redelivered, and the redelivery publishes the missing started
// (rebuilt from the envelope) without running the tool again.
func TestRedeliveryPublishesAMissingStarted(t *testing.T) {
	env := eventstest.Start(t)
	s := startExecutor(t, env, Config{ID: "executor-started"})
	pub := events.NewPublisher(env.JS)
	req := callRequest(t, "run-started-missing", 1, "echo", "1.0.0", `{"x":1}`)
	tStart := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	completed, err := events.NewCallCompleted(testSource, req.RunID, envelope.ToolEnvelope{
		CallID: req.CallID, Name: req.Name, Version: req.Version, Input: req.Input,
		Output: json.RawMessage(`{"ok":true}`), TStart: tStart, TEnd: tStart.Add(time.Millisecond),
	}, req.Tenant, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, pub.Publish(t.Context(), completed))
	startedSubj, err := events.CallSubject(req.RunID, req.CallID, "started")
	require.NoError(t, err)
	require.Zero(t, count(t, env.JS, startedSubj))

	in := approved(t, req, events.RunTrace{})
	for range 2 { // a second redelivery finds it stored and publishes nothing
		require.NoError(t, s.handle(t.Context(), &events.Delivery{Event: &in.Event, Subject: in.Subject, Attempt: 2}))
	}
	require.EqualValues(t, 1, count(t, env.JS, startedSubj), "the missing call.started is published once")
	require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)), "the tool did not run again")

	w := watchRun(t, env.JS, req.RunID)
	e := w.wait(t, startedSubj)
	var got events.CallStarted
	require.NoError(t, events.DecodeData(e, &got))
	require.Equal(t, req.CallID, got.CallID)
	require.True(t, got.TStart.Equal(tStart), "started carries the envelope's start time")
}

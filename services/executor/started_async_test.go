package executor

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
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

// A call quicker than StartedAfter publishes call.started together with
// call.completed, started first; a slower one publishes call.started while
// the tool still runs. With StartedAfter negative, started goes out before
// the tool runs, however quick it is.
func TestStartedGoesOutWithCompletedOrWhileTheToolRuns(t *testing.T) {
	env := eventstest.Start(t)
	seqOf := func(t *testing.T, subj string) uint64 {
		st, err := env.JS.Stream(t.Context(), events.StreamCalls)
		require.NoError(t, err)
		m, err := st.GetLastMsgForSubject(t.Context(), subj)
		require.NoError(t, err)
		return m.Sequence
	}
	run := func(t *testing.T, s *Service, req events.CallRequest) (startedSubj string, done chan error) {
		subj, err := events.CallSubject(req.RunID, req.CallID, "started")
		require.NoError(t, err)
		in := approved(t, req, events.RunTrace{})
		done = make(chan error, 1)
		go func() {
			done <- s.handle(t.Context(), &events.Delivery{Event: &in.Event, Subject: in.Subject, Attempt: 1})
		}()
		return subj, done
	}

	t.Run("quick call", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-quick", StartedAfter: 10 * time.Second})
		req := callRequest(t, "run-quick", 1, "echo", "1.0.0", `{"text":"hi"}`)
		subj, done := run(t, s, req)
		require.NoError(t, <-done)
		require.EqualValues(t, 1, count(t, env.JS, subj))
		require.Less(t, seqOf(t, subj), seqOf(t, completedSubject(t, req)), "started is stored before completed")
	})
	t.Run("slow call", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-slow", StartedAfter: 10 * time.Millisecond})
		req := callRequest(t, "run-slow", 1, "sleep", "1.0.0", `{"ms":2000}`)
		subj, done := run(t, s, req)
		require.Eventually(t, func() bool { return count(t, env.JS, subj) == 1 }, waitLimit, 5*time.Millisecond,
			"call.started is published while the tool runs")
		require.Zero(t, count(t, env.JS, completedSubject(t, req)), "the tool is still running")
		require.NoError(t, <-done)
		require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)))
		require.EqualValues(t, 1, count(t, env.JS, subj), "started is published once")
	})
	t.Run("at once", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-at-once", StartedAfter: -1})
		req := callRequest(t, "run-at-once", 1, "sleep", "1.0.0", `{"ms":2000}`)
		subj, done := run(t, s, req)
		require.Eventually(t, func() bool { return count(t, env.JS, subj) == 1 }, waitLimit, 5*time.Millisecond)
		require.Zero(t, count(t, env.JS, completedSubject(t, req)))
		require.NoError(t, <-done)
	})
}

package executor

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

// A redelivery of a call whose completed event is stored (its ack was lost)
// is acknowledged without running the tool again and publishes nothing: no
// second completed event, and no call.started either, since the envelope
// carries the call's t_start. (Before contract v2 the redelivery published a
// call.started missing from the stream; a call now owes none once it has
// completed.)
func TestRedeliveryOfACompletedCallPublishesNothing(t *testing.T) {
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

	in := approved(t, req, events.RunTrace{})
	for range 2 {
		require.NoError(t, s.handle(t.Context(), &events.Delivery{Event: &in.Event, Subject: in.Subject, Attempt: 2}))
	}
	require.Zero(t, count(t, env.JS, startedSubj), "no call.started for a completed call")
	require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)), "the tool did not run again")
	require.Zero(t, testutil.ToFloat64(s.metrics.calls.WithLabelValues("echo@1.0.0", outcomeOK)), "nothing ran")
}

// A call quicker than StartedAfter publishes no call.started at all (its
// envelope carries t_start); a slower one publishes call.started while the
// tool still runs, once. With StartedAfter negative, started goes out before
// the tool runs, however quick it is, and is stored before completed.
func TestStartedOnlyForSlowCalls(t *testing.T) {
	env := eventstest.Start(t)
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
		require.EqualValues(t, 1, count(t, env.JS, completedSubject(t, req)))
		require.Zero(t, count(t, env.JS, subj), "a quick call publishes no call.started")
	})
	t.Run("quick calls store two events each", func(t *testing.T) {
		startExecutor(t, env, Config{ID: "executor-quick-many", StartedAfter: maxStartedAfter})
		const runID = "run-quick-many"
		w := watchRun(t, env.JS, runID)
		schemas := newEventSchemas(t)
		var reqs []events.CallRequest
		for i := range 8 {
			reqs = append(reqs, callRequest(t, runID, i+1, "calculator", "1.0.0", `{"expression":"1+1"}`))
		}
		publishAllApproved(t, env.JS, reqs)
		for _, req := range reqs {
			got := w.envelopeOf(t, schemas, req)
			require.Nil(t, got.Error)
			require.False(t, got.TStart.IsZero(), "the envelope carries t_start")
		}
		filter, err := events.CallEvents(runID)
		require.NoError(t, err)
		st, err := env.JS.Stream(t.Context(), events.StreamCalls)
		require.NoError(t, err)
		info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(filter))
		require.NoError(t, err)
		stored := map[string]uint64{}
		for subj, n := range info.State.Subjects {
			p, err := events.ParseSubject(subj)
			require.NoError(t, err)
			stored[string(p.Verb)] += n
		}
		require.Equal(t, map[string]uint64{"approved": 8, "completed": 8}, stored, "two stored events per quick call: approved and completed")
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
		require.Less(t, streamSeq(t, env.JS, subj), streamSeq(t, env.JS, completedSubject(t, req)))
	})
	t.Run("at once", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-at-once", StartedAfter: -1})
		req := callRequest(t, "run-at-once", 1, "sleep", "1.0.0", `{"ms":2000}`)
		subj, done := run(t, s, req)
		require.Eventually(t, func() bool { return count(t, env.JS, subj) == 1 }, waitLimit, 5*time.Millisecond)
		require.Zero(t, count(t, env.JS, completedSubject(t, req)))
		require.NoError(t, <-done)
	})
	t.Run("at once, quick call", func(t *testing.T) {
		s := startExecutor(t, env, Config{ID: "executor-at-once-quick", StartedAfter: -1})
		req := callRequest(t, "run-at-once-quick", 1, "echo", "1.0.0", `{"text":"hi"}`)
		subj, done := run(t, s, req)
		require.NoError(t, <-done)
		require.EqualValues(t, 1, count(t, env.JS, subj))
		require.Less(t, streamSeq(t, env.JS, subj), streamSeq(t, env.JS, completedSubject(t, req)), "started is stored before completed")
	})
}

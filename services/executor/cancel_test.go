package executor

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// testCancel is the cancel request of run runID the tests publish, for the
// tenant of callRequest's calls.
func testCancel(t testing.TB, runID string) events.Outgoing {
	t.Helper()
	out, err := events.NewCancelRequested(testSource, events.CancelRequest{
		RunID: runID, Reason: "changed my mind", By: "tester",
		Tenant: envelope.Tenant{OrgID: "acme", WorkspaceID: "ws"},
	}, events.RunTrace{})
	require.NoError(t, err)
	return out
}

// cancelSaid is what the envelopes of testCancel's calls say.
const cancelSaid = "the run was cancelled by tester: changed my mind"

// blockingTool is a tool that blocks until its context ends: it says when
// it runs (entered) and when its context ended (stopped).
type blockingTool struct {
	testTool
	runs    *atomic.Int32
	entered chan struct{}
	stopped chan time.Time
}

func newBlockingTool(name string, side envelope.SideEffects) blockingTool {
	b := blockingTool{runs: new(atomic.Int32), entered: make(chan struct{}, 4), stopped: make(chan time.Time, 4)}
	b.testTool = newTestTool(name, func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		b.runs.Add(1)
		b.entered <- struct{}{}
		<-ctx.Done()
		b.stopped <- time.Now()
		return nil, ctx.Err()
	})
	b.def.TimeoutMS = 10_000
	b.def.Metadata.SideEffects = side
	return b
}

// receive waits, bounded, for a value of ch.
func receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("%s: nothing within %s", what, waitLimit)
	}
	var zero T
	return zero
}

// TestCancelStopsRunningCalls: a cancel request of a run cuts the call of
// it that runs (a 10 s tool that blocks until its context ends): the tool's
// context ends at once and the call is answered TIMEOUT, details.cancelled,
// saying why, long before the tool's timeout. A writes call cut short keeps
// that envelope as its recorded outcome: a redelivery of the call is
// answered from the record, and the tool never runs again.
func TestCancelStopsRunningCalls(t *testing.T) {
	for _, c := range []struct {
		name string
		side envelope.SideEffects
	}{
		{"reads", envelope.SideEffectsReads},
		{"writes", envelope.SideEffectsWrites},
	} {
		t.Run(c.name, func(t *testing.T) {
			tool := newBlockingTool("block_"+c.name, c.side)
			env := eventstest.Start(t)
			js := env.JetStream(t)
			pub := publish.NewPublisher(js)
			s := startExecutor(t, env, Config{ID: "executor-cancel"}, WithTools(tool))
			schemas := newEventSchemas(t)
			runID := "run-cancel-" + c.name
			w := watchRun(t, js, runID)
			req := callRequest(t, runID, 1, tool.def.Name, "1.0.0", `{}`)
			publishApproved(t, pub, req)
			receive(t, tool.entered, "the tool runs")

			sent := time.Now()
			require.NoError(t, pub.Publish(t.Context(), testCancel(t, runID)))
			got := w.envelopeOf(t, schemas, req)
			took := time.Since(sent)
			ctxEnded := receive(t, tool.stopped, "the tool's context ends").Sub(sent)
			t.Logf("%s: cancel to the tool's context ended %s, to the envelope stored %s", c.name, ctxEnded, took)
			require.NotNil(t, got.Error)
			require.Equal(t, envelope.CodeTimeout, got.Error.Code)
			require.True(t, events.IsCancelledCall(got.Error), "details say cancelled: %+v", got.Error.Details)
			require.Equal(t, "stopped: "+cancelSaid, got.Error.Message)
			require.Less(t, took, 5*time.Second, "cut at the cancel, not at the tool's 10 s timeout")
			require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.cancelled.WithLabelValues(tool.def.Ref().String(), cancelCut)))
			require.Zero(t, testutil.ToFloat64(s.metrics.calls.WithLabelValues(tool.def.Ref().String(), outcomeOK)))

			if c.side != envelope.SideEffectsWrites {
				return
			}
			// The record is the cut-short envelope.
			kv, err := env.JS.KeyValue(t.Context(), provision.BucketOutcomes)
			require.NoError(t, err)
			e, err := kv.Get(t.Context(), outcomeKey(req.RunID, req.CallID))
			require.NoError(t, err)
			var rec outcomeRecord
			require.NoError(t, json.Unmarshal(e.Value(), &rec))
			require.Equal(t, outcomeDone, rec.State)
			require.NotNil(t, rec.Envelope)
			require.True(t, events.IsCancelledCall(rec.Envelope.Error))
			require.Equal(t, envelope.CodeTimeout, rec.Envelope.Error.Code)

			// Delivered again (a copy past the duplicate window): answered
			// from the record, the tool not run again, one completed event.
			publishCopies(t, js, req, 1)
			require.Eventually(t, func() bool {
				return testutil.ToFloat64(s.metrics.writeReplays.WithLabelValues(tool.def.Ref().String(), "recorded")) == 1
			}, waitLimit, 10*time.Millisecond, "the redelivery is answered from the record")
			waitIdle(t, js)
			require.EqualValues(t, 1, tool.runs.Load(), "the writes tool ran once")
			require.EqualValues(t, 1, count(t, js, completedSubject(t, req)))
		})
	}
}

// TestCallsOfCancelledRunsDoNotStart: a call of a cancelled run that comes
// after the cancel is answered POLICY_DENIED, details.cancelled, and its
// tool never runs: whether this replica got the cancel live, or missed it
// (it was not running) and finds it stored when the call comes again. A
// call of a run whose end is stored is dropped, as before: no event.
func TestCallsOfCancelledRunsDoNotStart(t *testing.T) {
	for _, c := range []struct {
		name string
		// before runs before the executor starts.
		before func(t *testing.T, pub *publish.Publisher, runID string)
		// deliver hands the call to the executor: published, or a
		// redelivery given to its handler.
		redelivery bool
		dropped    bool // nothing of the call is published
	}{
		{name: "cancel received live"},
		{name: "cancel missed live, call delivered again", redelivery: true,
			before: func(t *testing.T, pub *publish.Publisher, runID string) {
				require.NoError(t, pub.Publish(t.Context(), testCancel(t, runID)))
			}},
		{name: "run already ended", dropped: true, before: func(t *testing.T, pub *publish.Publisher, runID string) {
			end, err := events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: runID, Status: events.StatusCancelled,
				Reason: "cancelled by tester"}, "", events.RunTrace{})
			require.NoError(t, err)
			require.NoError(t, pub.Publish(t.Context(), end))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tool := newBlockingTool("block_read", envelope.SideEffectsReads)
			env := eventstest.Start(t)
			js := env.JetStream(t)
			pub := publish.NewPublisher(js)
			runID := "run-refused"
			if c.before != nil {
				c.before(t, pub, runID)
			}
			s := startExecutor(t, env, Config{ID: "executor-refuse"}, WithTools(tool))
			ref := tool.def.Ref().String()
			req := callRequest(t, runID, 1, tool.def.Name, "1.0.0", `{}`)
			w := watchRun(t, js, runID)
			if !c.redelivery {
				// Live: the executor has the cancel before the call comes.
				require.NoError(t, pub.Publish(t.Context(), testCancel(t, runID)))
				require.Eventually(t, func() bool {
					_, ok := s.cancels.Said(runID, req.Tenant)
					return ok
				}, waitLimit, 5*time.Millisecond, "the executor gets the cancel")
			}
			if c.redelivery {
				out := approved(t, req, events.RunTrace{})
				require.NoError(t, s.handle(t.Context(), &consume.Delivery{Event: &out.Event, Subject: out.Subject, Attempt: 2}))
			} else {
				publishApproved(t, pub, req)
			}
			if c.dropped {
				waitIdle(t, js)
				require.Zero(t, count(t, js, completedSubject(t, req)), "nothing of a call of an ended run is published")
				require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.runOver.WithLabelValues(ref, "ended")))
			} else {
				got := w.envelopeOf(t, newEventSchemas(t), req)
				require.NotNil(t, got.Error)
				require.Equal(t, envelope.CodePolicyDenied, got.Error.Code)
				require.True(t, events.IsCancelledCall(got.Error))
				require.Equal(t, "not run: "+cancelSaid, got.Error.Message)
				require.Zero(t, got.Cost, "nothing ran: nothing to pay")
				require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.cancelled.WithLabelValues(ref, cancelRefused)))
				started, err := events.CallSubject(req.RunID, req.CallID, events.VerbStarted)
				require.NoError(t, err)
				require.Zero(t, count(t, js, started), "a call that never started has no started event")
			}
			require.Zero(t, tool.runs.Load(), "the tool never runs")
		})
	}
}

// TestCancelOfAnotherTenantIsNotTheRunsCancel: a cancel request whose tenant
// is not the call's (a publisher's mistake) cuts nothing; a malformed one
// is dropped and counted.
func TestCancelOfAnotherTenantIsNotTheRunsCancel(t *testing.T) {
	tool := newBlockingTool("block_read", envelope.SideEffectsReads)
	tool.def.TimeoutMS = 500
	env := eventstest.Start(t)
	js := env.JetStream(t)
	pub := publish.NewPublisher(js)
	s := startExecutor(t, env, Config{ID: "executor-tenant"}, WithTools(tool))
	const runID = "run-tenant"
	w := watchRun(t, js, runID)
	req := callRequest(t, runID, 1, tool.def.Name, "1.0.0", `{}`)
	publishApproved(t, pub, req)
	receive(t, tool.entered, "the tool runs")

	other, err := events.NewCancelRequested(testSource, events.CancelRequest{RunID: runID, Tenant: envelope.Tenant{OrgID: "globex"}}, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, pub.Publish(t.Context(), other))
	subj, err := events.RunSubject("run-bad", events.VerbCancelRequested)
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), subj, []byte(`{"run_id":"run-bad"}`))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testutil.ToFloat64(s.metrics.cancelsInvalid) == 1 }, waitLimit, 5*time.Millisecond)

	got := w.envelopeOf(t, newEventSchemas(t), req)
	require.NotNil(t, got.Error)
	require.Equal(t, envelope.CodeTimeout, got.Error.Code)
	require.False(t, events.IsCancelledCall(got.Error), "it ran to its own timeout: %s", got.Error.Message)
}

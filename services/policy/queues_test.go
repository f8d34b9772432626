package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
)

// servedQueues are the queues every harness has a live worker of.
var servedQueues = []string{envelope.DefaultQueue, "gpu", "mail"}

// serve beats queue as a live worker would, for the length of the test.
func (h *harness) serve(queue string) {
	h.t.Helper()
	require.NoError(h.t, registry.Beat(h.t.Context(), h.env.JS, registry.Worker{Queue: queue, Instance: "test-" + queue,
		ID: "test", TTL: registry.MaxWorkerTTL}, time.Now()))
}

// TestServiceAnswersCallsOfUnservedQueues: an allowed call whose queue has
// no live worker is not approved (no worker could ever take it); after the
// bounded queue wait it is completed with PROVIDER_ERROR naming the queue,
// while the turn's other calls go to their served queues. A worker that
// starts during the wait gets the call.
func TestServiceAnswersCallsOfUnservedQueues(t *testing.T) {
	const wait = 300 * time.Millisecond
	h := newHarnessConfig(t, Config{Concurrency: 4, QueueWait: wait})
	const runID = "run-unserved"
	enabled := []string{"web_search@1.0.0", "calc@2.1.0"}
	search := turnCall(t, "web_search", "1.0.0", 1)
	lonely := turnCall(t, "calc", "2.1.0", 2)
	lonely.Queue = "nobody"
	turn := newTurn(runID, 1, envelope.Policy{}, enabled, search, lonely)
	approved := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approved.*")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
	start := time.Now()
	h.publishTurn(turn)

	ev, subj := h.nextEventOn(approved)
	require.Equal(t, "toolwire.call."+runID+"."+search.CallID+".approved.default", subj)
	require.Equal(t, wantApproved(t, turn, search, "default"), decode[events.CallRequest](t, ev))
	env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
	require.GreaterOrEqual(t, time.Since(start), wait, "the guard waited for a worker first")
	require.Equal(t, lonely.CallID, env.CallID)
	require.NotNil(t, env.Error)
	require.Equal(t, envelope.CodeProviderError, env.Error.Code)
	require.Contains(t, env.Error.Message, `no live worker serves queue "nobody" (waited 300ms)`)
	require.Equal(t, map[string]any{"queue": "nobody", "waited_ms": float64(300)}, env.Error.Details)
	require.NoError(t, h.schemas.Validate(envelope.SchemaToolEnvelope, mustJSON(t, env)))
	h.drained(events.StreamRuns, DurableTurns)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.nobody"), "never approved to the unserved queue")

	// A redelivered turn keeps the outcome it had.
	h.publish(events.NewTurnCompleted("/toolwire/orchestrator", turn, runTrace))
	h.drained(events.StreamRuns, DurableTurns)
	require.Equal(t, uint64(2), h.count(events.StreamCalls, "toolwire.call."+runID+".>"))

	// A worker that starts while the guard waits gets the call.
	slow := newHarnessConfig(t, Config{Concurrency: 4, QueueWait: time.Minute})
	const later = "run-served-later"
	call := turnCall(t, "calc", "2.1.0", 1)
	call.Queue = "late"
	lateTurn := newTurn(later, 1, envelope.Policy{}, enabled, call)
	approvedLater := slow.watch(events.StreamCalls, "toolwire.call."+later+".*.approved.*")
	slow.publishTurn(lateTurn)
	servicetest.PollUntil(t, waitFor, "the guard holds the turn, waiting for a worker", func() bool {
		c, err := slow.env.JS.Consumer(t.Context(), events.StreamRuns, DurableTurns)
		require.NoError(t, err)
		info, err := c.Info(t.Context())
		require.NoError(t, err)
		return info.NumPending == 0 && info.NumAckPending == 1
	})
	require.Zero(t, slow.count(events.StreamCalls, "toolwire.call."+later+".>"))
	slow.serve("late")
	_, subj = slow.nextEventOn(approvedLater)
	require.Equal(t, "toolwire.call."+later+"."+call.CallID+".approved.late", subj)
}

func TestQueueWaitConfig(t *testing.T) {
	require.Equal(t, DefaultQueueWait, Config{}.WithDefaults().QueueWait)
	require.ErrorContains(t, Config{QueueWait: time.Hour}.Validate(), "queue wait")
	c, err := ConfigFromEnv(func(k string) string {
		if k == EnvQueueWait {
			return "45s"
		}
		return ""
	})
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, c.QueueWait)
}

// TestApprovedCallOfAnUnservedQueue: a call an operator approves whose queue
// has no live worker is answered PROVIDER_ERROR naming the queue, once,
// however many replicas and sweeps settle its record (the result of the
// queue check is stored in the record before the outcome goes out).
func TestApprovedCallOfAnUnservedQueue(t *testing.T) {
	h := newHarnessConfig(t, Config{Concurrency: 4, ApprovalSweep: 20 * time.Millisecond, PreviewTimeout: time.Second,
		QueueWait: 300 * time.Millisecond})
	require.NoError(t, h.reg.Put(t.Context(), registry.Entry{Definition: writerDef()}))
	require.Eventually(t, func() bool {
		_, ok := h.svc.catalog.Lookup(envelope.ToolRef{Name: "send_email", Version: "1.0.0"})
		return ok
	}, waitFor, 5*time.Millisecond)
	const runID = "run-appr-unserved"
	send := turnCall(t, "send_email", "1.0.0", 1)
	send.Queue = "outbox"
	required := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.approval_required")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
	h.publishTurn(newTurn(runID, 1, approvalPolicy, []string{"send_email@1.0.0"}, send))
	require.Equal(t, send.CallID, decode[events.ApprovalRequest](t, h.nextEvent(required)).CorrelationID)

	h.decide(events.Decision{RunID: runID, CallID: send.CallID, Decision: events.DecisionApprove, By: "alice"})
	env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
	require.Equal(t, send.CallID, env.CallID)
	require.NotNil(t, env.Error)
	require.Equal(t, envelope.CodeProviderError, env.Error.Code)
	require.Contains(t, env.Error.Message, `no live worker serves queue "outbox"`)
	require.Equal(t, map[string]any{"queue": "outbox", "waited_ms": float64(300), "approval": "approve", "by": "alice"},
		env.Error.Details, "the details say the approval was applied")
	servicetest.PollUntil(t, waitFor, "the record is settled", func() bool { return h.record(runID, send.CallID).Settled })
	rec := h.record(runID, send.CallID)
	require.True(t, rec.Routed)
	require.Equal(t, "outbox", rec.Unserved)

	// A worker that starts now changes nothing: the outcome is given.
	h.serve("outbox")
	h.decideAgain(events.Decision{RunID: runID, CallID: send.CallID, Decision: events.DecisionApprove, By: "alice"})
	h.drained(events.StreamCalls, DurableDecisions)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.>"))
	require.Equal(t, uint64(1), h.count(events.StreamCalls, "toolwire.call."+runID+".*.completed"))
}

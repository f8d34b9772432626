package policy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Nothing of a run follows its end: the calls of a turn whose run's deadline
// has passed are not judged (none approved, none denied); a call held for
// approval whose run ends before the decision gets no outcome when it is
// decided; and an approved call carries its run's deadline to its workers.
func TestCallsOfRunsThatAreOver(t *testing.T) {
	h := approvalHarness(t)
	enabled := []string{"web_search@1.0.0", "send_email@1.0.0"}

	past := time.Now().Add(-time.Second).UTC()
	late := newTurn("run-late", 1, envelope.Policy{}, enabled, turnCall(t, "web_search", "1.0.0", 1))
	late.Deadline = &past
	h.publishTurn(late)

	future := time.Now().Add(time.Hour).UTC()
	live := newTurn("run-live", 1, envelope.Policy{}, enabled, turnCall(t, "web_search", "1.0.0", 1))
	live.Deadline = &future
	approved := h.watch(events.StreamCalls, "toolwire.call.run-live.*.approved.*")
	h.publishTurn(live)
	req := decode[events.CallRequest](t, h.nextEvent(approved))
	require.NotNil(t, req.RunDeadline)
	require.True(t, future.Equal(*req.RunDeadline), "the call carries its run's deadline")

	// Held for approval; the run fails before the decision.
	held := turnCall(t, "send_email", "1.0.0", 1)
	ending := newTurn("run-ends", 1, approvalPolicy, enabled, held)
	ending.Deadline = &future
	h.publishTurn(ending)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues("requested")) == 1
	}, waitFor, 5*time.Millisecond)
	h.publish(events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: "run-ends", Status: events.StatusFailed,
		Code: envelope.CodeTimeout, Reason: "deadline"}, "", events.RunTrace{}))
	h.decide(events.Decision{RunID: "run-ends", CallID: held.CallID, Decision: events.DecisionApprove, By: "alice"})
	require.Eventually(t, func() bool { return h.record("run-ends", held.CallID).Settled }, waitFor, 5*time.Millisecond)

	h.drained(events.StreamRuns, DurableTurns)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call.run-late.>"), "no call of a run past its deadline is judged")
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call.run-ends.*.approved.*"), "an approval after the run's end sends nothing on")
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call.run-ends.*.completed"))
	require.Equal(t, 1.0, testutil.ToFloat64(h.svc.metrics.runOver.WithLabelValues("turn", "deadline")))
	require.Equal(t, 1.0, testutil.ToFloat64(h.svc.metrics.runOver.WithLabelValues("approval", "ended")))
}

package policy

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
)

// A cancel withdraws the approvals its run waits for: each call is answered
// POLICY_DENIED saying the run was cancelled, its record is withdrawn, and
// a decision that comes later is refused (by the CLI's check and by the
// guard), so the call never runs. An approval of another run stays.
func TestCancelWithdrawsTheRunsApprovals(t *testing.T) {
	h := approvalHarness(t)
	const runID, other = "run-cancel-appr", "run-cancel-other"
	req := turnCall(t, "send_email", "1.0.0", 1)
	required := h.watch(events.StreamCalls, "toolwire.call.*.*.approval_required")
	completed := h.watch(events.StreamCalls, "toolwire.call."+runID+".*.completed")
	h.publishTurn(newTurn(runID, 1, approvalPolicy, []string{"send_email@1.0.0"}, req))
	h.publishTurn(newTurn(other, 1, approvalPolicy, []string{"send_email@1.0.0"}, req))
	h.nextEvent(required)
	h.nextEvent(required)

	h.publish(events.NewCancelRequested("/toolwire/test", events.CancelRequest{RunID: runID, Tenant: tenant, By: "ops", Reason: "wrong customer"}, events.RunTrace{}))
	env := decode[envelope.ToolEnvelope](t, h.nextEvent(completed))
	require.Equal(t, req.CallID, env.CallID)
	require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
	require.Equal(t, "not run: the run was cancelled by ops: wrong customer", env.Error.Message)
	require.True(t, events.IsCancelledCall(env.Error), "%#v", env.Error)
	require.Equal(t, events.ApprovalWithdrawn, h.record(runID, req.CallID).State)
	require.Eventually(t, func() bool { return h.record(runID, req.CallID).Settled }, waitFor, 5*time.Millisecond,
		"marked settled once its outcome is stored")

	// A late decision: the CLI and the timeline refuse it, saying why...
	_, err := approvals.PendingApproval(t.Context(), h.env.JetStream(t), runID, req.CallID)
	require.ErrorIs(t, err, approvals.ErrAlreadyDecided)
	require.ErrorContains(t, err, "withdrawn: the run was cancelled by ops: wrong customer")
	// ...and the guard ignores one published anyway.
	h.decide(events.Decision{RunID: runID, CallID: req.CallID, Decision: events.DecisionApprove, By: "late"})
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.svc.metrics.approvals.WithLabelValues(approvalIgnored)) == 1
	}, waitFor, 5*time.Millisecond)
	require.Zero(t, h.count(events.StreamCalls, "toolwire.call."+runID+".*.approved.*"), "the call never runs")
	require.Equal(t, events.ApprovalWithdrawn, h.record(runID, req.CallID).State)

	kept := h.record(other, req.CallID)
	require.True(t, kept.Pending(), "another run's approval stays")
}

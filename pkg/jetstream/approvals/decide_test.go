package approvals_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPublishDecisionOncePerCall: a call's first decision is published; a
// second one, opposite or the same, is refused with ErrAlreadyDecided and
// not stored beside it, so an operator learns at once that it had no effect.
func TestPublishDecisionOncePerCall(t *testing.T) {
	env := eventstest.Start(t)
	ctx := eventstest.Context(t)
	callID := strings.Repeat("ab", 32)
	rec := events.ApprovalRecord{State: events.ApprovalPending,
		Call: events.CallRequest{RunID: "decide-once", CallID: callID, Tenant: envelope.Tenant{OrgID: "acme"}}}
	decision := func(k events.DecisionKind, by string) events.Decision {
		return events.Decision{RunID: "decide-once", CallID: callID, Decision: k, By: by, Note: "n"}
	}
	require.NoError(t, approvals.PublishDecision(ctx, env.JS, "/test", decision(events.DecisionDeny, "alice"), rec))
	for _, d := range []events.Decision{decision(events.DecisionApprove, "mallory"), decision(events.DecisionDeny, "alice")} {
		require.ErrorIs(t, approvals.PublishDecision(ctx, env.JS, "/test", d, rec), approvals.ErrAlreadyDecided)
	}
	require.Equal(t, uint64(1), eventstest.StreamMsgs(t, env.JS, events.StreamCalls))
}

package identity_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service/identity"
)

// TestMayPublish: the client-side reading of a role's permissions matches
// subjects as the server does (TestPermissionMatrix checks the server).
func TestMayPublish(t *testing.T) {
	const call = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ops := identity.Operations.Permissions()
	exe := identity.Executor.Permissions()
	for _, tc := range []struct {
		p       identity.Permissions
		subject string
		want    bool
	}{
		{ops, "toolwire.call.r1." + call + ".completed", true},
		{ops, "toolwire.call.r1." + call + ".started", true},
		{ops, "toolwire.run.r1.turn.2.completed", true},
		{ops, "toolwire.run.r1.completed", true},
		{ops, "toolwire.sandbox.r1." + call + ".completed", true},
		// The commands: an operator's to replay.
		{ops, "toolwire.run.r1.requested", false},
		{ops, "toolwire.run.r1.cancel_requested", false},
		{ops, "toolwire.call.r1." + call + ".decided", false},
		{ops, "toolwire.call.r1." + call + ".approved.default", false},
		{ops, "toolwire.sandbox.r1." + call + ".requested", false},
		// Tokens count: * is one, > at least one.
		{ops, "toolwire.run.r1.turn.completed", false},
		{ops, "toolwire.call.r1.completed", false},
		{ops, "$JS.API.STREAM.MSG.DELETE.TOOLWIRE_DLQ", true},
		{ops, "$JS.API.STREAM.MSG.DELETE.TOOLWIRE_CALLS", false},
		{ops, "$JS.FC.x.y", true},
		{ops, "$JS.FC", false},
		// Deny wins over allow.
		{exe, "$JS.API.CONSUMER.DELETE.TOOLWIRE_SANDBOX.x", true},
		{exe, "$JS.API.CONSUMER.DELETE.TOOLWIRE_SANDBOX." + identity.SandboxDurable, false},
	} {
		require.Equal(t, tc.want, tc.p.MayPublish(tc.subject), tc.subject)
	}
}

package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// DecodeCancel takes a cancel request of the subject's run and refuses any
// other event, a cancel on another run's subject and invalid data.
func TestDecodeCancel(t *testing.T) {
	tenant := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws1"}
	out, err := events.NewCancelRequested("/test", events.CancelRequest{RunID: "r1", Tenant: tenant, By: "ops"}, events.RunTrace{})
	require.NoError(t, err)
	got, err := events.DecodeCancel(&out.Event, out.Subject)
	require.NoError(t, err)
	require.Equal(t, "r1", got.RunID)
	require.True(t, got.Covers(envelope.Tenant{OrgID: "acme", WorkspaceID: "ws1", UserID: "u"}))
	require.False(t, got.Covers(envelope.Tenant{OrgID: "acme", WorkspaceID: "ws2"}))
	require.False(t, got.Covers(envelope.Tenant{OrgID: "globex", WorkspaceID: "ws1"}))

	_, err = events.DecodeCancel(&out.Event, "toolwire.run.r2.cancel_requested")
	require.ErrorIs(t, err, events.ErrInvalidCancel)

	other, err := events.NewRunStatus("/test", events.RunStatus{RunID: "r1", Status: events.StatusStarted, Tenant: tenant}, "", events.RunTrace{})
	require.NoError(t, err)
	_, err = events.DecodeCancel(&other.Event, out.Subject)
	require.ErrorIs(t, err, events.ErrInvalidCancel)

	bad := out.Event.Clone()
	require.NoError(t, bad.SetData("application/json", []byte(`{"run_id":"r1","tenant":{"org_id":""},"requested_at":"2026-12-02T00:00:00Z"}`)))
	_, err = events.DecodeCancel(&bad, out.Subject)
	require.ErrorIs(t, err, events.ErrInvalidCancel)
	require.ErrorContains(t, err, "tenant.org_id is required")
}

package store_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// TestApprovalOf: a call's approval is what the Policy Guard's outcome
// shows, whatever order and number of decisions were recorded.
func TestApprovalOf(t *testing.T) {
	row := func(id, typ, data string) store.EventRow {
		return store.EventRow{ID: id, Type: typ, Data: json.RawMessage(data)}
	}
	asked := row("r/c/approval_required", events.TypeCallApprovalRequired, `{}`)
	decided := func(id, kind, by, note string) store.EventRow {
		b, err := json.Marshal(events.Decision{RunID: "r", CallID: "c", Decision: events.DecisionKind(kind), By: by, Note: note})
		require.NoError(t, err)
		return row(id, events.TypeCallDecided, string(b))
	}
	denied := func(kind, by, note string) store.EventRow {
		b, err := json.Marshal(map[string]any{"call_id": "c", "error": map[string]any{"code": "POLICY_DENIED", "message": "m",
			"details": map[string]any{"approval": kind, "by": by, "note": note}}})
		require.NoError(t, err)
		return row("r/c/completed", events.TypeCallCompleted, string(b))
	}
	approved := row("r/c/approved", events.TypeCallApproved, `{"operator_approved":true}`)
	cut, err := json.Marshal(map[string]any{"call_id": "c", "error": events.CancelledCallError(false, "cancelled by ops")})
	require.NoError(t, err)
	withdrawn := row("r/c/completed", events.TypeCallCompleted, string(cut))
	allowed := row("r/c/approved", events.TypeCallApproved, `{}`)
	succeeded := row("r/c/completed", events.TypeCallCompleted, `{"call_id":"c","output":1}`)
	ids := func(ds []store.DecisionRow) []string {
		out := []string{}
		for _, d := range ds {
			out = append(out, d.Event)
		}
		return out
	}
	cases := []struct {
		name              string
		evs               []store.EventRow
		state             string
		applied           string // its event id; "-" for none
		ignored, awaiting []string
		why               string
	}{
		{"no approval", []store.EventRow{allowed, succeeded}, "", "-", []string{}, []string{}, ""},
		{"waiting", []store.EventRow{asked}, store.ApprovalPending, "-", []string{}, []string{}, ""},
		{"decided, outcome not yet recorded", []store.EventRow{asked, decided("d1", "deny", "a", ""), decided("d2", "approve", "b", "")},
			store.ApprovalPending, "-", []string{}, []string{"d1", "d2"}, ""},
		{"a late approve after a deny", []store.EventRow{asked, decided("d1", "deny", "a", "no"), denied("deny", "a", "no"),
			decided("d2", "approve", "b", "")}, store.ApprovalDenied, "d1", []string{"d2"}, []string{}, "the call was already denied by a"},
		{"a late deny after an approve", []store.EventRow{asked, decided("d1", "approve", "a", ""), approved, succeeded,
			decided("d2", "deny", "b", "")}, store.ApprovalApproved, "d1", []string{"d2"}, []string{}, "the call was already approved by a"},
		{"the outcome names the decision applied, not the first recorded", []store.EventRow{asked, decided("d1", "deny", "x", "a"),
			decided("d2", "deny", "y", "b"), denied("deny", "y", "b")}, store.ApprovalDenied, "d2", []string{"d1"}, []string{}, ""},
		{"the outcome arrives before the decisions", []store.EventRow{approved, decided("d2", "deny", "b", ""), decided("d1", "approve", "a", "")},
			store.ApprovalApproved, "d1", []string{"d2"}, []string{}, "the call was already approved by a"},
		{"approved, and no worker of its queue", []store.EventRow{asked, decided("d1", "approve", "a", ""), denied("approve", "a", ""),
			decided("d2", "deny", "b", "")}, store.ApprovalApproved, "d1", []string{"d2"}, []string{}, ""},
		{"timed out, then decided", []store.EventRow{asked, denied("timeout", "", ""), decided("d1", "approve", "a", "")},
			store.ApprovalExpired, "-", []string{"d1"}, []string{}, "the approval had timed out"},
		{"an outcome with no decision recorded", []store.EventRow{asked, denied("revise", "a", "fix it")},
			store.ApprovalRevised, "", []string{}, []string{}, ""},
		{"withdrawn by the run's cancellation, then decided", []store.EventRow{asked, withdrawn, decided("d1", "approve", "a", "")},
			store.ApprovalWithdrawn, "-", []string{"d1"}, []string{}, "the approval was withdrawn: the run was cancelled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := store.ApprovalOf(c.evs)
			require.Equal(t, c.state, a.State)
			if c.applied == "-" {
				require.Nil(t, a.Applied)
			} else {
				require.NotNil(t, a.Applied)
				require.Equal(t, c.applied, a.Applied.Event)
			}
			require.Equal(t, c.ignored, ids(a.Ignored))
			require.Equal(t, c.awaiting, ids(a.Awaiting))
			if c.why != "" {
				require.Equal(t, c.why, a.Ignored[0].Why)
			}
		})
	}
}

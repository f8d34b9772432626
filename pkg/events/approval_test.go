package events_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

func TestDecisionValidate(t *testing.T) {
	ok := events.Decision{RunID: runID, CallID: callID, Decision: events.DecisionApprove}
	tests := []struct {
		name string
		edit func(d *events.Decision)
		err  string // "" when valid
	}{
		{name: "approve", edit: func(*events.Decision) {}},
		{name: "deny with a note", edit: func(d *events.Decision) { d.Decision, d.Note, d.By = events.DecisionDeny, "no", "ops" }},
		{name: "revise with a note", edit: func(d *events.Decision) { d.Decision, d.Note = events.DecisionRevise, "use the sandbox" }},
		{name: "revise without a note", edit: func(d *events.Decision) { d.Decision, d.Note = events.DecisionRevise, "  " },
			err: "a revise decision needs a note: it is what the model is told"},
		{name: "unknown kind", edit: func(d *events.Decision) { d.Decision = "maybe" },
			err: `decision "maybe" is not one of approve, deny, revise`},
		{name: "unsafe run id", edit: func(d *events.Decision) { d.RunID = "a.b" }, err: `run_id "a.b" must be 1-64`},
		{name: "bad call id", edit: func(d *events.Decision) { d.CallID = "XYZ" }, err: `call_id "XYZ" must be lowercase hex`},
		{name: "note too long", edit: func(d *events.Decision) { d.Note = strings.Repeat("n", events.MaxDecisionNote+1) },
			err: "note must be valid UTF-8 of at most 4000 bytes"},
		{name: "by too long", edit: func(d *events.Decision) { d.By = strings.Repeat("b", events.MaxDecisionBy+1) },
			err: "by must be valid UTF-8 of at most 128 bytes"},
	}
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := ok
			tt.edit(&d)
			err := d.Validate()
			b, merr := json.Marshal(d)
			require.NoError(t, merr)
			serr := schemas.Validate(events.SchemaDecision, b)
			_, cerr := events.NewDecided("/s", d, tenant, runTrace)
			if tt.err == "" {
				require.NoError(t, err)
				require.NoError(t, serr)
				require.NoError(t, cerr)
				return
			}
			require.ErrorIs(t, err, events.ErrInvalidDecision)
			require.ErrorContains(t, err, tt.err)
			require.Error(t, serr, "the schema rejects it too")
			require.ErrorIs(t, cerr, events.ErrInvalidDecision, "no event is built from it")
		})
	}
}

func TestApprovalKeyAndRecord(t *testing.T) {
	k, err := events.ApprovalKey(runID, callID)
	require.NoError(t, err)
	require.Equal(t, runID+"."+callID, k)
	_, err = events.ApprovalKey("a.b", callID)
	require.ErrorIs(t, err, events.ErrUnsafeID)
	_, err = events.ApprovalKey(runID, "nothex")
	require.ErrorIs(t, err, events.ErrUnsafeID)

	rec := events.ApprovalRecord{State: events.ApprovalPending, Call: fixtureCallRequest(), Request: fixtureApprovalRequest(),
		RequestedAt: t0.Add(-time.Minute), Deadline: t0, Trace: runTrace}
	b, err := json.Marshal(rec)
	require.NoError(t, err)
	got, err := events.DecodeApprovalRecord(b)
	require.NoError(t, err)
	require.True(t, got.Pending())
	require.Equal(t, rec.Call.CallID, got.Call.CallID)
	require.Equal(t, runTrace, got.Trace)
	require.True(t, rec.RequestedAt.Equal(got.RequestedAt))

	_, err = events.DecodeApprovalRecord([]byte(`{"state":"lost"}`))
	require.ErrorContains(t, err, `approval record: unknown state "lost"`)
	_, err = events.DecodeApprovalRecord([]byte(`[`))
	require.ErrorContains(t, err, "approval record:")
}

func FuzzDecodeApprovalRecord(f *testing.F) {
	f.Add([]byte(`{"state":"pending","deadline":"2025-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"state":"approved","decision":{"run_id":"r","call_id":"ab","decision":"approve"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := events.DecodeApprovalRecord(b)
		if err != nil {
			return
		}
		// A decoded record has a known state and re-encodes.
		_, err = json.Marshal(r)
		require.NoError(t, err)
		require.NotEmpty(t, r.State)
	})
}

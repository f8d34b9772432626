package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

func TestDeltaRoundTrip(t *testing.T) {
	for _, d := range []events.Delta{
		{RunID: "r1", Iteration: 1, Attempt: 1, Seq: 1, Text: "Hel"},
		{RunID: "r1", Iteration: 2, Attempt: 1, Seq: 3, ToolCall: &events.DeltaToolCall{Index: 0, ID: "c1", Name: "echo"}},
		{RunID: "r1", Iteration: 2, Attempt: 1, Seq: 4, ToolCall: &events.DeltaToolCall{Index: 0, Arguments: `{"te`}},
		{RunID: "r1", Iteration: 2, Attempt: 1, Seq: 5, Discarded: true},
	} {
		b, err := events.EncodeDelta(d)
		require.NoError(t, err)
		subject, err := events.DeltaSubject(d.RunID, d.Iteration)
		require.NoError(t, err)
		got, err := events.DecodeDelta(subject, b)
		require.NoError(t, err)
		require.Equal(t, d, got)
	}
}

func TestDeltaRejections(t *testing.T) {
	for _, tc := range []struct {
		name, subject, data, err string
	}{
		{"not JSON", "toolwire.delta.r1.1", `{`, "invalid delta"},
		{"two kinds", "toolwire.delta.r1.1", `{"run_id":"r1","iteration":1,"attempt":1,"seq":1,"text":"a","discarded":true}`, "exactly one"},
		{"none", "toolwire.delta.r1.1", `{"run_id":"r1","iteration":1,"attempt":1,"seq":1}`, "exactly one"},
		{"no seq", "toolwire.delta.r1.1", `{"run_id":"r1","iteration":1,"attempt":1,"text":"a"}`, "each 1 or more"},
		{"bad run", "toolwire.delta.r1.1", `{"run_id":"a.b","iteration":1,"attempt":1,"seq":1,"text":"a"}`, "run_id"},
		{"another run's subject", "toolwire.delta.r2.1", `{"run_id":"r1","iteration":1,"attempt":1,"seq":1,"text":"a"}`, "on toolwire.delta.r2.1"},
		{"negative index", "toolwire.delta.r1.1", `{"run_id":"r1","iteration":1,"attempt":1,"seq":1,"tool_call":{"index":-1}}`, "index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := events.DecodeDelta(tc.subject, []byte(tc.data))
			require.ErrorIs(t, err, events.ErrInvalidDelta)
			require.ErrorContains(t, err, tc.err)
		})
	}
	_, err := events.DeltaSubject("r1", 0)
	require.Error(t, err)
}

func FuzzDecodeDelta(f *testing.F) {
	f.Add("toolwire.delta.r1.1", []byte(`{"run_id":"r1","iteration":1,"attempt":1,"seq":1,"text":"a"}`))
	f.Add("toolwire.delta.r1.2", []byte(`{"run_id":"r1","iteration":2,"attempt":1,"seq":1,"tool_call":{"index":0,"arguments":"{"}}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		d, err := events.DecodeDelta(subject, data)
		if err != nil {
			return
		}
		b, err := events.EncodeDelta(d)
		require.NoError(t, err, "a decoded delta encodes")
		again, err := events.DecodeDelta(subject, b)
		require.NoError(t, err)
		require.Equal(t, d, again)
	})
}

// TestDeltaSchema: what EncodeDelta writes is what delta.schema.json (the
// AsyncAPI document's payload) accepts, and the schema refuses what
// DecodeDelta refuses.
func TestDeltaSchema(t *testing.T) {
	s, err := events.NewSchemas()
	require.NoError(t, err)
	for _, d := range []events.Delta{
		{RunID: "r1", Iteration: 1, Attempt: 1, Seq: 1, Text: "Hel"},
		{RunID: "r1", Iteration: 2, Attempt: 2, Seq: 9, ToolCall: &events.DeltaToolCall{Index: 1, ID: "c1", Name: "echo", Arguments: `{"a`}},
		{RunID: "r1", Iteration: 2, Attempt: 1, Seq: 5, Discarded: true},
	} {
		b, err := events.EncodeDelta(d)
		require.NoError(t, err)
		require.NoError(t, s.Validate(events.SchemaDelta, b), "%s", b)
	}
	for _, bad := range []string{
		`{"run_id":"r1","iteration":1,"attempt":1,"seq":1}`,
		`{"run_id":"r1","iteration":1,"attempt":1,"seq":1,"text":"a","discarded":true}`,
		`{"run_id":"r1","iteration":0,"attempt":1,"seq":1,"text":"a"}`,
		`{"run_id":"r1","iteration":1,"attempt":1,"seq":1,"text":"a","extra":1}`,
	} {
		require.Error(t, s.Validate(events.SchemaDelta, []byte(bad)), bad)
	}
}

package policy_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/services/policy"
)

// testSchemas compiles the contract and event data schemas.
func testSchemas(t *testing.T) *envelope.Schemas {
	t.Helper()
	s, err := events.NewSchemas()
	require.NoError(t, err)
	return s
}

func TestDeniedEnvelopeMatchesSchema(t *testing.T) {
	schemas := testSchemas(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	tests := []struct {
		name, tool, version string
	}{
		{name: "tool not enabled: no version", tool: "send_email"},
		{name: "blocked version", tool: "rm_rf", version: "1.0.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := json.RawMessage(`{"to": "a@example.com", "n": 1.0}`)
			callID, err := envelope.CallID(tt.tool, tt.version, input, 7)
			require.NoError(t, err)
			req := events.CallRequest{RunID: "run-1", CallID: callID, Seq: 7, Iteration: 2, Name: tt.tool, Version: tt.version, Input: input,
				Queue: envelope.DefaultQueue}
			env := policy.DeniedEnvelope(&req, rules.Deny("no"), now)

			require.Equal(t, callID, env.CallID)
			require.Equal(t, tt.tool, env.Name)
			require.Equal(t, tt.version, env.Version)
			require.Equal(t, string(input), string(env.Input), "input is kept byte for byte")
			require.Nil(t, env.Output)
			require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "no"}, env.Error)
			require.Equal(t, now.UTC(), env.TStart)
			require.Equal(t, time.UTC, env.TStart.Location())
			require.Equal(t, env.TStart, env.TEnd)
			require.Zero(t, env.Cost, "a refused call costs nothing")
			require.False(t, env.Billable())
			require.NoError(t, schemas.ValidateValue(envelope.SchemaToolEnvelope, env))
		})
	}
}

package envelope_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// A tool's declared cost is optional, a finite number, zero or more; the Go
// check and the JSON Schema agree.
func TestToolDefinitionCost(t *testing.T) {
	s := newSchemas(t)
	for _, tc := range []struct {
		name string
		cost float64
		bad  bool
	}{
		{"free", 0, false},
		{"a cent", 0.01, false},
		{"negative", -0.5, true},
		{"NaN", math.NaN(), true},
		{"infinite", math.Inf(1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := fixtureToolDefinition()
			d.Cost = tc.cost
			err := d.Validate()
			if !tc.bad {
				require.NoError(t, err)
				require.NoError(t, s.ValidateValue(envelope.SchemaToolDefinition, d))
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			require.ErrorContains(t, err, "cost must be a finite number, zero or more")
		})
	}
	err := s.Validate(envelope.SchemaToolDefinition, patch(t, marshal(t, fixtureToolDefinition()), edit{"/cost", -1}))
	var se *envelope.SchemaError
	require.ErrorAs(t, err, &se)
	require.True(t, slices.ContainsFunc(se.Problems, func(p string) bool { return strings.HasPrefix(p, "at /cost:") }), se.Problems)
	err = s.Validate(envelope.SchemaToolDefinition, patch(t, marshal(t, fixtureToolDefinition()), edit{"/cost", "1 USD"}))
	require.ErrorAs(t, err, &se)
}

// A tool message may say its call failed; the run request schema accepts it.
func TestMessageIsError(t *testing.T) {
	s := newSchemas(t)
	req := fixtureRunRequest(t)
	req.Messages = append(req.Messages,
		envelope.Message{Role: envelope.RoleAssistant, ToolCalls: []envelope.ToolCall{{ID: "c1", Name: "echo", Arguments: []byte(`{}`)}}},
		envelope.Message{Role: envelope.RoleTool, ToolCallID: "c1", Name: "echo", Content: `{"error":{"code":"TIMEOUT","message":"slow"}}`, IsError: true})
	require.NoError(t, req.Validate())
	require.NoError(t, s.ValidateValue(envelope.SchemaRunRequest, req))
	b := marshal(t, req)
	require.Contains(t, string(b), `"is_error":true`)
	require.Error(t, s.Validate(envelope.SchemaRunRequest, patch(t, b, edit{"/messages/2/is_error", "yes"})))
}

// Package tooltest checks in-process tools the way the executor runs them:
// the input against the tool's input schema, then Execute, then the output
// against its output schema. The tool families' tests share it.
package tooltest

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Case is one call of a tool.
type Case struct {
	Name  string
	Input string
	// WantOut is the output (JSON), checked when WantCode is empty.
	WantOut string
	// WantCode is the code of the tool's own error, and WantMsg part of its
	// message.
	WantCode envelope.ErrorCode
	WantMsg  string
	// WantInvalid: the input schema rejects the input with these problems.
	WantInvalid []string
}

// RunCases runs each case as a subtest of t.
func RunCases(t *testing.T, tl toolapi.Tool, cases []Case) {
	t.Helper()
	def := tl.Definition()
	schemas, err := toolapi.CompileSchemas(&def)
	require.NoError(t, err)
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			err := envelope.ValidateAgainst("input", schemas.Input, []byte(tc.Input))
			if len(tc.WantInvalid) > 0 {
				var se *envelope.SchemaError
				require.True(t, errors.As(err, &se), "want a schema violation, got %v", err)
				problems, _ := json.Marshal(se.Problems)
				for _, p := range tc.WantInvalid {
					require.Contains(t, string(problems), p)
				}
				return
			}
			require.NoError(t, err, "the input schema accepts the input")
			out, err := tl.Execute(t.Context(), json.RawMessage(tc.Input), toolapi.Context{TenantID: "acme//", Auth: map[string]string{}})
			if tc.WantCode != "" {
				var te *envelope.ToolError
				require.True(t, errors.As(err, &te), "want a ToolError, got %v", err)
				require.Equal(t, tc.WantCode, te.Code)
				require.Contains(t, te.Message, tc.WantMsg)
				return
			}
			require.NoError(t, err)
			require.JSONEq(t, tc.WantOut, string(out))
			require.NoError(t, envelope.ValidateAgainst("output", schemas.Output, out), "the output schema accepts the output")
		})
	}
}

// CheckBuiltinDefinition checks what every built-in tool's definition
// promises: a valid definition by the contract schema, version 1.0.0, a
// description, strict object input, an output schema, both compiling, and the
// tool's own name as its builtin key.
func CheckBuiltinDefinition(t *testing.T, def envelope.ToolDefinition) {
	t.Helper()
	contracts, err := envelope.NewSchemas(nil)
	require.NoError(t, err)
	require.NoError(t, def.Validate())
	require.NoError(t, contracts.ValidateValue(envelope.SchemaToolDefinition, def))
	require.Equal(t, toolapi.BuiltinVersion, def.Version)
	require.NotEmpty(t, def.Description)

	key, err := toolapi.BuiltinKey(&def)
	require.NoError(t, err)
	require.Equal(t, def.Name, key)

	var in map[string]any
	require.NoError(t, json.Unmarshal(def.InputSchema, &in))
	require.Equal(t, "object", in["type"])
	require.Equal(t, false, in["additionalProperties"], "input schemas are strict")
	require.NotEmpty(t, def.OutputSchema)

	schemas, err := toolapi.CompileSchemas(&def)
	require.NoError(t, err)
	require.NotNil(t, schemas.Output)
}

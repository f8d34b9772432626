package orchestrator

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestToolResultContent(t *testing.T) {
	ok := &envelope.ToolEnvelope{Output: json.RawMessage(`{"x":1}`)}
	require.Equal(t, `{"x":1}`, ToolResultContent(ok))
	require.Equal(t, "null", ToolResultContent(&envelope.ToolEnvelope{}))

	rl := &envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeRateLimit, Message: "slow down", RetryAfterS: 2}}
	require.JSONEq(t, `{"error":{"code":"RATE_LIMIT","message":"slow down","retry_after_s":2}}`, ToolResultContent(rl))

	val := &envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeValidation, Message: "bad", Details: []string{"at /x: missing"}}}
	require.JSONEq(t, `{"error":{"code":"VALIDATION_ERROR","message":"bad","details":["at /x: missing"]}}`, ToolResultContent(val))

	// The texts the adapters' tests (provider/openai, provider/anthropic)
	// send as tool results are these, byte for byte.
	require.Equal(t, `{"error":{"code":"RATE_LIMIT","message":"slow down","retry_after_s":2}}`, ToolResultContent(rl))
	require.Equal(t, `{"error":{"code":"VALIDATION_ERROR","details":["at /expression: got number, want string"],"message":"input does not match the schema"}}`,
		ToolResultContent(&envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeValidation,
			Message: "input does not match the schema", Details: []string{"at /expression: got number, want string"}}}))

	// Internals of an UNKNOWN error never reach the model.
	unk := &envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeUnknown, Message: "internal error in tool x", Details: "stack trace"}}
	require.NotContains(t, ToolResultContent(unk), "stack trace")
}

func TestApplyTurnAssignsSeqAndCallIDs(t *testing.T) {
	s := &Service{cfg: Config{}.withDefaults()}
	st := &RunState{RunID: "r1", Iteration: 1, Request: envelope.RunRequest{Agent: envelope.Agent{
		EnabledTools: []string{"echo@1.0.0", "calculator@2.1.0"}}}}
	turn := envelope.ModelTurn{Iteration: 1, Response: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{
		{ID: "a", Name: "echo", Arguments: json.RawMessage(`{"text": "x", "n": 1.0}`)},
		{ID: "b", Name: "calculator", Arguments: json.RawMessage(`{not json`)},
		{ID: "c", Name: "unknown_tool", Arguments: nil},
	}}}
	require.NoError(t, s.applyTurn(st, turn))
	require.Equal(t, PhaseAwaitingTools, st.Phase)
	require.Len(t, st.Calls, 3)

	want, err := envelope.CallID("echo", "1.0.0", []byte(`{"n":1,"text":"x"}`), 1)
	require.NoError(t, err)
	require.Equal(t, want, st.Calls[0].CallID)
	require.Equal(t, "2.1.0", st.Calls[1].Version)
	require.JSONEq(t, `"{not json"`, string(st.Calls[1].Input), "broken JSON reaches the tool as a string")
	require.Equal(t, "", st.Calls[2].Version)
	require.JSONEq(t, `{}`, string(st.Calls[2].Input))
	for i, c := range st.Calls {
		require.Equal(t, i+1, c.Seq)
	}

	// A later turn continues the sequence.
	st.Iteration = 2
	require.NoError(t, s.applyTurn(st, envelope.ModelTurn{Iteration: 2, Response: envelope.ModelResponse{
		ToolCalls: []envelope.ToolCall{{ID: "d", Name: "echo", Arguments: json.RawMessage(`{"text":"x","n":1}`)}}}}))
	require.Equal(t, 4, st.Calls[3].Seq)
	require.NotEqual(t, st.Calls[0].CallID, st.Calls[3].CallID, "same input, other seq: other id")

	// A turn without calls ends the run with its outputs.
	st.Iteration = 3
	st.Calls[0].Envelope = &envelope.ToolEnvelope{CallID: st.Calls[0].CallID, Name: "echo"}
	require.NoError(t, s.applyTurn(st, envelope.ModelTurn{Iteration: 3, Response: envelope.ModelResponse{Content: "bye"}}))
	require.Equal(t, PhaseCompleted, st.Phase)
	require.Equal(t, "bye", st.Outputs.Response)
	require.Equal(t, []string{st.Calls[0].CallID}, st.Outputs.ToolOrder)
}

func TestApplyTurnAnswersInvalidToolNamesItself(t *testing.T) {
	s := &Service{cfg: Config{}.withDefaults()}
	st := &RunState{RunID: "r1", Iteration: 1, Request: envelope.RunRequest{Agent: envelope.Agent{EnabledTools: []string{"web_search@1.0.0"}}}}
	require.NoError(t, s.applyTurn(st, envelope.ModelTurn{Iteration: 1, Response: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{
		{ID: "a", Name: "web.search", Arguments: json.RawMessage(`{}`)},
	}}}))
	c := st.Calls[0]
	require.True(t, c.Local)
	require.Equal(t, "web_search", c.Name, "made safe for the receipt")
	require.Equal(t, "", c.Version, "but never matched to the enabled tool")
	require.Equal(t, envelope.CodePolicyDenied, c.Envelope.Error.Code)
	require.Contains(t, c.Envelope.Error.Message, `"web.search"`)
	// The only call is answered: the run moves on to its next iteration.
	require.Equal(t, PhaseAwaitingVerdict, st.Phase)
	require.Equal(t, 2, st.Iteration)
	require.Equal(t, envelope.RoleTool, st.Messages[len(st.Messages)-1].Role)
}

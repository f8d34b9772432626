package scripted_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, options, err string
	}{
		{"missing", ``, "options.script is required"},
		{"not json", `{`, "options"},
		{"no turns", `{"script":[]}`, "no turns"},
		{"empty turn", `{"script":[{}]}`, "script[0] has neither content nor tool_calls"},
		{"nameless call", `{"script":[{"tool_calls":[{"arguments":{}}]}]}`, "script[0].tool_calls[0] has no name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := scripted.Parse(json.RawMessage(tc.options))
			require.ErrorContains(t, err, tc.err)
		})
	}
	s, err := scripted.Parse(json.RawMessage(`{"script":[{"content":"hi"}]}`))
	require.NoError(t, err)
	require.Equal(t, "hi", s.Turns[0].Content)
}

func TestProviderPlaysTurnsByConversation(t *testing.T) {
	opts := json.RawMessage(`{"script":[{"tool_calls":[{"name":"echo","arguments":{"text":"a"}},{"name":"echo"}]},{"content":"done"}]}`)
	p := scripted.Provider{}
	req := provider.Request{Iteration: 1, Model: envelope.Model{Provider: "scripted", Options: opts},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "go"}}}
	r1, err := p.Complete(t.Context(), req)
	require.NoError(t, err)
	require.Len(t, r1.ToolCalls, 2)
	require.Equal(t, "call_1_1", r1.ToolCalls[0].ID)
	require.JSONEq(t, `{}`, string(r1.ToolCalls[1].Arguments))
	require.Equal(t, "tool_use", r1.StopReason)

	// The same conversation gives the same answer (replays and retries).
	again, err := p.Complete(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, r1, again)

	req.Iteration = 2
	req.Messages = append(req.Messages, envelope.Message{Role: envelope.RoleAssistant, ToolCalls: r1.ToolCalls})
	r2, err := p.Complete(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, "done", r2.Content)
	require.Empty(t, r2.ToolCalls)
}

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

// TestToolControls: the scripted model honours tool_choice and parallel
// tool calls as a real model must, and says what a script contradicts.
func TestToolControls(t *testing.T) {
	opts := json.RawMessage(`{"script":[{"content":"thinking","tool_calls":[{"name":"echo","arguments":{"a":1}},{"name":"now"}]}]}`)
	calls := json.RawMessage(`{"script":[{"tool_calls":[{"name":"echo"}]}]}`)
	text := json.RawMessage(`{"script":[{"content":"hi"}]}`)
	no := false
	for _, tc := range []struct {
		name     string
		options  json.RawMessage
		choice   string
		parallel *bool
		calls    []string
		err      string
	}{
		{"auto", opts, "", nil, []string{"echo", "now"}, ""},
		{"none drops the calls", opts, envelope.ToolChoiceNone, nil, nil, ""},
		{"none with calls only", calls, envelope.ToolChoiceNone, nil, nil, "which tool_choice none forbids"},
		{"required", opts, envelope.ToolChoiceRequired, nil, []string{"echo", "now"}, ""},
		{"required without a call", text, envelope.ToolChoiceRequired, nil, nil, "calls no tool"},
		{"named", opts, "echo", nil, []string{"echo", "now"}, ""},
		{"named, another first", opts, "now", nil, nil, "does not call now first"},
		{"one call at a time", opts, "", &no, []string{"echo"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := provider.Request{Model: envelope.Model{Provider: "scripted", Options: tc.options}, Iteration: 1,
				ToolChoice: tc.choice, ParallelToolCalls: tc.parallel}
			resp, err := scripted.Provider{}.Complete(t.Context(), req)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			var names []string
			for _, c := range resp.ToolCalls {
				names = append(names, c.Name)
			}
			require.Equal(t, tc.calls, names)
		})
	}
}

// TestStream: the streamed pieces add up to the answer Complete gives.
func TestStream(t *testing.T) {
	req := provider.Request{Model: envelope.Model{Provider: "scripted",
		Options: json.RawMessage(`{"script":[{"content":"a longer answer than one piece holds, in pieces","tool_calls":[{"name":"echo","arguments":{"text":"hello there"}}]}]}`)}, Iteration: 1}
	want, err := scripted.Provider{}.Complete(t.Context(), req)
	require.NoError(t, err)
	var text, args string
	var id, name string
	n := 0
	got, err := scripted.Provider{}.Stream(t.Context(), req, func(d provider.Delta) {
		n++
		text += d.Text
		if d.ToolCall != nil {
			id, name = id+d.ToolCall.ID, name+d.ToolCall.Name
			args += d.ToolCall.Arguments
		}
	})
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Greater(t, n, 3)
	require.Equal(t, want.Content, text)
	require.Equal(t, want.ToolCalls[0].ID, id)
	require.Equal(t, "echo", name)
	require.JSONEq(t, string(want.ToolCalls[0].Arguments), args)
}

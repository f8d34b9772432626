package provider_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// TestChunks: the pieces add up to the answer, none is longer than asked
// or cuts a rune.
func TestChunks(t *testing.T) {
	resp := envelope.ModelResponse{Content: "Grüße aus Köln, 東京 und überall — " + strings.Repeat("x", 40),
		ToolCalls: []envelope.ToolCall{{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"text":"héllo wörld, a long argument"}`)}, {ID: "c2", Name: "now", Arguments: json.RawMessage(`{}`)}}}
	for _, size := range []int{1, 3, 16, 1000} {
		var text strings.Builder
		args := map[int]*strings.Builder{}
		ids := map[int]string{}
		n := 0
		provider.Chunks(resp, size, func(d provider.Delta) {
			n++
			if d.ToolCall == nil {
				require.LessOrEqual(t, len(d.Text), max(size, 4))
				require.True(t, utf8.ValidString(d.Text), "whole runes: %q", d.Text)
				text.WriteString(d.Text)
				return
			}
			if d.ToolCall.ID != "" {
				ids[d.ToolCall.Index] = d.ToolCall.ID + "/" + d.ToolCall.Name
				args[d.ToolCall.Index] = &strings.Builder{}
			}
			args[d.ToolCall.Index].WriteString(d.ToolCall.Arguments)
		})
		require.Equal(t, resp.Content, text.String(), size)
		require.Equal(t, map[int]string{0: "c1/echo", 1: "c2/now"}, ids)
		require.JSONEq(t, string(resp.ToolCalls[0].Arguments), args[0].String())
		require.JSONEq(t, string(resp.ToolCalls[1].Arguments), args[1].String())
		if size == 1 {
			require.Greater(t, n, 40)
		}
	}
}

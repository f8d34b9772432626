package replay_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/replay"
)

func TestProvider(t *testing.T) {
	b := envelope.ReplayBundle{RunID: "rec-1", Turns: []envelope.ModelTurn{
		{Iteration: 1, Response: envelope.ModelResponse{ToolCalls: []envelope.ToolCall{{ID: "call_1", Name: "echo", Arguments: json.RawMessage(`{"text":"a"}`)}},
			StopReason: "tool_calls", Usage: envelope.Usage{InputTokens: 10, OutputTokens: 5}}},
		{Iteration: 2, Response: envelope.ModelResponse{Content: "done", StopReason: "stop"}},
	}}
	p, err := replay.New(b)
	require.NoError(t, err)
	require.Equal(t, 2, p.Turns())
	ctx := t.Context()
	r1, err := p.Complete(ctx, provider.Request{RunID: "replayed", Iteration: 1})
	require.NoError(t, err)
	require.Equal(t, b.Turns[0].Response, r1)
	r1.ToolCalls[0].Name = "changed"
	again, err := p.Complete(ctx, provider.Request{RunID: "replayed", Iteration: 1})
	require.NoError(t, err)
	require.Equal(t, "echo", again.ToolCalls[0].Name, "a caller cannot change the recording")
	r2, err := p.Complete(ctx, provider.Request{Iteration: 2})
	require.NoError(t, err)
	require.Equal(t, "done", r2.Content)
	_, err = p.Complete(ctx, provider.Request{Iteration: 3})
	require.ErrorIs(t, err, replay.ErrDiverged)
	require.ErrorContains(t, err, "the recorded run made no model call at iteration 3 (it recorded 2, the last at iteration 2)")

	for _, tc := range []struct {
		turns []envelope.ModelTurn
		err   string
	}{
		{nil, "the bundle holds no model turn"},
		{[]envelope.ModelTurn{{Iteration: 0}}, "turns[0] has iteration 0"},
		{[]envelope.ModelTurn{{Iteration: 1}, {Iteration: 1}}, "two turns of iteration 1"},
	} {
		_, err := replay.New(envelope.ReplayBundle{RunID: "rec-2", Turns: tc.turns})
		require.ErrorContains(t, err, tc.err)
	}
}

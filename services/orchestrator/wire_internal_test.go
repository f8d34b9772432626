package orchestrator

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

func TestApplyTurnRecordsCostsAndUsageNumbers(t *testing.T) {
	s := &Service{cfg: Config{Prices: Prices{"m": {InputPerMTok: 2, OutputPerMTok: 10}}}.withDefaults()}
	st := &RunState{RunID: "r1", Iteration: 1, Request: envelope.RunRequest{Agent: envelope.Agent{
		Model: envelope.Model{Provider: "openai", Name: "m"}, EnabledTools: []string{"echo@1.0.0"}}}}
	turn := envelope.ModelTurn{Iteration: 1, Model: st.Request.Agent.Model, Response: envelope.ModelResponse{
		ToolCalls: []envelope.ToolCall{
			{ID: "a", Name: "echo", Arguments: json.RawMessage(`{"text":"x"}`)},
			{ID: "b", Name: "no such.tool", Arguments: json.RawMessage(`{broken`)},
		},
		Usage: envelope.Usage{InputTokens: 1000, OutputTokens: 100}}}
	require.NoError(t, s.applyTurn(st, turn))
	require.Equal(t, []TurnUsage{{Iteration: 1, InputTokens: 1000, OutputTokens: 100, Cost: 0.003, UsageN: 1}}, st.TurnUsage)
	require.InDelta(t, 0.003, st.Spend, 1e-15)
	require.Equal(t, 2, st.Calls[1].UsageN, "the call answered at once has its usage number")
	require.Zero(t, st.Calls[0].UsageN, "the other gets one when its envelope arrives")
	require.Equal(t, 2, st.NextUsage)
	require.JSONEq(t, `"{broken"`, string(st.Turns[0].Response.ToolCalls[1].Arguments), "the state always encodes")
	_, err := json.Marshal(st)
	require.NoError(t, err)
	require.Nil(t, st.Claim)

	// The envelope arrives: billed at the tool's cost unless it never ran.
	st.Calls[0].Cost = 0.5
	env := envelope.ToolEnvelope{CallID: st.Calls[0].CallID, Output: json.RawMessage(`{}`)}
	require.True(t, billable(&st.Calls[0], &env))
	st.Calls[0].Billed, st.Calls[0].Envelope = true, &env
	st.recomputeSpend()
	require.InDelta(t, 0.503, st.Spend, 1e-15)
	for code, billed := range map[envelope.ErrorCode]bool{
		envelope.CodePolicyDenied: false, envelope.CodeValidation: false, envelope.CodeAuthRequired: false, envelope.CodeRateLimit: false,
		envelope.CodeTimeout: true, envelope.CodeProviderError: true, envelope.CodeNetworkError: true, envelope.CodeSandboxError: true, envelope.CodeUnknown: true,
	} {
		e := envelope.ToolEnvelope{Error: &envelope.ToolError{Code: code, Message: "x"}}
		require.Equal(t, billed, billable(&st.Calls[0], &e), code)
	}
	require.False(t, billable(&st.Calls[0], &envelope.ToolEnvelope{Cached: true}), "a cached result costs nothing")
	require.False(t, billable(&st.Calls[1], &envelope.ToolEnvelope{}), "nor does a call no tool answered")
}

func TestSpendAtIsWhatTheBatchSaw(t *testing.T) {
	st := &RunState{
		TurnUsage: []TurnUsage{{Iteration: 1, Cost: 1}, {Iteration: 2, Cost: 10}, {Iteration: 3, Cost: 100}},
		Calls: []CallState{
			{Iteration: 1, Cost: 0.1, Billed: true}, {Iteration: 1, Cost: 0.2},
			{Iteration: 2, Cost: 0.4, Billed: true}, {Iteration: 3, Cost: 0.8, Billed: true},
		},
	}
	require.InDelta(t, 1.0, st.spendAt(1), 1e-12)
	require.InDelta(t, 11.1, st.spendAt(2), 1e-12)
	require.InDelta(t, 111.5, st.spendAt(3), 1e-12)
	st.recomputeSpend()
	require.InDelta(t, 112.3, st.Spend, 1e-12)
}

func TestTraceIDOfMatchesTheEventsPackage(t *testing.T) {
	for _, tp := range []string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"", "garbage", "00-xyz-00f067aa0ba902b7-01",
	} {
		rt := events.RunTrace{TraceParent: tp}
		require.Equal(t, rt.TraceID(), traceIDOf(rt), tp)
	}
}

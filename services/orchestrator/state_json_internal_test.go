package orchestrator

import (
	"encoding/json"
	"testing"

	fastjson "github.com/segmentio/encoding/json"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// richState holds every kind of field a run state has: request with
// options, messages with tool calls, calls with and without envelopes (an
// error, an output, attachments), turns, outputs, pinned handles, usage,
// a claim, times, HTML characters and non-ASCII text.
const richState = `{
 "run_id": "run-1", "phase": "awaiting_envelopes", "iteration": 2,
 "request": {"run_id": "run-1", "tenant": {"org_id": "acme", "workspace_id": "w"},
  "agent": {"name": "researcher", "model": {"provider": "scripted", "name": "m", "options": {"script": [{"content": "<done> & \"quoted\""}]}},
   "enabled_tools": ["echo@1.0.0"], "policy": {"max_tool_calls": 64, "max_budget": 0.025}},
  "messages": [{"role": "user", "content": "héllo ✓ \u2028"}]},
 "messages": [{"role": "user", "content": "go"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "1"}}]}],
 "calls": [
  {"seq": 1, "iteration": 1, "call_id": "ab", "name": "echo", "version": "1.0.0", "provider_call_id": "c1",
   "input": {"text": "1"}, "cost": 0.01, "billed": true, "usage_n": 2,
   "envelope": {"call_id": "ab", "name": "echo", "version": "1.0.0", "input": {"text": "1"}, "output": {"text": "1", "n": 1e21},
    "t_start": "2026-01-02T03:04:05.123456789Z", "t_end": "2026-01-02T03:04:05.2Z", "cached": false, "truncated": false}},
  {"seq": 2, "iteration": 1, "call_id": "cd", "name": "web_fetch", "version": "2.0.0", "provider_call_id": "c2",
   "input": {"url": "https://example.com/?a=1&b=<2>"}, "approval": "resumed", "resumed_by": "approval",
   "envelope": {"call_id": "cd", "name": "web_fetch", "version": "2.0.0", "input": {"url": "x"},
    "error": {"code": "TIMEOUT", "message": "took > 5s", "retry_after_s": 2},
    "t_start": "2026-01-02T03:04:05Z", "t_end": "2026-01-02T03:04:10Z", "cached": false, "truncated": true}},
  {"seq": 3, "iteration": 1, "call_id": "ef", "name": "nope", "version": "", "provider_call_id": "c3", "input": null, "local": true}],
 "turns": [{"iteration": 1, "model": {"provider": "scripted", "name": "m"}, "messages": [{"role": "user", "content": "go"}],
  "tools": ["echo@1.0.0"], "response": {"content": "", "tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "1"}}]},
  "t_start": "2026-01-02T03:04:04Z", "t_end": "2026-01-02T03:04:04.5Z"}],
 "trace": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
 "warnings": ["tool x is deprecated"], "response": "", "reason": "", "spend": 0.0123456789,
 "turn_usage": [{"iteration": 1, "input_tokens": 12, "output_tokens": 3, "cost": 0.0001, "usage_n": 1}],
 "next_usage": 2, "claim": {"iteration": 2, "attempts": 1, "owner": "o-1", "until": "2026-01-02T03:05:00Z"},
 "started_at": "2026-01-02T03:04:03Z", "updated_at": "2026-01-02T03:04:10.5Z"
}`

// The state store's encoder and decoder (segmentio's) read and write a run
// state exactly as encoding/json does.
func TestStateJSONIsEncodingJSON(t *testing.T) {
	var want, got RunState
	require.NoError(t, json.Unmarshal([]byte(richState), &want))
	require.NoError(t, fastjson.Unmarshal([]byte(richState), &got))
	require.Equal(t, want, got)
	require.Len(t, want.Calls, 3)
	require.NotNil(t, want.Calls[1].Envelope.Error)

	done := want
	done.Phase, done.Response = PhaseCompleted, "<done> & \"quoted\""
	o := envelope.NewAgentOutputs(done.Response, []envelope.ToolEnvelope{*want.Calls[0].Envelope, *want.Calls[1].Envelope}, "trace")
	done.Outputs = &o
	done.Pinned = map[string]*envelope.ToolEnvelope{"last_search": want.Calls[0].Envelope}
	s, err := json.Marshal(done)
	require.NoError(t, err)
	f, err := fastjson.Marshal(done)
	require.NoError(t, err)
	require.Equal(t, string(s), string(f))
	var back RunState
	require.NoError(t, fastjson.Unmarshal(f, &back))
	var backStd RunState
	require.NoError(t, json.Unmarshal(s, &backStd))
	require.Equal(t, backStd, back)
}

package orchestrator

import (
	"encoding/json"
	"testing"

	fastjson "github.com/segmentio/encoding/json"
	"github.com/stretchr/testify/require"
)

// richState holds every kind of field a run state has: the request's
// essentials, pending calls in every state, a denial, times, HTML characters
// and non-ASCII text.
const richState = `{
 "v": 2, "run_id": "run-1", "phase": "awaiting_tools", "iteration": 2,
 "tenant": {"org_id": "acme", "workspace_id": "w"}, "agent": "researcher <héllo> & \"q\"",
 "model": {"provider": "scripted", "name": "m"},
 "policy": {"max_tool_calls": 64, "max_budget": 0.025, "scopes": ["mail:read"]},
 "enabled_tools": ["echo@1.0.0", "web_fetch@2.0.0"],
 "trace": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
 "calls": 3, "spend": 0.0123456789, "last_tokens": 15,
 "pending": [
  {"call_id": "ab", "seq": 2, "name": "echo", "version": "1.0.0", "provider_call_id": "c1", "done": true},
  {"call_id": "cd", "seq": 3, "name": "web_fetch", "version": "2.0.0", "provider_call_id": "c2", "done": true, "error": true,
   "approval": "resumed", "resumed_by": "call cd (web_fetch@2.0.0) approved ✓ \u2028"},
  {"call_id": "ef", "seq": 4, "name": "nope", "approval": "waiting"}],
 "denied": {"allowed": false, "code": "POLICY_DENIED", "reason": "max_iterations (2) reached", "rule": "max_iterations"},
 "reason": "policy denied iteration 3", "code": "POLICY_DENIED",
 "started_at": "2026-01-02T03:04:03Z", "updated_at": "2026-01-02T03:04:10.5Z", "deadline": "2026-01-02T03:34:03Z"
}`

// The state store's encoder and decoder (segmentio's) read and write a run
// state exactly as encoding/json does.
func TestStateJSONIsEncodingJSON(t *testing.T) {
	var want, got RunState
	require.NoError(t, json.Unmarshal([]byte(richState), &want))
	require.NoError(t, fastjson.Unmarshal([]byte(richState), &got))
	require.Equal(t, want, got)
	require.Len(t, want.Pending, 3)
	require.True(t, want.Pending[1].Error)
	require.Equal(t, "max_iterations", want.Denied.Rule)

	s, err := json.Marshal(want)
	require.NoError(t, err)
	f, err := fastjson.Marshal(want)
	require.NoError(t, err)
	require.Equal(t, string(s), string(f))
	var back RunState
	require.NoError(t, fastjson.Unmarshal(f, &back))
	var backStd RunState
	require.NoError(t, json.Unmarshal(s, &backStd))
	require.Equal(t, backStd, back)
	require.Equal(t, want, back)
}

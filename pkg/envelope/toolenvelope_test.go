package envelope_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestNewAgentOutputs(t *testing.T) {
	envs := fixtureEnvelopes(t)
	ok1, ok2, failed := envs[0], envs[3], envs[4]
	failed2 := failed
	failed2.CallID = mustCallID(t, "web_search", "1.2.0", `{"query":"again"}`, 6)

	tests := []struct {
		name    string
		ordered []envelope.ToolEnvelope
		last    *envelope.ToolEnvelope
	}{
		{"none", nil, nil},
		{"one success", envs[:1], &ok1},
		{"last is a failure", envs, &ok2},
		{"last is a success", envs[:4], &ok2},
		{"only failures", []envelope.ToolEnvelope{failed, failed2}, nil},
		{"success between failures", []envelope.ToolEnvelope{failed, ok1, failed2}, &ok1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := envelope.NewAgentOutputs("answer", tc.ordered, "https://traces.example.com/t/1")
			require.Equal(t, "answer", out.Response)
			require.Equal(t, "https://traces.example.com/t/1", out.TracesURL)
			require.NotNil(t, out.ToolsByID)
			require.NotNil(t, out.ToolOrder)
			require.Len(t, out.ToolOrder, len(tc.ordered))
			require.Len(t, out.ToolsByID, len(tc.ordered))
			for i, e := range tc.ordered {
				require.Equal(t, e.CallID, out.ToolOrder[i], "chronological order")
				require.Equal(t, e, out.ToolsByID[e.CallID])
			}
			require.Equal(t, tc.last, out.LastTool)
			if out.LastTool != nil {
				require.True(t, out.LastTool.OK())
			}
		})
	}

	t.Run("last tool is a copy", func(t *testing.T) {
		in := []envelope.ToolEnvelope{ok1}
		out := envelope.NewAgentOutputs("", in, "")
		in[0].Name = "changed"
		require.Equal(t, "web_search", out.LastTool.Name)
		require.Equal(t, "web_search", out.ToolsByID[ok1.CallID].Name)
	})
}

func TestAgentOutputsJSON(t *testing.T) {
	tests := []struct {
		name string
		out  envelope.AgentOutputs
		want string
	}{
		{"zero value", envelope.AgentOutputs{}, `{"response":"","output":null,"tools_by_id":{},"tool_order":[]}`},
		{"no calls", envelope.NewAgentOutputs("hi", nil, ""), `{"response":"hi","output":null,"tools_by_id":{},"tool_order":[]}`},
		{"empty slices", envelope.NewAgentOutputs("", []envelope.ToolEnvelope{}, "http://t/1"), `{"response":"","output":null,"tools_by_id":{},"tool_order":[],"traces_url":"http://t/1"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.out)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(b))
			p, err := json.Marshal(&tc.out)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(p), "pointer marshals the same")
		})
	}

	t.Run("round trip", func(t *testing.T) {
		envs := fixtureEnvelopes(t)
		out := envelope.NewAgentOutputs("It is sunny.", envs, "https://traces.example.com/t/1")
		b, err := json.Marshal(out)
		require.NoError(t, err)

		var back envelope.AgentOutputs
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, out.ToolOrder, back.ToolOrder)
		require.Equal(t, out.LastTool.CallID, back.LastTool.CallID)
		for id, e := range out.ToolsByID {
			got := back.ToolsByID[id]
			require.JSONEq(t, string(e.Input), string(got.Input))
			require.True(t, e.TStart.Equal(got.TStart))
			require.Equal(t, e.Cached, got.Cached)
			require.Equal(t, e.Truncated, got.Truncated)
			require.Equal(t, e.Attachments, got.Attachments)
		}
		failed := back.ToolsByID[envs[4].CallID]
		require.NotNil(t, failed.Error)
		require.Equal(t, envelope.CodeRateLimit, failed.Error.Code)
		require.Equal(t, 12.5, failed.Error.RetryAfterS)
		require.Equal(t, map[string]any{"limit": float64(60), "window": "1m"}, failed.Error.Details)
		require.Nil(t, failed.Output)

		// Marshalling the decoded value gives the same document.
		again, err := json.Marshal(back)
		require.NoError(t, err)
		require.JSONEq(t, string(b), string(again))
	})
}

func TestToolEnvelopeJSON(t *testing.T) {
	e := fixtureEnvelopes(t)[1]
	b, err := json.Marshal(e)
	require.NoError(t, err)
	require.JSONEq(t, `{
		"call_id": "`+e.CallID+`",
		"name": "calculator",
		"version": "2.0.0",
		"input": {"expr": "1+1"},
		"output": 2,
		"t_start": "2025-03-14T09:26:55.589793Z",
		"t_end": "2025-03-14T09:26:55.839793Z",
		"cached": true
	}`, string(b))

	// The run of the tool, when it is not the first: a retry of an
	// idempotent writes tool.
	e.Attempt = 2
	b, err = json.Marshal(e)
	require.NoError(t, err)
	require.Contains(t, string(b), `"attempt":2`)
	require.NoError(t, newSchemas(t).Validate(envelope.SchemaToolEnvelope, b))

	var bare envelope.ToolEnvelope
	b, err = json.Marshal(bare)
	require.NoError(t, err)
	require.JSONEq(t, `{"call_id":"","name":"","version":"","input":null,"t_start":"0001-01-01T00:00:00Z","t_end":"0001-01-01T00:00:00Z"}`, string(b))
}

func TestToolEnvelopeHelpers(t *testing.T) {
	envs := fixtureEnvelopes(t)
	require.True(t, envs[0].OK())
	require.False(t, envs[4].OK())
	var nilEnv *envelope.ToolEnvelope
	require.False(t, nilEnv.OK())
	require.Equal(t, 250*time.Millisecond, envs[0].Latency())
	require.Equal(t, "http_request@1.0.0-rc.1", envs[2].ToolRef())
}

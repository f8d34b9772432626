// Package demo holds the demo agent run of `toolwire dev --demo`: the scripted
// model asks for three tools at once, then makes one call that fails
// validation, then answers.
package demo

import (
	"encoding/json"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Response is the demo model's final answer.
const Response = "I echoed your greeting, computed (2+3)*7 = 35 and read the clock. " +
	"My second calculator call passed a number where the tool wants a string, so it was rejected by validation."

// Request returns the demo run request for runID.
func Request(runID string) envelope.RunRequest {
	script := map[string]any{"script": []any{
		map[string]any{"tool_calls": []any{
			map[string]any{"name": "echo", "arguments": map[string]any{"text": "hello from toolwire"}},
			map[string]any{"name": "calculator", "arguments": map[string]any{"expression": "(2+3)*7"}},
			map[string]any{"name": "get_current_time", "arguments": map[string]any{"format": "iso8601", "timezone": "UTC"}},
		}},
		map[string]any{"tool_calls": []any{
			map[string]any{"name": "calculator", "arguments": map[string]any{"expression": 42}},
		}},
		map[string]any{"content": Response},
	}}
	opts, _ := json.Marshal(script)
	return envelope.RunRequest{
		RunID:  runID,
		Tenant: envelope.Tenant{OrgID: "demo-org", WorkspaceID: "demo-ws", UserID: "demo-user"},
		Agent: envelope.Agent{
			Name:         "demo-agent",
			Model:        envelope.Model{Provider: "scripted", Name: "scripted-demo", Options: opts},
			SystemPrompt: "You are a helpful assistant with tools.",
			EnabledTools: []string{"echo@1.0.0", "calculator@1.0.0", "get_current_time@1.0.0"},
			Policy:       envelope.Policy{MaxIterations: 5, MaxToolCalls: 10},
			PinnedHandles: []envelope.PinnedHandle{
				{Name: "calc_result", Selector: envelope.PinSelector{Tool: "calculator", Strategy: envelope.PinFirstSuccess}},
				{Name: "web_search_result", Selector: envelope.PinSelector{Tool: "web_search"}, OnMissing: envelope.MissingNull},
			},
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Say hello, compute (2+3)*7 and tell me the time."}},
	}
}

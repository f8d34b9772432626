package envelope_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// t0 is the fixed start of every fixture run.
var t0 = time.Date(2025, 3, 14, 9, 26, 53, 589793000, time.UTC)

// fixedZone is a non-UTC offset, to check timestamps that are not in Z.
var fixedZone = time.FixedZone("CET", 3600)

// mustCallID computes a call id or fails the test.
func mustCallID(t testing.TB, name, version, input string, seq int) string {
	t.Helper()
	id, err := envelope.CallID(name, version, []byte(input), seq)
	require.NoError(t, err)
	return id
}

// env builds a successful envelope whose call id is computed from its input.
func env(t testing.TB, name, version, input, output string, seq int) envelope.ToolEnvelope {
	t.Helper()
	start := t0.Add(time.Duration(seq) * time.Second)
	e := envelope.ToolEnvelope{
		CallID:  mustCallID(t, name, version, input, seq),
		Name:    name,
		Version: version,
		Input:   json.RawMessage(input),
		TStart:  start,
		TEnd:    start.Add(250 * time.Millisecond),
	}
	if output != "" {
		e.Output = json.RawMessage(output)
	}
	return e
}

// fixtureEnvelopes is a run's envelopes in chronological order: a success, a
// cached success, a truncated success with a blob, an image attachment, and a
// failure with details and a retry hint (the last call).
func fixtureEnvelopes(t testing.TB) []envelope.ToolEnvelope {
	t.Helper()
	search := env(t, "web_search", "1.2.0", `{"query":"weather in Paris","limit":3}`, `{"results":[{"title":"Paris","url":"https://example.com/paris"}]}`, 1)

	calc := env(t, "calculator", "2.0.0", `{"expr":"1+1"}`, `2`, 2)
	calc.Cached = true

	fetch := env(t, "http_request", "1.0.0-rc.1", `{"url":"https://example.com/big","method":"GET"}`, `"<html>…truncated"`, 3)
	fetch.Truncated = true
	fetch.Attachments = []envelope.Attachment{{
		Kind:        envelope.AttachmentBlob,
		URL:         "nats-os://TOOLWIRE_BLOBS/run-1/" + fetch.CallID,
		ContentType: "text/html",
		Bytes:       3 << 20,
	}}

	chart := env(t, "plot", "0.3.1", `{"series":[1,2,3]}`, `{"ok":true}`, 4)
	chart.Attachments = []envelope.Attachment{
		{Kind: envelope.AttachmentImage, URL: "https://blobs.example.com/chart.png", ContentType: "image/png", Bytes: 1234},
		{Kind: envelope.AttachmentTable, URL: "/v1/blobs/table-1"},
	}

	failed := env(t, "web_search", "1.2.0", `{"query":"weather in Paris","limit":30}`, "", 5)
	failed.Error = envelope.NewToolError(envelope.CodeRateLimit, "quota of %d calls per minute exceeded", 60).
		WithDetails(map[string]any{"limit": 60, "window": "1m"})
	failed.Error.RetryAfterS = 12.5

	return []envelope.ToolEnvelope{search, calc, fetch, chart, failed}
}

// fixturePins covers every strategy and on_missing behaviour.
func fixturePins(t testing.TB, byCallID string) []envelope.PinnedHandle {
	t.Helper()
	return []envelope.PinnedHandle{
		{Name: "weather_report", Selector: envelope.PinSelector{Tool: "web_search"}},
		{Name: "first_search", Selector: envelope.PinSelector{Tool: "web_search", Strategy: envelope.PinFirstSuccess}, OnMissing: envelope.MissingError},
		{Name: "the_fetch", Selector: envelope.PinSelector{Tool: "http_request", Strategy: envelope.PinByCallID, CallID: byCallID}, OnMissing: envelope.MissingNull},
		{Name: "_old_tool", Selector: envelope.PinSelector{Tool: "disabled_tool", Strategy: envelope.PinLatest}, OnMissing: envelope.MissingStaleLastSuccess},
	}
}

func fixtureRunRequest(t testing.TB) envelope.RunRequest {
	t.Helper()
	temp := 0.2
	fetchID := mustCallID(t, "http_request", "1.0.0-rc.1", `{"url":"https://example.com/big","method":"GET"}`, 3)
	return envelope.RunRequest{
		RunID:  "run_2025-03-14_001",
		Tenant: envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "u-42"},
		Agent: envelope.Agent{
			Name: "researcher",
			Model: envelope.Model{
				Provider:    "scripted",
				Name:        "script-1",
				Temperature: &temp,
				MaxTokens:   1024,
				Options:     json.RawMessage(`{"script":[{"tool_calls":[{"name":"web_search"}]}]}`),
			},
			SystemPrompt: "You are a careful researcher.",
			EnabledTools: []string{"web_search@1.2.0", "calculator@2.0.0", "http_request@1.0.0-rc.1", "plot@0.3.1"},
			Policy: envelope.Policy{
				MaxIterations: 5,
				MaxToolCalls:  10,
				MaxBudget:     2.5,
				SideEffects:   envelope.SideEffectsReads,
				Scopes:        []string{"web:read"},
			},
			PinnedHandles: fixturePins(t, fetchID),
		},
		Messages: []envelope.Message{
			{Role: envelope.RoleSystem, Content: "Be brief."},
			{Role: envelope.RoleUser, Content: "What is the weather in Paris?"},
			{Role: envelope.RoleAssistant, ToolCalls: []envelope.ToolCall{{ID: "call_1", Name: "web_search", Arguments: json.RawMessage(`{"query":"weather in Paris"}`)}}},
			{Role: envelope.RoleTool, ToolCallID: "call_1", Name: "web_search", Content: `{"results":[]}`},
		},
		Metadata: map[string]string{"graph": "g-1", "node": "agent-3"},
	}
}

func fixtureToolDefinition() envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name:         "web_search",
		Version:      "1.2.0",
		Description:  "Searches the web.",
		InputSchema:  json.RawMessage(`{"type":"object","required":["query"],"properties":{"query":{"type":"string"},"limit":{"type":"integer"}}}`),
		OutputSchema: json.RawMessage(`{"type":"object"}`),
		Metadata: envelope.ToolMetadata{
			Category:    envelope.CategorySearch,
			SideEffects: envelope.SideEffectsReads,
			Cache:       envelope.CacheTTL,
			CacheTTLS:   300,
		},
		TimeoutMS: 5000,
		Implementation: envelope.Implementation{
			Kind:   envelope.ImplHTTP,
			Config: json.RawMessage(`{"url":"https://search.example.com/api","method":"POST"}`),
		},
	}
}

func fixtureReplayBundle(t testing.TB) envelope.ReplayBundle {
	t.Helper()
	req := fixtureRunRequest(t)
	envs := fixtureEnvelopes(t)
	outs := envelope.NewAgentOutputs("It is sunny in Paris.", envs, "https://traces.example.com/trace/4bf92f3577b34da6a3ce929d0e0e4736")
	calc := fixtureToolDefinition()
	calc.Name, calc.Version = "calculator", "2.0.0"
	calc.Metadata = envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheForever}
	calc.Implementation = envelope.Implementation{Kind: envelope.ImplBuiltin}
	calc.OutputSchema = nil
	calc.TimeoutMS = 0
	return envelope.ReplayBundle{
		RunID:   req.RunID,
		Request: req,
		Tools:   []envelope.ToolDefinition{fixtureToolDefinition(), calc},
		Turns: []envelope.ModelTurn{
			{
				Iteration: 1,
				Model:     req.Agent.Model,
				Messages:  req.Messages[:2],
				Tools:     []string{"web_search", "calculator"},
				Response: envelope.ModelResponse{
					ToolCalls:  []envelope.ToolCall{{ID: "call_1", Name: "web_search", Arguments: json.RawMessage(`{"query":"weather in Paris","limit":3}`)}},
					StopReason: "tool_use",
					Usage:      envelope.Usage{InputTokens: 120, OutputTokens: 30},
				},
				TStart: t0,
				TEnd:   t0.Add(800 * time.Millisecond),
			},
			{
				Iteration: 2,
				Model:     req.Agent.Model,
				Messages:  req.Messages,
				Response:  envelope.ModelResponse{Content: "It is sunny in Paris.", StopReason: "end_turn", Usage: envelope.Usage{InputTokens: 300, OutputTokens: 12}},
				TStart:    t0.Add(10 * time.Second),
				TEnd:      t0.Add(11 * time.Second),
			},
		},
		Envelopes: envs,
		Outputs:   &outs,
		Status:    "completed",
		Verdicts:  []envelope.IterationVerdict{{Iteration: 1, Allowed: true}, {Iteration: 2, Allowed: true}},
	}
}

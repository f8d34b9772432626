package anthropic_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/anthropic"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
)

// Replies in the Messages API wire format
// (https://docs.anthropic.com/en/api/messages, tool use:
// https://docs.anthropic.com/en/docs/build-with-claude/tool-use).
const (
	anthropicToolUse = `{
  "id": "msg_01Aq9w938a90dw8q",
  "type": "message",
  "role": "assistant",
  "model": "claude-sonnet-4-5-20250929",
  "content": [
    {"type": "text", "text": "I'll echo and compute at once."},
    {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "echo", "input": {"text": "hi"}},
    {"type": "tool_use", "id": "toolu_01B19q90qw90lq917835lq8", "name": "calculator", "input": {"expression": 42}}
  ],
  "stop_reason": "tool_use",
  "stop_sequence": null,
  "usage": {"input_tokens": 472, "output_tokens": 91, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "service_tier": "standard"}
}`
	anthropicFinal = `{
  "id": "msg_01Aq9w938a90dw8r",
  "type": "message",
  "role": "assistant",
  "model": "claude-sonnet-4-5-20250929",
  "content": [{"type": "text", "text": "hi, and 42 is not an expression."}],
  "stop_reason": "end_turn",
  "stop_sequence": null,
  "usage": {"input_tokens": 650, "output_tokens": 14, "cache_creation_input_tokens": 10, "cache_read_input_tokens": 100}
}`
	anthropicRateLimited = `{"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}`
	anthropicOverloaded  = `{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}`
)

func anthropicRequest(msgs []envelope.Message) provider.Request {
	return providertest.Turn(envelope.Model{Provider: "anthropic", Name: "claude-sonnet-4-5"}, msgs)
}

// The round trip of one turn: the registry's tool definitions become tools,
// two tool_use blocks come back, and their results go back in ONE user
// message with a tool_result block per call, in call order, the failed one
// with is_error.
func TestAnthropicWireRoundTrip(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Body: anthropicToolUse}, providertest.Reply{Body: anthropicFinal})
	p := anthropic.New(provider.Config{APIKey: "sk-ant-test", BaseURL: f.URL})

	msgs := providertest.Question()
	resp, err := p.Complete(t.Context(), anthropicRequest(msgs))
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{
		Content:    "I'll echo and compute at once.",
		StopReason: "tool_use",
		ToolCalls:  providertest.Calls("toolu_01A09q90qw90lq917835lq9", "toolu_01B19q90qw90lq917835lq8"),
		Usage:      envelope.Usage{InputTokens: 472, OutputTokens: 91},
	}, resp)

	first := f.Requests()[0]
	require.Equal(t, http.MethodPost, first.Method)
	require.Equal(t, "/v1/messages", first.Path)
	// SDK v2 (API version 2026-10-21) sends the key as a bearer token.
	require.Equal(t, "Bearer sk-ant-test", first.Header.Get("Authorization"))
	require.NotEmpty(t, first.Header.Get("Anthropic-Version"))
	require.Equal(t, providertest.JSON(t, `{
	  "model": "claude-sonnet-4-5",
	  "max_tokens": 4096,
	  "system": [{"type": "text", "text": "Be brief."}],
	  "messages": [{"role": "user", "content": [{"type": "text", "text": "Echo hi and compute 42."}]}],
	  "tools": [
	    {"name": "echo", "description": "Returns its input text.",
	      "input_schema": {"type": "object", "properties": {"text": {"type": "string", "description": "The text to return."}},
	        "required": ["text"], "additionalProperties": false}},
	    {"name": "calculator", "description": "Evaluates an arithmetic expression.",
	      "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}
	  ]
	}`), first.Body)

	msgs = providertest.WithResults(msgs, resp, `{"error":{"code":"RATE_LIMIT","message":"slow down","retry_after_s":2}}`)
	req := anthropicRequest(msgs)
	req.Iteration = 2
	resp, err = p.Complete(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{Content: "hi, and 42 is not an expression.", StopReason: "end_turn",
		Usage: envelope.Usage{InputTokens: 760, OutputTokens: 14}}, resp, "cache writes and reads count as input")

	second := f.Requests()[1]
	require.Equal(t, providertest.JSON(t, `[
	  {"role": "user", "content": [{"type": "text", "text": "Echo hi and compute 42."}]},
	  {"role": "assistant", "content": [
	    {"type": "text", "text": "I'll echo and compute at once."},
	    {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "echo", "input": {"text": "hi"}},
	    {"type": "tool_use", "id": "toolu_01B19q90qw90lq917835lq8", "name": "calculator", "input": {"expression": 42}}
	  ]},
	  {"role": "user", "content": [
	    {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9", "is_error": false,
	      "content": [{"type": "text", "text": "{\"text\":\"hi\"}"}]},
	    {"type": "tool_result", "tool_use_id": "toolu_01B19q90qw90lq917835lq8", "is_error": true,
	      "content": [{"type": "text", "text": "{\"error\":{\"code\":\"RATE_LIMIT\",\"message\":\"slow down\",\"retry_after_s\":2}}"}]}
	  ]}
	]`), second.Body["messages"])
	require.Equal(t, providertest.JSON(t, `[{"type": "text", "text": "Be brief."}]`), second.Body["system"])
}

func TestAnthropicWireModelSettings(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Body: anthropicFinal})
	p := anthropic.New(provider.Config{APIKey: "k", BaseURL: f.URL})
	temp := 0.5
	_, err := p.Complete(t.Context(), provider.Request{Iteration: 1,
		Model: envelope.Model{Provider: "anthropic", Name: "claude-haiku-4-5", Temperature: &temp, MaxTokens: 300},
		Messages: []envelope.Message{
			{Role: envelope.RoleUser, Content: "a"},
			{Role: envelope.RoleUser, Content: "b"},
			{Role: envelope.RoleAssistant},
		}})
	require.NoError(t, err)
	require.Equal(t, providertest.JSON(t, `{"model": "claude-haiku-4-5", "max_tokens": 300, "temperature": 0.5,
		"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}`),
		f.Requests()[0].Body, "consecutive user messages merge; an empty assistant message is left out; no system, no tools")
}

func TestAnthropicWireFailures(t *testing.T) {
	providertest.CheckFailures(t, []providertest.Failure{
		{Name: "429 then success waits Retry-After", Retries: 3,
			Replies: []providertest.Reply{
				{Status: http.StatusTooManyRequests, Headers: map[string]string{"Retry-After": "1", "Request-Id": "req_011"}, Body: anthropicRateLimited},
				{Body: anthropicFinal}},
			Attempts: 2, MinGap: time.Second},
		{Name: "529 overloaded until retries run out", Retries: 1,
			Replies:  []providertest.Reply{{Status: 529, Headers: map[string]string{"Retry-After": "0"}, Body: anthropicOverloaded}},
			Attempts: 2, Err: []string{"anthropic model claude-sonnet-4-5 failed after 2 attempts", "529", "Overloaded"}},
		{Name: "400 is not retried", Retries: 3,
			Replies: []providertest.Reply{{Status: http.StatusBadRequest,
				Body: `{"type":"error","error":{"type":"invalid_request_error","message":"tools.0.input_schema: JSON schema is invalid"}}`}},
			Attempts: 1, Err: []string{"anthropic model claude-sonnet-4-5 failed:", "400", "JSON schema is invalid"}},
		{Name: "body is not JSON", Retries: 3, Replies: []providertest.Reply{{Body: `upstream connect error`}},
			Attempts: 1, Err: []string{"anthropic model claude-sonnet-4-5 failed"}},
		{Name: "tool_use without a name", Retries: 3, Replies: []providertest.Reply{{Body: `{"id":"m","type":"message","role":"assistant","model":"m",
			"content":[{"type":"tool_use","id":"toolu_1","input":{}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}`}},
			Attempts: 1, Err: []string{"malformed response: tool_use block 0 has no name"}},
		{Name: "no content and no stop reason", Retries: 3, Replies: []providertest.Reply{{Body: `{"id":"m","type":"message","role":"assistant","model":"m","content":[]}`}},
			Attempts: 1, Err: []string{"malformed response: no content and no stop_reason"}},
	}, "sk-ant-secret", "hi, and 42 is not an expression.", func(baseURL string, retries int) provider.Provider {
		return anthropic.New(provider.Config{APIKey: "sk-ant-secret", BaseURL: baseURL, MaxRetries: retries})
	}, anthropicRequest([]envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}))
}

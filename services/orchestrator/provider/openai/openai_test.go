package openai_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/openai"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
)

// Replies in the Chat Completions wire format
// (https://platform.openai.com/docs/api-reference/chat/object).
const (
	openAIToolCalls = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-mini-2024-07-18",
  "choices": [{
    "index": 0,
    "message": {
      "role": "assistant",
      "content": null,
      "tool_calls": [
        {"id": "call_echo_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"hi\"}"}},
        {"id": "call_calc_2", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": 42}"}}
      ],
      "refusal": null,
      "annotations": []
    },
    "logprobs": null,
    "finish_reason": "tool_calls"
  }],
  "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}},
  "service_tier": "default",
  "system_fingerprint": "fp_06737a9306"
}`
	openAIFinal = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeH",
  "object": "chat.completion",
  "created": 1741570284,
  "model": "gpt-4o-mini-2024-07-18",
  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi, and 42 is not an expression.", "refusal": null},
    "logprobs": null, "finish_reason": "stop"}],
  "usage": {"prompt_tokens": 140, "completion_tokens": 12, "total_tokens": 152}
}`
	openAIRateLimited = `{"error": {"message": "Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3, Used 3, Requested 1.", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}`
	openAIServerError = `{"error": {"message": "The server had an error while processing your request. Sorry about that!", "type": "server_error", "param": null, "code": null}}`
)

func openAIRequest(msgs []envelope.Message) provider.Request {
	return providertest.Turn(envelope.Model{Provider: "openai", Name: "gpt-4o-mini"}, msgs)
}

// The round trip of one turn: the registry's tool definitions become
// functions, two parallel tool calls come back, and their results (one of
// them an error) go back as one role "tool" message each.
func TestOpenAIWireRoundTrip(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Body: openAIToolCalls}, providertest.Reply{Body: openAIFinal})
	p := openai.New(provider.Config{APIKey: "sk-test", BaseURL: f.URL + "/v1"})

	msgs := providertest.Question()
	resp, err := p.Complete(t.Context(), openAIRequest(msgs))
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{
		StopReason: "tool_calls",
		ToolCalls:  providertest.Calls("call_echo_1", "call_calc_2"),
		Usage:      envelope.Usage{InputTokens: 82, OutputTokens: 17},
	}, resp)

	first := f.Requests()[0]
	require.Equal(t, http.MethodPost, first.Method)
	require.Equal(t, "/v1/chat/completions", first.Path)
	require.Equal(t, "Bearer sk-test", first.Header.Get("Authorization"))
	require.Equal(t, providertest.JSON(t, `{
	  "model": "gpt-4o-mini",
	  "messages": [
	    {"role": "system", "content": "Be brief."},
	    {"role": "user", "content": "Echo hi and compute 42."}
	  ],
	  "tools": [
	    {"type": "function", "function": {"name": "echo", "description": "Returns its input text.",
	      "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "The text to return."}},
	        "required": ["text"], "additionalProperties": false}}},
	    {"type": "function", "function": {"name": "calculator", "description": "Evaluates an arithmetic expression.",
	      "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
	  ],
	  "parallel_tool_calls": true
	}`), first.Body)

	// The failed result carries its error's code, message and details.
	msgs = providertest.WithResults(msgs, resp,
		`{"error":{"code":"VALIDATION_ERROR","details":["at /expression: got number, want string"],"message":"input does not match the schema"}}`)
	req := openAIRequest(msgs)
	req.Iteration = 2
	resp, err = p.Complete(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, "hi, and 42 is not an expression.", resp.Content)
	require.Empty(t, resp.ToolCalls)
	require.Equal(t, "stop", resp.StopReason)
	require.Equal(t, envelope.Usage{InputTokens: 140, OutputTokens: 12}, resp.Usage)

	second := f.Requests()[1]
	require.Equal(t, providertest.JSON(t, `[
	  {"role": "system", "content": "Be brief."},
	  {"role": "user", "content": "Echo hi and compute 42."},
	  {"role": "assistant", "tool_calls": [
	    {"id": "call_echo_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"hi\"}"}},
	    {"id": "call_calc_2", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": 42}"}}
	  ]},
	  {"role": "tool", "tool_call_id": "call_echo_1", "content": "{\"text\":\"hi\"}"},
	  {"role": "tool", "tool_call_id": "call_calc_2",
	    "content": "{\"error\":{\"code\":\"VALIDATION_ERROR\",\"details\":[\"at /expression: got number, want string\"],\"message\":\"input does not match the schema\"}}"}
	]`), second.Body["messages"])
}

func TestOpenAIWireModelSettings(t *testing.T) {
	f := providertest.New(t, providertest.Reply{Body: openAIFinal})
	p := openai.New(provider.Config{BaseURL: f.URL})
	temp := 0.2
	_, err := p.Complete(t.Context(), provider.Request{Iteration: 1,
		Model:    envelope.Model{Provider: "openai", Name: "llama3.1", Temperature: &temp, MaxTokens: 256},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}})
	require.NoError(t, err)
	got := f.Requests()[0]
	require.Equal(t, "/chat/completions", got.Path)
	require.Equal(t, providertest.JSON(t, `{"model": "llama3.1", "messages": [{"role": "user", "content": "hi"}],
		"temperature": 0.2, "max_completion_tokens": 256}`), got.Body, "no tools: no tools and no parallel_tool_calls")
	require.Equal(t, "Bearer none", got.Header.Get("Authorization"), "a local server gets a placeholder key")
}

// Broken arguments from the model reach the orchestrator as a JSON string
// (the tool's schema then rejects them), and go back to the model as written.
func TestOpenAIWireBrokenArguments(t *testing.T) {
	broken := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,
	  "tool_calls":[{"id":"call_1","type":"function","function":{"name":"echo","arguments":"{\"text\": \"unterminated"}},
	                {"type":"function","function":{"name":"echo","arguments":""}}]},"finish_reason":"tool_calls"}],
	  "usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	f := providertest.New(t, providertest.Reply{Body: broken}, providertest.Reply{Body: openAIFinal})
	p := openai.New(provider.Config{APIKey: "k", BaseURL: f.URL})
	msgs := []envelope.Message{{Role: envelope.RoleUser, Content: "go"}}
	resp, err := p.Complete(t.Context(), openAIRequest(msgs))
	require.NoError(t, err)
	require.Equal(t, []envelope.ToolCall{
		{ID: "call_1", Name: "echo", Arguments: json.RawMessage(`"{\"text\": \"unterminated"`)},
		{ID: "call_1_2", Name: "echo", Arguments: json.RawMessage(`{}`)},
	}, resp.ToolCalls, "a missing id gets a stable one, missing arguments are {}")

	msgs = append(msgs, envelope.Message{Role: envelope.RoleAssistant, ToolCalls: resp.ToolCalls})
	_, err = p.Complete(t.Context(), openAIRequest(msgs))
	require.NoError(t, err)
	sent := f.Requests()[1].Body["messages"].([]any)[1].(map[string]any)["tool_calls"].([]any)
	require.Equal(t, `{"text": "unterminated`, sent[0].(map[string]any)["function"].(map[string]any)["arguments"])
}

func TestOpenAIWireFailures(t *testing.T) {
	providertest.CheckFailures(t, []providertest.Failure{
		{Name: "429 then success waits Retry-After", Retries: 3,
			Replies: []providertest.Reply{
				{Status: http.StatusTooManyRequests, Headers: map[string]string{"Retry-After": "1", "X-Request-Id": "req_1"}, Body: openAIRateLimited},
				{Body: openAIFinal}},
			Attempts: 2, MinGap: time.Second},
		{Name: "5xx until retries run out", Retries: 2,
			Replies:  []providertest.Reply{{Status: http.StatusServiceUnavailable, Headers: map[string]string{"Retry-After": "0"}, Body: openAIServerError}},
			Attempts: 3, Err: []string{"openai model gpt-4o-mini failed after 3 attempts", "503 Service Unavailable", "The server had an error"}},
		{Name: "5xx then success", Retries: 2,
			Replies: []providertest.Reply{
				{Status: http.StatusInternalServerError, Headers: map[string]string{"Retry-After": "0"}, Body: openAIServerError},
				{Body: openAIFinal}},
			Attempts: 2},
		{Name: "400 is not retried", Retries: 3,
			Replies: []providertest.Reply{{Status: http.StatusBadRequest,
				Body: `{"error":{"message":"Invalid schema for function 'echo'","type":"invalid_request_error","param":"tools[0].function.parameters","code":"invalid_function_parameters"}}`}},
			Attempts: 1, Err: []string{"openai model gpt-4o-mini failed:", "400 Bad Request", "Invalid schema for function 'echo'"}},
		{Name: "a key in the error is hidden", Retries: 3,
			Replies: []providertest.Reply{{Status: http.StatusUnauthorized,
				Body: `{"error":{"message":"Incorrect API key provided: sk-proj-AbCdEfGh1234. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`}},
			Attempts: 1, Err: []string{"401 Unauthorized", "Incorrect API key provided: [redacted]. You can find"}, Hidden: "AbCdEfGh1234"},
		{Name: "body is not JSON", Retries: 3, Replies: []providertest.Reply{{Body: `<html>gateway</html>`}},
			Attempts: 1, Err: []string{"openai model gpt-4o-mini failed"}},
		{Name: "no choices", Retries: 3, Replies: []providertest.Reply{{Body: `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}}`}},
			Attempts: 1, Err: []string{"malformed response: no choices"}},
		{Name: "tool call without a name", Retries: 3, Replies: []providertest.Reply{{Body: `{"id":"x","object":"chat.completion","created":1,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`}},
			Attempts: 1, Err: []string{"malformed response: tool call 0 has no function name"}},
	}, "sk-openai-secret", "hi, and 42 is not an expression.", func(baseURL string, retries int) provider.Provider {
		return openai.New(provider.Config{APIKey: "sk-openai-secret", BaseURL: baseURL, MaxRetries: retries})
	}, openAIRequest([]envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}))
}

package orchestrator_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator"
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

func openAIRequest(msgs []envelope.Message) orchestrator.ModelRequest {
	return orchestrator.ModelRequest{RunID: "r1", Iteration: 1,
		Model:    envelope.Model{Provider: "openai", Name: "gpt-4o-mini"},
		System:   "Be brief.",
		Messages: msgs, Tools: registryTools()}
}

// The round trip of one turn: the registry's tool definitions become
// functions, two parallel tool calls come back, and their results (one of
// them an error) go back as one role "tool" message each.
func TestOpenAIWireRoundTrip(t *testing.T) {
	f := newFakeModel(t, reply{body: openAIToolCalls}, reply{body: openAIFinal})
	p := orchestrator.NewOpenAIProvider(orchestrator.OpenAIConfig{APIKey: "sk-test", BaseURL: f.srv.URL + "/v1"})

	msgs := []envelope.Message{
		{Role: envelope.RoleSystem, Content: "Be brief."},
		{Role: envelope.RoleUser, Content: "Echo hi and compute 42."},
	}
	resp, err := p.Complete(t.Context(), openAIRequest(msgs))
	require.NoError(t, err)
	require.Equal(t, envelope.ModelResponse{
		StopReason: "tool_calls",
		ToolCalls: []envelope.ToolCall{
			{ID: "call_echo_1", Name: "echo", Arguments: json.RawMessage(`{"text": "hi"}`)},
			{ID: "call_calc_2", Name: "calculator", Arguments: json.RawMessage(`{"expression": 42}`)},
		},
		Usage: envelope.Usage{InputTokens: 82, OutputTokens: 17},
	}, resp)

	first := f.requests()[0]
	require.Equal(t, http.MethodPost, first.method)
	require.Equal(t, "/v1/chat/completions", first.path)
	require.Equal(t, "Bearer sk-test", first.header.Get("Authorization"))
	require.Equal(t, jsonOf(t, `{
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
	}`), first.body)

	// The results as the orchestrator hands them back: in call order, the
	// failed one carrying its error's code and message.
	ok := &envelope.ToolEnvelope{Output: json.RawMessage(`{"text":"hi"}`)}
	bad := &envelope.ToolEnvelope{Error: &envelope.ToolError{Code: envelope.CodeValidation,
		Message: "input does not match the schema", Details: []string{"at /expression: got number, want string"}}}
	msgs = append(msgs,
		envelope.Message{Role: envelope.RoleAssistant, ToolCalls: resp.ToolCalls},
		envelope.Message{Role: envelope.RoleTool, ToolCallID: "call_echo_1", Name: "echo", Content: orchestrator.ToolResultContent(ok)},
		envelope.Message{Role: envelope.RoleTool, ToolCallID: "call_calc_2", Name: "calculator", Content: orchestrator.ToolResultContent(bad), IsError: true},
	)
	req := openAIRequest(msgs)
	req.Iteration = 2
	resp, err = p.Complete(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, "hi, and 42 is not an expression.", resp.Content)
	require.Empty(t, resp.ToolCalls)
	require.Equal(t, "stop", resp.StopReason)
	require.Equal(t, envelope.Usage{InputTokens: 140, OutputTokens: 12}, resp.Usage)

	second := f.requests()[1]
	require.Equal(t, jsonOf(t, `[
	  {"role": "system", "content": "Be brief."},
	  {"role": "user", "content": "Echo hi and compute 42."},
	  {"role": "assistant", "tool_calls": [
	    {"id": "call_echo_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"hi\"}"}},
	    {"id": "call_calc_2", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": 42}"}}
	  ]},
	  {"role": "tool", "tool_call_id": "call_echo_1", "content": "{\"text\":\"hi\"}"},
	  {"role": "tool", "tool_call_id": "call_calc_2",
	    "content": "{\"error\":{\"code\":\"VALIDATION_ERROR\",\"details\":[\"at /expression: got number, want string\"],\"message\":\"input does not match the schema\"}}"}
	]`), second.body["messages"])
}

func TestOpenAIWireModelSettings(t *testing.T) {
	f := newFakeModel(t, reply{body: openAIFinal})
	p := orchestrator.NewOpenAIProvider(orchestrator.OpenAIConfig{BaseURL: f.srv.URL})
	temp := 0.2
	_, err := p.Complete(t.Context(), orchestrator.ModelRequest{Iteration: 1,
		Model:    envelope.Model{Provider: "openai", Name: "llama3.1", Temperature: &temp, MaxTokens: 256},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}})
	require.NoError(t, err)
	got := f.requests()[0]
	require.Equal(t, "/chat/completions", got.path)
	require.Equal(t, jsonOf(t, `{"model": "llama3.1", "messages": [{"role": "user", "content": "hi"}],
		"temperature": 0.2, "max_completion_tokens": 256}`), got.body, "no tools: no tools and no parallel_tool_calls")
	require.Equal(t, "Bearer none", got.header.Get("Authorization"), "a local server gets a placeholder key")
}

// Broken arguments from the model reach the orchestrator as a JSON string
// (the tool's schema then rejects them), and go back to the model as written.
func TestOpenAIWireBrokenArguments(t *testing.T) {
	broken := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,
	  "tool_calls":[{"id":"call_1","type":"function","function":{"name":"echo","arguments":"{\"text\": \"unterminated"}},
	                {"type":"function","function":{"name":"echo","arguments":""}}]},"finish_reason":"tool_calls"}],
	  "usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	f := newFakeModel(t, reply{body: broken}, reply{body: openAIFinal})
	p := orchestrator.NewOpenAIProvider(orchestrator.OpenAIConfig{APIKey: "k", BaseURL: f.srv.URL})
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
	sent := f.requests()[1].body["messages"].([]any)[1].(map[string]any)["tool_calls"].([]any)
	require.Equal(t, `{"text": "unterminated`, sent[0].(map[string]any)["function"].(map[string]any)["arguments"])
}

func TestOpenAIWireFailures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		retries  int
		replies  []reply
		attempts int
		err      []string // substrings of the error; none: success
		minGap   time.Duration
		hidden   string // must not appear in the error
	}{
		{name: "429 then success waits Retry-After", retries: 3,
			replies: []reply{
				{status: http.StatusTooManyRequests, headers: map[string]string{"Retry-After": "1", "X-Request-Id": "req_1"}, body: openAIRateLimited},
				{body: openAIFinal}},
			attempts: 2, minGap: time.Second},
		{name: "5xx until retries run out", retries: 2,
			replies:  []reply{{status: http.StatusServiceUnavailable, headers: map[string]string{"Retry-After": "0"}, body: openAIServerError}},
			attempts: 3, err: []string{"openai model gpt-4o-mini failed after 3 attempts", "503 Service Unavailable", "The server had an error"}},
		{name: "5xx then success", retries: 2,
			replies: []reply{
				{status: http.StatusInternalServerError, headers: map[string]string{"Retry-After": "0"}, body: openAIServerError},
				{body: openAIFinal}},
			attempts: 2},
		{name: "400 is not retried", retries: 3,
			replies: []reply{{status: http.StatusBadRequest,
				body: `{"error":{"message":"Invalid schema for function 'echo'","type":"invalid_request_error","param":"tools[0].function.parameters","code":"invalid_function_parameters"}}`}},
			attempts: 1, err: []string{"openai model gpt-4o-mini failed:", "400 Bad Request", "Invalid schema for function 'echo'"}},
		{name: "a key in the error is hidden", retries: 3,
			replies: []reply{{status: http.StatusUnauthorized,
				body: `{"error":{"message":"Incorrect API key provided: sk-proj-AbCdEfGh1234. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`}},
			attempts: 1, err: []string{"401 Unauthorized", "Incorrect API key provided: [redacted]. You can find"}, hidden: "AbCdEfGh1234"},
		{name: "body is not JSON", retries: 3, replies: []reply{{body: `<html>gateway</html>`}},
			attempts: 1, err: []string{"openai model gpt-4o-mini failed"}},
		{name: "no choices", retries: 3, replies: []reply{{body: `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}}`}},
			attempts: 1, err: []string{"malformed response: no choices"}},
		{name: "tool call without a name", retries: 3, replies: []reply{{body: `{"id":"x","object":"chat.completion","created":1,"model":"m",
			"choices":[{"index":0,"message":{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`}},
			attempts: 1, err: []string{"malformed response: tool call 0 has no function name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeModel(t, tc.replies...)
			p := orchestrator.NewOpenAIProvider(orchestrator.OpenAIConfig{APIKey: "k", BaseURL: f.srv.URL, MaxRetries: tc.retries})
			resp, err := p.Complete(t.Context(), openAIRequest([]envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}))
			got := f.requests()
			require.Len(t, got, tc.attempts)
			if len(tc.err) == 0 {
				require.NoError(t, err)
				require.Equal(t, "hi, and 42 is not an expression.", resp.Content)
			} else {
				require.Error(t, err)
				for _, s := range tc.err {
					require.ErrorContains(t, err, s)
				}
				require.NotContains(t, err.Error(), "Bearer", "the key is never in an error")
				if tc.hidden != "" {
					require.NotContains(t, err.Error(), tc.hidden)
				}
			}
			if tc.minGap > 0 {
				require.GreaterOrEqual(t, got[1].at.Sub(got[0].at), tc.minGap, "the retry waited as long as Retry-After said")
			}
		})
	}
}

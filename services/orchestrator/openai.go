package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sync/atomic"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// OpenAIProviderName is the provider name of the OpenAI adapter.
const OpenAIProviderName = "openai"

// OpenAIConfig configures the OpenAI Chat Completions adapter.
type OpenAIConfig struct {
	// APIKey is sent as the bearer token. A local server (Ollama, vLLM) may
	// need none.
	APIKey string
	// BaseURL is the API's base, default https://api.openai.com/v1: any
	// server that speaks Chat Completions works (vLLM, Ollama, LiteLLM).
	BaseURL string
	// MaxRetries is how often a failed request is retried (connection errors,
	// 408, 409, 429 and 5xx), with exponential back-off that respects
	// Retry-After; default DefaultModelRetries, -1 for none.
	MaxRetries int
	// HTTPClient replaces the SDK's default client.
	HTTPClient *http.Client
}

// OpenAIProvider calls a model through the OpenAI Chat Completions API with the
// official SDK (github.com/openai/openai-go/v3). Tools are offered as
// functions whose parameters are the registry's input schemas; the model may
// call several at once (parallel_tool_calls), and each result goes back as
// its own role "tool" message.
type OpenAIProvider struct {
	client  openai.Client
	retries int
}

// NewOpenAIProvider returns the adapter.
func NewOpenAIProvider(c OpenAIConfig) *OpenAIProvider {
	retries := retriesOrDefault(c.MaxRetries)
	opts := []option.RequestOption{option.WithMaxRetries(retries)}
	if c.APIKey != "" {
		opts = append(opts, option.WithAPIKey(c.APIKey))
	} else {
		// The SDK refuses to send a request without a key; a local server
		// ignores it.
		opts = append(opts, option.WithAPIKey("none"))
	}
	if c.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(c.BaseURL))
	}
	if c.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(c.HTTPClient))
	}
	return &OpenAIProvider{client: openai.NewClient(opts...), retries: retries}
}

// apiKeyLike matches what looks like an API key in a provider's error
// message ("Incorrect API key provided: sk-proj-****abcd").
var apiKeyLike = regexp.MustCompile(`\b(?:sk|key)-[A-Za-z0-9_*\-]{4,}`)

// redactKeys hides anything that looks like an API key: a provider's error
// message becomes a run's failure reason.
func redactKeys(s string) string { return apiKeyLike.ReplaceAllString(s, "[redacted]") }

func retriesOrDefault(n int) int {
	switch {
	case n < 0:
		return 0
	case n == 0:
		return DefaultModelRetries
	}
	return n
}

// Complete implements Provider.
func (p *OpenAIProvider) Complete(ctx context.Context, req ModelRequest) (envelope.ModelResponse, error) {
	params, err := openAIParams(req)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	var attempts atomic.Int32
	resp, err := p.client.Chat.Completions.New(ctx, params, option.WithMiddleware(countAttempts(&attempts)))
	if err != nil {
		var apiErr *openai.Error
		if errors.As(err, &apiErr) && apiErr.Message != "" {
			// The SDK's error names the status only; the body says why.
			err = fmt.Errorf("%w: %s", err, apiErr.Message)
		}
		return envelope.ModelResponse{}, providerFailure(OpenAIProviderName, req.Model.Name, int(attempts.Load()), err)
	}
	return openAIResponse(req, resp)
}

func countAttempts(n *atomic.Int32) option.Middleware {
	return func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		n.Add(1)
		return next(r)
	}
}

// providerFailure says which provider and model failed, after how many
// attempts, and why (the SDK's error: status, and what the body says), with
// anything that looks like an API key hidden.
func providerFailure(provider, model string, attempts int, err error) error {
	msg := fmt.Sprintf("%s model %s failed: %v", provider, model, err)
	if attempts > 1 {
		msg = fmt.Sprintf("%s model %s failed after %d attempts: %v", provider, model, attempts, err)
	}
	return &providerError{msg: redactKeys(msg), err: err}
}

// providerError is a model call's failure; it unwraps to the SDK's error.
type providerError struct {
	msg string
	err error
}

func (e *providerError) Error() string { return e.msg }
func (e *providerError) Unwrap() error { return e.err }

func openAIParams(req ModelRequest) (openai.ChatCompletionNewParams, error) {
	p := openai.ChatCompletionNewParams{Model: req.Model.Name}
	for _, m := range req.Messages {
		switch m.Role {
		case envelope.RoleSystem:
			p.Messages = append(p.Messages, openai.SystemMessage(m.Content))
		case envelope.RoleUser:
			p.Messages = append(p.Messages, openai.UserMessage(m.Content))
		case envelope.RoleAssistant:
			a := openai.ChatCompletionAssistantMessageParam{}
			if m.Content != "" {
				a.Content.OfString = openai.String(m.Content)
			}
			for _, tc := range m.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID:       tc.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: tc.Name, Arguments: argumentsText(tc.Arguments)},
					},
				})
			}
			p.Messages = append(p.Messages, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		case envelope.RoleTool:
			// One role "tool" message per result, paired by tool_call_id; an
			// error result is the error's JSON (code, message, retry_after_s).
			p.Messages = append(p.Messages, openai.ToolMessage(m.Content, m.ToolCallID))
		default:
			return p, fmt.Errorf("openai: message role %q is not one of system, user, assistant, tool", m.Role)
		}
	}
	for _, d := range req.Tools {
		params, err := inputSchemaObject(d)
		if err != nil {
			return p, err
		}
		fn := shared.FunctionDefinitionParam{Name: d.Name, Parameters: params}
		if d.Description != "" {
			fn.Description = openai.String(d.Description)
		}
		p.Tools = append(p.Tools, openai.ChatCompletionFunctionTool(fn))
	}
	if len(p.Tools) > 0 {
		p.ParallelToolCalls = openai.Bool(true)
	}
	if t := req.Model.Temperature; t != nil {
		p.Temperature = openai.Float(*t)
	}
	if req.Model.MaxTokens > 0 {
		p.MaxCompletionTokens = openai.Int(int64(req.Model.MaxTokens))
	}
	return p, nil
}

func openAIResponse(req ModelRequest, resp *openai.ChatCompletion) (envelope.ModelResponse, error) {
	if resp == nil || len(resp.Choices) == 0 {
		return envelope.ModelResponse{}, fmt.Errorf("openai model %s: malformed response: no choices", req.Model.Name)
	}
	ch := resp.Choices[0]
	out := envelope.ModelResponse{
		Content:    ch.Message.Content,
		StopReason: ch.FinishReason,
		Usage:      envelope.Usage{InputTokens: int(resp.Usage.PromptTokens), OutputTokens: int(resp.Usage.CompletionTokens)},
	}
	for i, tc := range ch.Message.ToolCalls {
		if tc.Type != "" && tc.Type != "function" {
			return envelope.ModelResponse{}, fmt.Errorf("openai model %s: tool call %q has type %q; only function tools are offered", req.Model.Name, tc.ID, tc.Type)
		}
		if tc.Function.Name == "" {
			return envelope.ModelResponse{}, fmt.Errorf("openai model %s: malformed response: tool call %d has no function name", req.Model.Name, i)
		}
		out.ToolCalls = append(out.ToolCalls, envelope.ToolCall{
			ID:        providerCallID(tc.ID, req.Iteration, i),
			Name:      tc.Function.Name,
			Arguments: argumentsJSON(tc.Function.Arguments),
		})
	}
	return out, nil
}

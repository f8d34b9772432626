// Package openai is the adapter of the OpenAI Chat Completions API, through
// the official SDK: OpenAI's models, and any server that speaks Chat
// Completions (vLLM, Ollama, LiteLLM). Complete makes one request for the
// whole answer; Stream (provider.Streamer) streams it chunk by chunk and
// starts over when the stream breaks. Both map the request's tool controls
// to tool_choice and parallel_tool_calls, and its output schema to the
// native structured output (response_format json_schema).
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Name is the provider name (agent.model.provider) of the adapter.
const Name = "openai"

// Provider calls a model through the OpenAI Chat Completions API with the
// official SDK (github.com/openai/openai-go/v3). Tools are offered as
// functions whose parameters are the registry's input schemas; the model may
// call several at once (parallel_tool_calls, unless the request forbids
// it), and each result goes back as its own role "tool" message. The
// request's ToolChoice is tool_choice ("auto", "required", "none", or
// {"type":"function","function":{"name":...}} for a tool's name), and its
// OutputSchema the response_format json_schema named
// provider.OutputToolName (not strict: the orchestrator validates the
// answer).
type Provider struct {
	client  openai.Client
	retries int // of a stream that breaks (Stream)
}

var _ provider.Streamer = (*Provider)(nil)

// New returns the adapter. The key is sent as the bearer token; without one
// (a local server), a placeholder is. Any server that speaks Chat
// Completions can be the BaseURL (vLLM, Ollama, LiteLLM).
func New(c provider.Config) *Provider {
	opts := []option.RequestOption{option.WithMaxRetries(provider.Retries(c.MaxRetries))}
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
	return &Provider{client: openai.NewClient(opts...), retries: provider.Retries(c.MaxRetries)}
}

// Complete implements provider.Provider.
func (p *Provider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	params, err := chatParams(req)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	var attempts atomic.Int32
	resp, err := p.client.Chat.Completions.New(ctx, params, option.WithMiddleware(countAttempts(&attempts)))
	if err != nil {
		return envelope.ModelResponse{}, provider.Failure(Name, req.Model.Name, int(attempts.Load()), withMessage(err))
	}
	return chatResponse(req, resp)
}

// withMessage is the SDK's error with what the body says: the error names
// the status only.
func withMessage(err error) error {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) && apiErr.Message != "" {
		return fmt.Errorf("%w: %s", err, apiErr.Message)
	}
	return err
}

func countAttempts(n *atomic.Int32) option.Middleware {
	return func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		n.Add(1)
		return next(r)
	}
}

func chatParams(req provider.Request) (openai.ChatCompletionNewParams, error) {
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
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: tc.Name, Arguments: provider.ArgumentsText(tc.Arguments)},
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
		params, err := provider.InputSchema(d)
		if err != nil {
			return p, err
		}
		fn := shared.FunctionDefinitionParam{Name: d.Name, Parameters: params}
		if d.Description != "" {
			fn.Description = openai.String(d.Description)
		}
		p.Tools = append(p.Tools, openai.ChatCompletionFunctionTool(fn))
	}
	if err := toolControls(&p, req); err != nil {
		return p, err
	}
	if len(req.OutputSchema) > 0 {
		if !json.Valid(req.OutputSchema) {
			return p, errors.New("openai: output schema is not valid JSON")
		}
		p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
				Name:   provider.OutputToolName,
				Schema: json.RawMessage(req.OutputSchema),
				// Strict mode takes a subset of JSON Schema only; the
				// orchestrator validates the answer against all of it.
				Strict: openai.Bool(false),
			},
		}}
	}
	if t := req.Model.Temperature; t != nil {
		p.Temperature = openai.Float(*t)
	}
	if req.Model.MaxTokens > 0 {
		p.MaxCompletionTokens = openai.Int(int64(req.Model.MaxTokens))
	}
	return p, nil
}

// toolControls sets tool_choice and parallel_tool_calls from the request,
// when there are tools to offer: the API takes neither without them.
// parallel_tool_calls is the request's, or true when it leaves it, and is
// not sent with tool_choice "none".
func toolControls(p *openai.ChatCompletionNewParams, req provider.Request) error {
	c := req.ToolChoice
	if len(p.Tools) == 0 {
		switch c {
		case "", envelope.ToolChoiceAuto, envelope.ToolChoiceNone:
			return nil
		}
		return fmt.Errorf("openai: tool_choice %q needs a tool, and the request offers none", c)
	}
	switch c {
	case "":
	case envelope.ToolChoiceAuto, envelope.ToolChoiceRequired, envelope.ToolChoiceNone:
		p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String(c)}
	default:
		if !slices.ContainsFunc(req.Tools, func(d envelope.ToolDefinition) bool { return d.Name == c }) {
			return fmt.Errorf("openai: tool_choice %q is not auto, required, none or the name of an offered tool", c)
		}
		p.ToolChoice = openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: c})
	}
	if c != envelope.ToolChoiceNone {
		parallel := true
		if req.ParallelToolCalls != nil {
			parallel = *req.ParallelToolCalls
		}
		p.ParallelToolCalls = openai.Bool(parallel)
	}
	return nil
}

func chatResponse(req provider.Request, resp *openai.ChatCompletion) (envelope.ModelResponse, error) {
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
			ID:        provider.CallID(tc.ID, req.Iteration, i),
			Name:      tc.Function.Name,
			Arguments: provider.ArgumentsJSON(tc.Function.Arguments),
		})
	}
	return out, nil
}

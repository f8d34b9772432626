// Package anthropic is the adapter of the Anthropic Messages API, through the
// official SDK. Complete makes one request for the whole answer; Stream
// (provider.Streamer) streams its events and starts over when the stream
// breaks. Both map the request's tool controls to tool_choice (with
// disable_parallel_tool_use), and its output schema to a tool-forced output:
// the tool provider.OutputToolName, whose call is the answer (output.go).
package anthropic

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Name is the provider name (agent.model.provider) of the adapter.
const Name = "anthropic"

// DefaultMaxTokens is max_tokens when the model settings name none:
// the Messages API requires one.
const DefaultMaxTokens = 4096

// Provider calls a model through the Anthropic Messages API with the
// official SDK (github.com/anthropics/anthropic-sdk-go/v2). Tools are offered
// with the registry's input schemas; the model's tool_use blocks become tool
// calls, and the results of one turn go back in one user message carrying a
// tool_result block per call, in the order of the calls, with is_error set
// for a failed call. ToolChoice is tool_choice ("required" is "any", a
// tool's name {"type":"tool","name":...}), ParallelToolCalls false is its
// disable_parallel_tool_use, and an OutputSchema offers the tool
// provider.OutputToolName for the final answer (output.go).
type Provider struct {
	client  anthropic.Client
	retries int // of a stream that breaks (Stream)
}

var _ provider.Streamer = (*Provider)(nil)

// New returns the adapter.
func New(c provider.Config) *Provider {
	opts := []option.RequestOption{
		// Only what is configured here: no credentials or base URL picked up
		// from the environment behind the configuration's back.
		option.WithoutEnvironmentDefaults(),
		option.WithAPIKey(c.APIKey),
		option.WithMaxRetries(provider.Retries(c.MaxRetries)),
		// The orchestrator's own "chat" span already covers the call.
		option.WithoutOpenTelemetry(),
	}
	if c.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(c.BaseURL))
	}
	if c.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(c.HTTPClient))
	}
	return &Provider{client: anthropic.NewClient(opts...), retries: provider.Retries(c.MaxRetries)}
}

// Complete implements provider.Provider.
func (p *Provider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	params, out, err := messageParams(req)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	var attempts atomic.Int32
	msg, err := p.client.Messages.New(ctx, params, requestOptions(req, &attempts)...)
	if err != nil {
		return envelope.ModelResponse{}, provider.Failure(Name, req.Model.Name, int(attempts.Load()), err)
	}
	return messageResponse(req, out, msg)
}

// requestOptions are a request's options: its attempts counted in
// attempts, and the temperature.
func requestOptions(req provider.Request, attempts *atomic.Int32) []option.RequestOption {
	opts := []option.RequestOption{option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		attempts.Add(1)
		return next(r)
	})}
	if t := req.Model.Temperature; t != nil {
		// The SDK's parameters have no field for it; the wire format does.
		opts = append(opts, option.WithJSONSet("temperature", *t))
	}
	return opts
}

// messageParams is the request's wire form, and how it offers its output
// schema.
func messageParams(req provider.Request) (anthropic.MessageNewParams, output, error) {
	p, err := conversation(req)
	if err != nil {
		return p, output{}, err
	}
	for _, d := range req.Tools {
		schema, err := provider.InputSchema(d)
		if err != nil {
			return p, output{}, err
		}
		tool := anthropic.ToolParam{Name: d.Name, InputSchema: inputSchema(schema)}
		if d.Description != "" {
			tool.Description = anthropic.String(d.Description)
		}
		p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: &tool})
	}
	out, err := offerOutput(&p, req)
	if err != nil {
		return p, out, err
	}
	if err := toolChoice(&p, req, out); err != nil {
		return p, out, err
	}
	return p, out, nil
}

// inputSchema is an object schema as the Messages API takes a tool's.
func inputSchema(schema map[string]any) anthropic.ToolInputSchemaParam {
	in := anthropic.ToolInputSchemaParam{Properties: schema["properties"], ExtraFields: map[string]any{}}
	if req, ok := schema["required"].([]any); ok {
		for _, r := range req {
			if s, ok := r.(string); ok {
				in.Required = append(in.Required, s)
			}
		}
	}
	for k, v := range schema {
		switch k {
		case "type", "properties", "required":
		default:
			in.ExtraFields[k] = v
		}
	}
	return in
}

// conversation is the request's model settings, system prompt and
// messages.
func conversation(req provider.Request) (anthropic.MessageNewParams, error) {
	p := anthropic.MessageNewParams{Model: anthropic.Model(req.Model.Name), MaxTokens: DefaultMaxTokens}
	if req.Model.MaxTokens > 0 {
		p.MaxTokens = int64(req.Model.MaxTokens)
	}
	var system []string
	add := func(user bool, blocks ...anthropic.ContentBlockParamUnion) {
		if len(blocks) == 0 {
			return
		}
		// Consecutive messages of one role become one: the results of a turn
		// go back in a single user message.
		if n := len(p.Messages); n > 0 {
			last := &p.Messages[n-1]
			switch {
			case user && last.OfUser != nil:
				last.OfUser.Content = append(last.OfUser.Content, blocks...)
				return
			case !user && last.OfAssistant != nil:
				last.OfAssistant.Content = append(last.OfAssistant.Content, blocks...)
				return
			}
		}
		if user {
			p.Messages = append(p.Messages, anthropic.NewUserMessage(blocks...))
		} else {
			p.Messages = append(p.Messages, anthropic.NewAssistantMessage(blocks...))
		}
	}
	for _, m := range req.Messages {
		switch m.Role {
		case envelope.RoleSystem:
			// The Messages API takes the system prompt apart from the turns.
			if m.Content != "" {
				system = append(system, m.Content)
			}
		case envelope.RoleUser:
			if m.Content != "" {
				add(true, anthropic.NewTextBlock(m.Content))
			}
		case envelope.RoleAssistant:
			var blocks []anthropic.ContentBlockParamUnion
			if m.Content != "" {
				blocks = append(blocks, anthropic.NewTextBlock(m.Content))
			}
			for _, tc := range m.ToolCalls {
				blocks = append(blocks, anthropic.NewToolUseBlock(tc.ID, provider.ArgumentsValue(tc.Arguments), tc.Name))
			}
			add(false, blocks...)
		case envelope.RoleTool:
			add(true, anthropic.NewToolResultBlock(m.ToolCallID, m.Content, m.IsError))
		default:
			return p, fmt.Errorf("anthropic: message role %q is not one of system, user, assistant, tool", m.Role)
		}
	}
	if len(system) > 0 {
		p.System = []anthropic.TextBlockParam{{Text: strings.Join(system, "\n\n")}}
	}
	return p, nil
}

func messageResponse(req provider.Request, out output, msg *anthropic.Message) (envelope.ModelResponse, error) {
	if msg == nil {
		return envelope.ModelResponse{}, fmt.Errorf("anthropic model %s: malformed response: empty", req.Model.Name)
	}
	u := msg.Usage
	t := newTurn(req, out, nil)
	for i, b := range msg.Content {
		if err := t.start(int64(i), b.Type, b.Text, b.ID, b.Name, string(b.Input)); err != nil {
			return envelope.ModelResponse{}, err
		}
	}
	if t.empty() && msg.StopReason == "" {
		return envelope.ModelResponse{}, fmt.Errorf("anthropic model %s: malformed response: no content and no stop_reason", req.Model.Name)
	}
	resp := t.response()
	resp.StopReason = string(msg.StopReason)
	resp.Usage = usage(u.InputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens, u.OutputTokens)
	return resp, nil
}

// usage is the usage of a message: cache writes and reads are input too;
// pricing them at the input price errs on the side of the budget.
func usage(input, cacheWrites, cacheReads, output int64) envelope.Usage {
	return envelope.Usage{InputTokens: int(input + cacheWrites + cacheReads), OutputTokens: int(output)}
}

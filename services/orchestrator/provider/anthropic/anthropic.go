// Package anthropic is the adapter of the Anthropic Messages API, through the
// official SDK.
package anthropic

import (
	"context"
	"encoding/json"
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
// for a failed call.
type Provider struct {
	client anthropic.Client
}

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
	return &Provider{client: anthropic.NewClient(opts...)}
}

// Complete implements provider.Provider.
func (p *Provider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	params, err := messageParams(req)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	var attempts atomic.Int32
	opts := []option.RequestOption{option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		attempts.Add(1)
		return next(r)
	})}
	if t := req.Model.Temperature; t != nil {
		// The SDK's parameters have no field for it; the wire format does.
		opts = append(opts, option.WithJSONSet("temperature", *t))
	}
	msg, err := p.client.Messages.New(ctx, params, opts...)
	if err != nil {
		return envelope.ModelResponse{}, provider.Failure(Name, req.Model.Name, int(attempts.Load()), err)
	}
	return messageResponse(req, msg)
}

func messageParams(req provider.Request) (anthropic.MessageNewParams, error) {
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
	for _, d := range req.Tools {
		schema, err := provider.InputSchema(d)
		if err != nil {
			return p, err
		}
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
		tool := anthropic.ToolParam{Name: d.Name, InputSchema: in}
		if d.Description != "" {
			tool.Description = anthropic.String(d.Description)
		}
		p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: &tool})
	}
	return p, nil
}

func messageResponse(req provider.Request, msg *anthropic.Message) (envelope.ModelResponse, error) {
	if msg == nil {
		return envelope.ModelResponse{}, fmt.Errorf("anthropic model %s: malformed response: empty", req.Model.Name)
	}
	u := msg.Usage
	out := envelope.ModelResponse{
		StopReason: string(msg.StopReason),
		// Cache writes and reads are input too; pricing them at the input
		// price errs on the side of the budget.
		Usage: envelope.Usage{
			InputTokens:  int(u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens),
			OutputTokens: int(u.OutputTokens),
		},
	}
	var text []string
	for i, b := range msg.Content {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "tool_use":
			if b.Name == "" {
				return envelope.ModelResponse{}, fmt.Errorf("anthropic model %s: malformed response: tool_use block %d has no name", req.Model.Name, i)
			}
			args := json.RawMessage(b.Input)
			if len(args) == 0 || !json.Valid(args) {
				args = json.RawMessage(`{}`)
			}
			out.ToolCalls = append(out.ToolCalls, envelope.ToolCall{
				ID: provider.CallID(b.ID, req.Iteration, len(out.ToolCalls)), Name: b.Name, Arguments: args,
			})
		}
	}
	if len(text) == 0 && len(out.ToolCalls) == 0 && msg.StopReason == "" {
		return envelope.ModelResponse{}, fmt.Errorf("anthropic model %s: malformed response: no content and no stop_reason", req.Model.Name)
	}
	out.Content = strings.Join(text, "")
	return out, nil
}

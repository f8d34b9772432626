// Package scripted is a model that plays a script of turns given in the run
// request: the model of the demo, of tests and of benchmarks.
package scripted

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Name is the provider name (agent.model.provider) of the scripted model.
const Name = "scripted"

// Turn is one answer of the scripted model: tool calls, or final content.
type Turn struct {
	Content   string     `json:"content,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is a tool call the scripted model makes.
type ToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Script is the scripted model's options: agent.model.options = {"script": [...]}.
type Script struct {
	Turns []Turn `json:"script"`
}

// Parse reads and checks a script from model options.
func Parse(options json.RawMessage) (Script, error) {
	var s Script
	if len(options) == 0 {
		return s, fmt.Errorf("scripted model: agent.model.options.script is required")
	}
	if err := json.Unmarshal(options, &s); err != nil {
		return s, fmt.Errorf("scripted model: options: %w", err)
	}
	if len(s.Turns) == 0 {
		return s, fmt.Errorf("scripted model: options.script has no turns")
	}
	for i, t := range s.Turns {
		if t.Content == "" && len(t.ToolCalls) == 0 {
			return s, fmt.Errorf("scripted model: script[%d] has neither content nor tool_calls", i)
		}
		for j, c := range t.ToolCalls {
			if c.Name == "" {
				return s, fmt.Errorf("scripted model: script[%d].tool_calls[%d] has no name", i, j)
			}
		}
	}
	return s, nil
}

// Provider plays a script of turns from the run's model options, one
// turn per model call, with zero latency: the model of the demo, of tests and
// of benchmarks. Past the end of the script it answers with the last turn's
// content, or an empty answer. It honours the tool controls as a model
// must: under tool_choice none a turn's calls are dropped (a turn of calls
// only is an error), required and a named tool need a turn that calls
// (that tool), and without parallel tool calls only a turn's first call is
// made. It streams (Stream) its answer in pieces of
// provider.DefaultChunkBytes.
type Provider struct{}

// Stream implements provider.Streamer: the answer Complete gives, in
// pieces.
func (p Provider) Stream(ctx context.Context, req provider.Request, onDelta func(provider.Delta)) (envelope.ModelResponse, error) {
	resp, err := p.Complete(ctx, req)
	if err != nil {
		return resp, err
	}
	provider.Chunks(resp, provider.DefaultChunkBytes, onDelta)
	return resp, nil
}

// honour applies the request's tool controls to script turn n (from 0).
func honour(t Turn, n int, req provider.Request) (Turn, error) {
	switch c := req.ToolChoice; c {
	case "", envelope.ToolChoiceAuto:
	case envelope.ToolChoiceNone:
		if len(t.ToolCalls) > 0 && t.Content == "" {
			return t, fmt.Errorf("scripted model: script[%d] only calls tools, which tool_choice none forbids", n)
		}
		t.ToolCalls = nil
	case envelope.ToolChoiceRequired:
		if len(t.ToolCalls) == 0 {
			return t, fmt.Errorf("scripted model: script[%d] calls no tool, and tool_choice is required", n)
		}
	default:
		if len(t.ToolCalls) == 0 || t.ToolCalls[0].Name != c {
			return t, fmt.Errorf("scripted model: script[%d] does not call %s first, and tool_choice names it", n, c)
		}
	}
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls && len(t.ToolCalls) > 1 {
		t.ToolCalls = t.ToolCalls[:1]
	}
	return t, nil
}

// Complete implements provider.Provider.
func (Provider) Complete(_ context.Context, req provider.Request) (envelope.ModelResponse, error) {
	s, err := Parse(req.Model.Options)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	// The turn is the number of assistant answers so far: deterministic from
	// the conversation, so a replayed or retried call gives the same answer.
	n := 0
	for _, m := range req.Messages {
		if m.Role == envelope.RoleAssistant {
			n++
		}
	}
	in, out := 0, 0
	for _, m := range req.Messages {
		in += len(m.Content) / 4
	}
	if n >= len(s.Turns) {
		return envelope.ModelResponse{Content: s.Turns[len(s.Turns)-1].Content, StopReason: "end_turn",
			Usage: envelope.Usage{InputTokens: in}}, nil
	}
	t, err := honour(s.Turns[n], n, req)
	if err != nil {
		return envelope.ModelResponse{}, err
	}
	resp := envelope.ModelResponse{Content: t.Content, StopReason: "end_turn"}
	for i, c := range t.ToolCalls {
		args := c.Arguments
		if len(args) == 0 {
			args = json.RawMessage(`{}`)
		}
		resp.ToolCalls = append(resp.ToolCalls, envelope.ToolCall{
			ID: fmt.Sprintf("call_%d_%d", req.Iteration, i+1), Name: c.Name, Arguments: args,
		})
		out += len(args) / 4
	}
	if len(resp.ToolCalls) > 0 {
		resp.StopReason = "tool_use"
	}
	out += len(t.Content) / 4
	resp.Usage = envelope.Usage{InputTokens: in, OutputTokens: out}
	return resp, nil
}

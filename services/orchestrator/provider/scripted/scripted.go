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
// content, or an empty answer.
type Provider struct{}

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
	t := s.Turns[n]
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

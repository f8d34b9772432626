// Package provider is how the agent loop asks a model for its next turn: the
// Provider interface, the neutral Request it sends (toolwire's messages and
// the registry's tool definitions), and the helpers every adapter uses to
// move between those and a provider's wire format. The adapters are its
// subpackages: openai (Chat Completions), anthropic (Messages), scripted (a
// script of turns: the model of the demo, tests and benchmarks) and replay (a
// recorded run's answers).
package provider

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Request is what an adapter turns into its wire format: the conversation so
// far and the tools the model may call.
type Request struct {
	RunID     string
	Iteration int
	Model     envelope.Model
	System    string
	Messages  []envelope.Message
	Tools     []envelope.ToolDefinition

	// ToolChoice is this call's: auto, required, none or a tool's name
	// (envelope.Agent.ToolChoiceAt); "" is auto.
	ToolChoice string
	// ParallelToolCalls, when set, allows or forbids several tool calls in
	// one answer; nil leaves the provider's default.
	ParallelToolCalls *bool
	// OutputSchema, when set, is the JSON Schema a final answer must
	// satisfy: an adapter uses its provider's native structured output
	// where it has one (OutputToolName for a tool-forced one), else says
	// so in the system prompt. The orchestrator validates the answer.
	OutputSchema json.RawMessage
}

// OutputToolName is the tool an adapter without a native structured-output
// mode offers for the final answer (Anthropic's tool-forced output): the
// model's call of it is its answer, its input the value, never a tool call
// of the turn. An agent with an output schema enables no tool of that name.
const OutputToolName = envelope.OutputToolName

// Delta is a piece of a streamed answer: text, or a piece of one tool call,
// or the news that what the call streamed so far is void (Discard: the
// stream failed and the call starts over).
type Delta struct {
	Text     string         `json:"text,omitempty"`
	ToolCall *ToolCallDelta `json:"tool_call,omitempty"`
	Discard  bool           `json:"discard,omitempty"`
}

// ToolCallDelta is a piece of tool call Index (from 0, in the answer's
// order): its ID and Name on its first piece, then pieces of its
// arguments' JSON text, which add up to the arguments.
type ToolCallDelta struct {
	Index     int    `json:"index"`
	ID        string `json:"id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// Streamer is a Provider that streams: Stream is Complete calling onDelta
// with each piece of the answer, in order, as it arrives (from the caller's
// goroutine: onDelta must not block long). The response it returns is what
// the pieces since the last Discard add up to: its content the texts
// joined, its tool calls the pieces of each index joined.
type Streamer interface {
	Provider
	Stream(ctx context.Context, req Request, onDelta func(Delta)) (envelope.ModelResponse, error)
}

// Provider calls a model. Adapters translate toolwire's neutral messages and
// tool definitions into the provider's format and its answer back.
type Provider interface {
	Complete(ctx context.Context, req Request) (envelope.ModelResponse, error)
}

// Func adapts a function to Provider.
type Func func(ctx context.Context, req Request) (envelope.ModelResponse, error)

// Complete implements Provider.
func (f Func) Complete(ctx context.Context, req Request) (envelope.ModelResponse, error) {
	return f(ctx, req)
}

// Config configures an adapter of a provider's HTTP API.
type Config struct {
	// APIKey authenticates the requests. A local OpenAI-compatible server
	// (Ollama, vLLM) may need none.
	APIKey string
	// BaseURL is the API's base; default the provider's own
	// (https://api.openai.com/v1, https://api.anthropic.com).
	BaseURL string
	// MaxRetries is how often a failed request is retried (connection errors,
	// 408, 409, 429 and 5xx), with exponential back-off that respects
	// Retry-After; default DefaultRetries, -1 for none.
	MaxRetries int
	// HTTPClient replaces the SDK's default client.
	HTTPClient *http.Client
}

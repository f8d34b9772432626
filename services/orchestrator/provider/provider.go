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

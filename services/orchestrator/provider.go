package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// ModelRequest is what a provider adapter turns into its wire format.
type ModelRequest struct {
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
	Complete(ctx context.Context, req ModelRequest) (envelope.ModelResponse, error)
}

// ProviderFunc adapts a function to Provider.
type ProviderFunc func(ctx context.Context, req ModelRequest) (envelope.ModelResponse, error)

// Complete implements Provider.
func (f ProviderFunc) Complete(ctx context.Context, req ModelRequest) (envelope.ModelResponse, error) {
	return f(ctx, req)
}

// ErrUnknownProvider is returned for a model provider no adapter serves.
var ErrUnknownProvider = errors.New("unknown model provider")

// Providers maps a provider name (agent.model.provider) to its adapter.
type Providers map[string]Provider

// Get returns the named provider.
func (p Providers) Get(name string) (Provider, error) {
	if pr, ok := p[name]; ok {
		return pr, nil
	}
	return nil, fmt.Errorf("%w %q (available: %v)", ErrUnknownProvider, name, p.Names())
}

// Names returns the provider names, sorted.
func (p Providers) Names() []string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

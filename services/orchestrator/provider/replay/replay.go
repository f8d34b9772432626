// Package replay is a model that answers with the recorded responses of a
// replay bundle: the model of `toolwire replay`.
package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Name is the provider name a replayed run may use; a replay can also
// register the Provider under the recorded run's own provider name, so that
// the recorded request runs unchanged.
const Name = "replay"

// ErrDiverged is wrapped when a replayed run asks the model for a turn the
// bundle did not record.
var ErrDiverged = errors.New("replay diverged")

// Provider plays the recorded model responses of a replay bundle: the
// model call of iteration n answers what the recorded run's model answered at
// iteration n, with its recorded token usage, without calling any model. It is
// the model of `toolwire replay`; tool calls still run, so a replay shows what
// today's tools make of yesterday's model decisions.
type Provider struct {
	runID string
	turns map[int]envelope.ModelResponse
	last  int
}

// New checks a bundle's turns and returns their player.
func New(b envelope.ReplayBundle) (*Provider, error) {
	if len(b.Turns) == 0 {
		return nil, fmt.Errorf("replay of run %s: the bundle holds no model turn", b.RunID)
	}
	p := &Provider{runID: b.RunID, turns: make(map[int]envelope.ModelResponse, len(b.Turns))}
	for i, t := range b.Turns {
		if t.Iteration < 1 {
			return nil, fmt.Errorf("replay of run %s: turns[%d] has iteration %d; want 1 or more", b.RunID, i, t.Iteration)
		}
		if _, dup := p.turns[t.Iteration]; dup {
			return nil, fmt.Errorf("replay of run %s: two turns of iteration %d", b.RunID, t.Iteration)
		}
		p.turns[t.Iteration] = t.Response
		p.last = max(p.last, t.Iteration)
	}
	return p, nil
}

// Turns is how many model turns the bundle recorded.
func (p *Provider) Turns() int { return len(p.turns) }

// Complete implements provider.Provider: it answers the recorded response of
// req.Iteration.
func (p *Provider) Complete(_ context.Context, req provider.Request) (envelope.ModelResponse, error) {
	r, ok := p.turns[req.Iteration]
	if !ok {
		return envelope.ModelResponse{}, fmt.Errorf("%w: replay of run %s: the recorded run made no model call at iteration %d (it recorded %d, the last at iteration %d)",
			ErrDiverged, p.runID, req.Iteration, len(p.turns), p.last)
	}
	r.ToolCalls = slices.Clone(r.ToolCalls)
	return r, nil
}

// Stream implements provider.Streamer: the recorded response, in pieces of
// provider.DefaultChunkBytes.
func (p *Provider) Stream(ctx context.Context, req provider.Request, onDelta func(provider.Delta)) (envelope.ModelResponse, error) {
	r, err := p.Complete(ctx, req)
	if err != nil {
		return r, err
	}
	provider.Chunks(r, provider.DefaultChunkBytes, onDelta)
	return r, nil
}

package orchestrator

import (
	"context"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// complete is one model call: streamed to the run's watchers when the
// agent streams and the provider can (pkg/events/delta.go), else a plain
// Complete. A delta that cannot be published is dropped, never the call:
// the turn event is the record, and the deltas are for watching it grow.
func (s *Service) complete(ctx context.Context, prov provider.Provider, agent envelope.Agent, req provider.Request) (envelope.ModelResponse, error) {
	st, ok := prov.(provider.Streamer)
	if !agent.Stream || !ok {
		return prov.Complete(ctx, req)
	}
	subject, err := events.DeltaSubject(req.RunID, req.Iteration)
	if err != nil {
		return prov.Complete(ctx, req)
	}
	p := deltaPublisher{nc: s.JS.Conn(), subject: subject, d: events.Delta{RunID: req.RunID, Iteration: req.Iteration, Attempt: 1}}
	resp, err := st.Stream(ctx, req, p.publish)
	if err != nil {
		// What this attempt streamed is void: the run fails or the
		// message is redelivered, and watchers must not keep it.
		p.publish(provider.Delta{Discard: true})
	}
	s.metrics.deltas.Add(float64(p.d.Seq))
	return resp, err
}

// deltaPublisher numbers and publishes one model call's deltas.
type deltaPublisher struct {
	nc      *nats.Conn
	subject string
	d       events.Delta
}

func (p *deltaPublisher) publish(d provider.Delta) {
	// A piece larger than a delta holds (never seen: providers send a few
	// tokens) goes in several.
	const piece = events.MaxDeltaBytes / 2
	switch {
	case d.Discard:
		p.send(events.Delta{Discarded: true})
		p.d.Attempt++
	case d.ToolCall != nil:
		tc := d.ToolCall
		args := tc.Arguments
		first := true
		for first || args != "" {
			n := cut(args, piece)
			c := &events.DeltaToolCall{Index: tc.Index, Arguments: args[:n]}
			if first {
				c.ID, c.Name = tc.ID, tc.Name
			}
			if c.ID != "" || c.Name != "" || c.Arguments != "" {
				p.send(events.Delta{ToolCall: c})
			}
			args, first = args[n:], false
		}
	default:
		text := d.Text
		for text != "" {
			n := cut(text, piece)
			p.send(events.Delta{Text: text[:n]})
			text = text[n:]
		}
	}
}

// cut is where the first piece of s of at most n bytes ends, between runes.
func cut(s string, n int) int {
	if len(s) <= n {
		return len(s)
	}
	for i := n; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return i
		}
	}
	return n
}

func (p *deltaPublisher) send(d events.Delta) {
	p.d.Seq++
	d.RunID, d.Iteration, d.Attempt, d.Seq = p.d.RunID, p.d.Iteration, p.d.Attempt, p.d.Seq
	b, err := events.EncodeDelta(d)
	if err != nil {
		return
	}
	_ = p.nc.Publish(p.subject, b)
}

package publish

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
)

// Pending is an event published without waiting for its PubAck. Whoever
// publishes it must Wait for it (and Retry on failure) before treating the
// event as stored: acknowledging a delivery before then would lose it.
type Pending struct {
	p   *Publisher
	out events.Outgoing
	msg *nats.Msg
	f   jetstream.PubAckFuture
}

// PublishAsync publishes one event and returns at once: its PubAck round trip
// overlaps whatever the caller does next. The message carries the event id as
// Nats-Msg-Id like Publish, so a Retry or a later publish of the same event is
// dropped as a duplicate.
func (p *Publisher) PublishAsync(ctx context.Context, out events.Outgoing) (*Pending, error) {
	m, err := out.Msg()
	if err != nil {
		return nil, err
	}
	events.InjectHop(ctx, m.Header)
	f, err := p.js.PublishMsgAsync(m)
	if err != nil {
		return nil, fmt.Errorf("publish %s %s: %w", out.Event.Type(), out.Event.ID(), err)
	}
	return &Pending{p: p, out: out, msg: m, f: f}, nil
}

// Wait returns nil once JetStream has stored the event, or the error of its
// publish (or ctx's).
func (pd *Pending) Wait(ctx context.Context) error {
	ctx, cancel := pd.p.ctx(ctx)
	defer cancel()
	select {
	case <-pd.f.Ok():
		return nil
	case err := <-pd.f.Err():
		return fmt.Errorf("publish %s %s: %w", pd.out.Event.Type(), pd.out.Event.ID(), err)
	case <-ctx.Done():
		return fmt.Errorf("publish %s %s: %w", pd.out.Event.Type(), pd.out.Event.ID(), ctx.Err())
	}
}

// Retry publishes the same message again and waits for its PubAck; a copy
// stored meanwhile makes it a duplicate.
func (pd *Pending) Retry(ctx context.Context) error {
	ctx, cancel := pd.p.ctx(ctx)
	defer cancel()
	if _, err := pd.p.js.PublishMsg(ctx, pd.msg); err != nil {
		return fmt.Errorf("publish %s %s: %w", pd.out.Event.Type(), pd.out.Event.ID(), err)
	}
	return nil
}

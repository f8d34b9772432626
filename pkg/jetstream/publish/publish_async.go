package publish

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
)

// Pending is an event published without waiting for its PubAck. Whoever
// publishes it must Wait for it (and Retry on failure) before treating the
// event as stored: acknowledging a delivery before then would lose it.
//
// A failed Wait or Retry is logged and counted as every failed publish is
// (Publisher). A Pending dropped without either is not lost silently
// either: once the garbage collector finds it unreachable (the runtime
// collects at least every two minutes), its PubAck is awaited, within the
// publisher's timeout, and an event that was not stored is logged and
// counted.
type Pending struct {
	p   *Publisher
	msg *nats.Msg
	*pendingState
}

// pendingState is what the cleanup of a dropped Pending reads: it must not
// reach the Pending itself.
type pendingState struct {
	out    events.Outgoing
	f      jetstream.PubAckFuture
	waited atomic.Bool // Wait or Retry was called
}

// PublishAsync publishes one event and returns at once: its PubAck round trip
// overlaps whatever the caller does next. The message carries the event id as
// Nats-Msg-Id like Publish, so a Retry or a later publish of the same event is
// dropped as a duplicate.
func (p *Publisher) PublishAsync(ctx context.Context, out events.Outgoing) (*Pending, error) {
	m, err := out.Msg()
	if err != nil {
		return nil, p.failed(&out, err, msgFailed)
	}
	events.InjectHop(ctx, m.Header)
	f, err := p.js.PublishMsgAsync(m)
	if err != nil {
		return nil, p.failed(&out, fmt.Errorf("publish %s %s: %w", out.Event.Type(), out.Event.ID(), err), msgFailed)
	}
	pd := &Pending{p: p, msg: m, pendingState: &pendingState{out: out, f: f}}
	runtime.AddCleanup(pd, p.dropped, pd.pendingState)
	return pd, nil
}

// dropped runs once a Pending is unreachable: when nobody waited for it, it
// awaits its PubAck (bounded by the publisher's timeout) on a goroutine of
// its own, and reports an event that was not stored.
func (p *Publisher) dropped(st *pendingState) {
	if st.waited.Load() {
		return
	}
	go func() {
		t := time.NewTimer(p.timeout)
		defer t.Stop()
		var err error
		select {
		case <-st.f.Ok():
			return
		case err = <-st.f.Err():
		case <-t.C:
			err = fmt.Errorf("no PubAck within %s", p.timeout)
		}
		p.failed(&st.out, fmt.Errorf("publish %s %s: %w", st.out.Event.Type(), st.out.Event.ID(), err),
			"publish failed, and its Pending was dropped without Wait: event not stored")
	}()
}

// Wait returns nil once JetStream has stored the event, or the error of its
// publish (or ctx's).
func (pd *Pending) Wait(ctx context.Context) error {
	pd.waited.Store(true)
	ctx, cancel := pd.p.ctx(ctx)
	defer cancel()
	var err error
	select {
	case <-pd.f.Ok():
		return nil
	case err = <-pd.f.Err():
	case <-ctx.Done():
		err = ctx.Err()
	}
	return pd.p.failed(&pd.out, fmt.Errorf("publish %s %s: %w", pd.out.Event.Type(), pd.out.Event.ID(), err), msgFailed)
}

// Retry publishes the same message again and waits for its PubAck; a copy
// stored meanwhile makes it a duplicate.
func (pd *Pending) Retry(ctx context.Context) error {
	pd.waited.Store(true)
	ctx, cancel := pd.p.ctx(ctx)
	defer cancel()
	if _, err := pd.p.js.PublishMsg(ctx, pd.msg); err != nil {
		return pd.p.failed(&pd.out, fmt.Errorf("publish %s %s: %w", pd.out.Event.Type(), pd.out.Event.ID(), err), msgFailed)
	}
	return nil
}

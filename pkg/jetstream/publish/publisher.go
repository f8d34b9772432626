package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
)

// Publisher publishes events to JetStream and waits for their PubAcks. Each
// message carries its event id as Nats-Msg-Id (a retried publish is dropped as
// a duplicate) and the hop's trace context.
//
// A publish that fails (its event is not confirmed stored: no PubAck, an
// error, the caller's deadline) is never silent: besides the error its call
// returns, it is logged (subject, event id and type, error) and counted by
// the Observer. A PublishFirst refused because its subject holds an event
// already is no failure.
type Publisher struct {
	js      jetstream.JetStream
	timeout time.Duration
	log     *slog.Logger
	obs     Observer
}

// Observer hears of every publish that failed, for metrics (see
// service.ConsumerMetrics). Each failed call counts once: a caller that
// retries counts each failed attempt, and a Pending that fails its Wait
// counts once, whether or not its Retry then succeeds.
type Observer interface {
	PublishFailed(eventType string)
}

// Option configures a Publisher.
type Option func(*Publisher)

// WithObserver has o hear of every failed publish; nil: none.
func WithObserver(o Observer) Option { return func(p *Publisher) { p.obs = o } }

// WithLogger logs failed publishes on log; default slog.Default().
func WithLogger(log *slog.Logger) Option { return func(p *Publisher) { p.log = log } }

// NewPublisher returns a publisher on js.
func NewPublisher(js jetstream.JetStream, opts ...Option) *Publisher {
	p := &Publisher{js: js, timeout: 10 * time.Second}
	for _, o := range opts {
		o(p)
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	return p
}

// failed logs and counts a publish of out that did not get its event stored
// and returns err.
func (p *Publisher) failed(out *events.Outgoing, err error, msg string) error {
	p.log.Error(msg, "subject", out.Subject, "event_id", out.Event.ID(), "event_type", out.Event.Type(), "err", err)
	if p.obs != nil {
		p.obs.PublishFailed(out.Event.Type())
	}
	return err
}

// msgFailed is what failed logs for a publish whose call returns its error.
const msgFailed = "publish failed: event not confirmed stored"

// JetStream returns the underlying JetStream handle.
func (p *Publisher) JetStream() jetstream.JetStream { return p.js }

func (p *Publisher) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, p.timeout)
}

// Publish publishes one event and waits until JetStream has stored it.
func (p *Publisher) Publish(ctx context.Context, out events.Outgoing) error {
	_, err := p.PublishAck(ctx, out)
	return err
}

// PublishAck is Publish that returns the stream's acknowledgement: its
// Duplicate says that an event of that id was stored already (the stored
// one stands, not this one).
func (p *Publisher) PublishAck(ctx context.Context, out events.Outgoing) (*jetstream.PubAck, error) {
	ack, err := p.publish(ctx, out)
	if err != nil {
		return nil, p.failed(&out, err, msgFailed)
	}
	return ack, nil
}

// PublishFirst publishes out only when its subject holds no event yet: it
// reports whether out was stored. False, without an error, means the subject
// had an event already (this one, a duplicate of its id; or another, which
// the stream refused to put beside it). It is how an event that must be the
// only one on its subject (a run's turn, a run's end) stays the only one
// whoever else publishes there, and however long after.
func (p *Publisher) PublishFirst(ctx context.Context, out events.Outgoing) (bool, error) {
	ack, err := p.publish(ctx, out, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case WrongLastSequence(err):
		return false, nil
	case err != nil:
		return false, p.failed(&out, err, msgFailed)
	}
	return !ack.Duplicate, nil
}

func (p *Publisher) publish(ctx context.Context, out events.Outgoing, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	m, err := out.Msg()
	if err != nil {
		return nil, err
	}
	events.InjectHop(ctx, m.Header)
	ctx, cancel := p.ctx(ctx)
	defer cancel()
	ack, err := p.js.PublishMsg(ctx, m, opts...)
	if err != nil {
		return nil, fmt.Errorf("publish %s %s: %w", out.Event.Type(), out.Event.ID(), err)
	}
	return ack, nil
}

// FirstOnSubject reports whether a stored message was published on the
// condition that its subject held no message (Nats-Expected-Last-Subject-
// Sequence 0, checked against its own subject), spelled as the server reads
// it: the stream stored it only if that held, so no message was on its
// subject before it (in this stream, which sources from none). Any other
// spelling, value or override subject says nothing, as the server ignored
// or checked something else.
func FirstOnSubject(h nats.Header) bool {
	return h.Get(jetstream.ExpectedLastSubjSeqHeader) == "0" && h.Get(jetstream.ExpectedLastSubjSeqSubjHeader) == ""
}

// WrongLastSequence reports whether a publish was refused because its
// subject was not at the sequence it expected (10071, or 10164 on a
// replicated stream).
func WrongLastSequence(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) &&
		(api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// PublishAll publishes the events concurrently and waits for every PubAck; the
// first failure is returned after all have settled. Order of storage is not
// guaranteed between the events.
func (p *Publisher) PublishAll(ctx context.Context, outs []events.Outgoing) error {
	switch len(outs) {
	case 0:
		return nil
	case 1:
		return p.Publish(ctx, outs[0])
	}
	ctx, cancel := p.ctx(ctx)
	defer cancel()
	type sent struct {
		out *events.Outgoing
		f   jetstream.PubAckFuture
	}
	futures := make([]sent, 0, len(outs))
	var errs []error
	for i := range outs {
		out := &outs[i]
		m, err := out.Msg()
		if err != nil {
			errs = append(errs, p.failed(out, err, msgFailed))
			continue
		}
		events.InjectHop(ctx, m.Header)
		f, err := p.js.PublishMsgAsync(m)
		if err != nil {
			errs = append(errs, p.failed(out, fmt.Errorf("publish %s %s: %w", out.Event.Type(), out.Event.ID(), err), msgFailed))
			continue
		}
		futures = append(futures, sent{out, f})
	}
	for _, s := range futures {
		var err error
		select {
		case <-s.f.Ok():
			continue
		case err = <-s.f.Err():
		case <-ctx.Done():
			err = ctx.Err()
		}
		errs = append(errs, p.failed(s.out, fmt.Errorf("publish %s %s on %s: %w", s.out.Event.Type(), s.out.Event.ID(),
			s.out.Subject, err), msgFailed))
	}
	return errors.Join(errs...)
}

package timers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// The timer stream: a durable alarm clock on JetStream. A timer is one
// message with a per-message TTL (NATS 2.11) on its own subject; when the TTL
// runs out the server removes it and, as the stream keeps subject delete
// markers, stores a marker on that subject in its place. A durable consumer
// of the stream hears the markers: each fires its timer once, on one replica
// of whichever service consumes it, and a marker not yet handled survives a
// restart of every replica (it lives SubjectDeleteMarkerTTL). A handled
// marker is deleted, so the stream holds one message per armed timer and
// nothing for the timers that fired.
// The stream is provision.StreamTimers, on provision.SubjectsTimers.

// TimerSubject is the subject of the timer id of a kind ("run"):
// toolwire.timer.<kind>.<id>. Both are single safe tokens.
func TimerSubject(kind, id string) (string, error) {
	if err := events.ValidateRunID(kind); err != nil {
		return "", fmt.Errorf("timer kind: %w", err)
	}
	if err := events.ValidateRunID(id); err != nil {
		return "", fmt.Errorf("timer id: %w", err)
	}
	return events.Prefix + ".timer." + kind + "." + id, nil
}

// MinTimer and MaxTimer bound what a timer may wait: the server counts a
// message's TTL in whole seconds.
const (
	MinTimer = time.Second
	MaxTimer = 7 * 24 * time.Hour
)

// ArmTimer sets the timer id of kind to fire at (the server counts in whole
// seconds: at the earliest MinTimer from now, else at rounded up). Arming it
// again for the same time within the stream's duplicate window changes
// nothing (the message id is the timer's and its time); arming it for
// another time replaces it (one message per subject).
func ArmTimer(ctx context.Context, js jetstream.JetStream, kind, id string, at time.Time) error {
	m, ttl, err := timerMsg(kind, id, at)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timerTimeout)
		defer cancel()
	}
	if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgTTL(ttl)); err != nil {
		return fmt.Errorf("arm timer %s: %w", m.Subject, err)
	}
	return nil
}

// timerTimeout bounds the arming of a timer whose context has no deadline.
const timerTimeout = 10 * time.Second

// ArmingTimer is a timer whose arming is on its way (StartTimer): the
// server may not have stored it yet. Whoever started it must Wait before
// treating it as set.
type ArmingTimer struct {
	js  jetstream.JetStream
	m   *nats.Msg
	ttl time.Duration
	f   jetstream.PubAckFuture
}

// StartTimer is ArmTimer without waiting for the server's answer: the
// timer's publish overlaps whatever the caller does next, and Wait says
// whether it was stored. An error here is one of the timer (an unsafe id, a
// time too far) or of the connection.
func StartTimer(js jetstream.JetStream, kind, id string, at time.Time) (*ArmingTimer, error) {
	m, ttl, err := timerMsg(kind, id, at)
	if err != nil {
		return nil, err
	}
	f, err := js.PublishMsgAsync(m, jetstream.WithMsgTTL(ttl))
	if err != nil {
		return nil, fmt.Errorf("arm timer %s: %w", m.Subject, err)
	}
	return &ArmingTimer{js: js, m: m, ttl: ttl, f: f}, nil
}

// Wait returns nil once the server has stored the timer. When the publish
// failed it is made again, and waited for (the timer's message id makes a
// copy stored meanwhile a duplicate); its error, or ctx's, is returned.
func (a *ArmingTimer) Wait(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timerTimeout)
		defer cancel()
	}
	select {
	case <-a.f.Ok():
		return nil
	case <-a.f.Err():
	case <-ctx.Done():
		return fmt.Errorf("arm timer %s: %w", a.m.Subject, ctx.Err())
	}
	if _, err := a.js.PublishMsg(ctx, a.m, jetstream.WithMsgTTL(a.ttl)); err != nil {
		return fmt.Errorf("arm timer %s: %w", a.m.Subject, err)
	}
	return nil
}

// timerMsg is the message that arms the timer id of kind for at, and its
// TTL.
func timerMsg(kind, id string, at time.Time) (*nats.Msg, time.Duration, error) {
	subj, err := TimerSubject(kind, id)
	if err != nil {
		return nil, 0, err
	}
	d := time.Until(at)
	if d > MaxTimer {
		return nil, 0, fmt.Errorf("timer %s: %s is further than %s", subj, d, MaxTimer)
	}
	if r := d % time.Second; r != 0 {
		d += time.Second - r
	}
	d = max(MinTimer, d)
	m := nats.NewMsg(subj)
	m.Header.Set(events.HeaderMsgID, "timer/"+kind+"/"+id+"/"+strconv.FormatInt(at.Unix(), 10))
	m.Data = []byte(at.UTC().Format(time.RFC3339Nano))
	return m, d, nil
}

// TimerHandler handles a timer that fired. Returning nil settles it; an error
// calls it again later, with back-off, until it returns nil: a timer is never
// dropped. It must be idempotent.
type TimerHandler func(ctx context.Context, kind, id string) error

// TimerConfig configures a TimerRunner.
type TimerConfig struct {
	Durable string // the consumer's name
	Kind    string // the timers it fires (toolwire.timer.<Kind>.*)
	Handler TimerHandler
	// Concurrency bounds the handlers at once in this replica; default 4.
	Concurrency int
	// AckWait is how long a fired timer stays with one replica before
	// another gets it; default 30s. A handler runs for at most two thirds
	// of it.
	AckWait time.Duration
	Backoff func(attempt uint64) time.Duration // default DefaultBackoff
	Logger  *slog.Logger
}

// TimerRunner fires the timers of one kind: it consumes the timer stream's
// subject delete markers (each a timer whose TTL ran out), hands each to the
// handler, and deletes it once handled. The timers being armed pass by too
// and are acknowledged at once.
type TimerRunner struct {
	js     jetstream.JetStream
	cfg    TimerConfig
	log    *slog.Logger
	stream jetstream.Stream
	cc     jetstream.ConsumeContext
	sem    chan struct{}
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

// NewTimerRunner returns a runner of cfg on js; Start starts it.
func NewTimerRunner(js jetstream.JetStream, cfg TimerConfig) (*TimerRunner, error) {
	if cfg.Handler == nil {
		return nil, errors.New("timer runner: nil handler")
	}
	if cfg.Durable == "" {
		return nil, errors.New("timer runner: durable is required")
	}
	if err := events.ValidateRunID(cfg.Kind); err != nil {
		return nil, fmt.Errorf("timer runner: kind: %w", err)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.Backoff == nil {
		cfg.Backoff = consume.DefaultBackoff
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &TimerRunner{js: js, cfg: cfg, sem: make(chan struct{}, cfg.Concurrency),
		log: cfg.Logger.With("consumer", cfg.Durable, "stream", provision.StreamTimers)}, nil
}

// Start creates or updates the durable consumer and starts firing timers;
// ctx bounds the start only.
func (t *TimerRunner) Start(ctx context.Context) error {
	st, err := t.js.Stream(ctx, provision.StreamTimers)
	if err != nil {
		return fmt.Errorf("timer runner: stream %s: %w", provision.StreamTimers, err)
	}
	t.stream = st
	c, err := provision.EnsureConsumer(ctx, t.js, provision.ConsumerSpec{Stream: provision.StreamTimers, Durable: t.cfg.Durable,
		Filters: []string{events.Prefix + ".timer." + t.cfg.Kind + ".*"}, AckWait: t.cfg.AckWait, MaxAckPending: 4096})
	if err != nil {
		return fmt.Errorf("timer runner: %w", err)
	}
	t.ctx, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	cc, err := c.Consume(t.dispatch, jetstream.PullMaxMessages(4*t.cfg.Concurrency), jetstream.PullExpiry(consume.PullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) && !errors.Is(err, nats.ErrConnectionClosed) {
				t.log.Warn("consume", "err", err)
			}
		}))
	if err != nil {
		t.cancel()
		return fmt.Errorf("timer runner: consume %s: %w", t.cfg.Durable, err)
	}
	t.cc = cc
	return nil
}

// Stop stops pulling and waits for the handlers in flight (bounded by ctx);
// a timer whose handler did not finish fires again on another replica. It is
// idempotent.
func (t *TimerRunner) Stop(ctx context.Context) error {
	var err error
	t.once.Do(func() {
		if t.cc == nil {
			return
		}
		t.cc.Drain()
		done := make(chan struct{})
		go func() { <-t.cc.Closed(); t.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = fmt.Errorf("stop %s: %w", t.cfg.Durable, ctx.Err())
		}
		t.cancel()
	})
	return err
}

// isTimerFired reports whether m is the server's marker of a timer whose TTL
// ran out (rather than a timer being armed, or the marker of a purge).
func isTimerFired(m jetstream.Msg) bool {
	return m.Headers().Get(jetstream.MarkerReasonHeader) == "MaxAge"
}

func (t *TimerRunner) dispatch(m jetstream.Msg) {
	if !isTimerFired(m) {
		_ = m.Ack() // a timer being armed, or one removed on purpose
		return
	}
	t.sem <- struct{}{}
	t.wg.Add(1)
	go func() {
		defer func() { <-t.sem; t.wg.Done() }()
		t.fire(m)
	}()
}

// fire runs the handler of a fired timer and settles the marker.
func (t *TimerRunner) fire(m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		return
	}
	kind, id, ok := timerOf(m.Subject())
	if !ok {
		t.log.Error("timer on an unexpected subject", "subject", m.Subject())
		_ = m.Term()
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.AckWait*2/3)
	err = t.safeHandle(ctx, kind, id)
	cancel()
	if err != nil {
		delay := t.cfg.Backoff(meta.NumDelivered)
		t.log.Warn("timer handler failed; will retry", "kind", kind, "id", id, "attempt", meta.NumDelivered,
			"retry_in", delay, "err", err)
		_ = m.NakWithDelay(delay)
		return
	}
	if err := m.Ack(); err != nil {
		t.log.Warn("timer ack", "kind", kind, "id", id, "err", err)
		return
	}
	// Handled: the marker goes, so that the stream holds only armed
	// timers. If this fails the marker expires on its own.
	dctx, cancel := context.WithTimeout(t.ctx, 5*time.Second)
	defer cancel()
	if err := t.stream.DeleteMsg(dctx, meta.Sequence.Stream); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.log.Debug("fired timer not deleted; it expires on its own", "kind", kind, "id", id, "err", err)
	}
}

func (t *TimerRunner) safeHandle(ctx context.Context, kind, id string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("timer handler panic: %v", p)
		}
	}()
	return t.cfg.Handler(ctx, kind, id)
}

// timerOf parses toolwire.timer.<kind>.<id>.
func timerOf(subject string) (kind, id string, ok bool) {
	const p = events.Prefix + ".timer."
	if len(subject) <= len(p) || subject[:len(p)] != p {
		return "", "", false
	}
	rest := subject[len(p):]
	for i := 0; i < len(rest); i++ {
		if rest[i] == '.' {
			kind, id = rest[:i], rest[i+1:]
			return kind, id, events.ValidateRunID(kind) == nil && events.ValidateRunID(id) == nil
		}
	}
	return "", "", false
}

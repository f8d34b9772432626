package consume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Dead-letter headers added to a message moved to the DLQ stream.
const (
	HeaderDLQSubject    = "Toolwire-Dlq-Subject"
	HeaderDLQStream     = "Toolwire-Dlq-Stream"
	HeaderDLQConsumer   = "Toolwire-Dlq-Consumer"
	HeaderDLQStreamSeq  = "Toolwire-Dlq-Stream-Seq"
	HeaderDLQDeliveries = "Toolwire-Dlq-Deliveries"
	HeaderDLQError      = "Toolwire-Dlq-Error"
	HeaderDLQTime       = "Toolwire-Dlq-Time"
)

// DLQSubject is where a consumer's dead letters go: toolwire.dlq.<stream>.<durable>.
func DLQSubject(stream, durable string) string {
	return events.Prefix + ".dlq." + stream + "." + durable
}

// Delivery is one event handed to a Handler.
type Delivery struct {
	Event   *event.Event
	Subject string
	// Attempt is 1 on the first delivery; it counts the redeliveries and
	// this replica's retries in place after a transient failure, so that a
	// handler that sees more than 1 knows an earlier try may have done part
	// of its work.
	Attempt uint64
	Msg     jetstream.Msg
	// Meta is Msg's metadata (stream, sequences, time), parsed once.
	Meta *jetstream.MsgMetadata

	// keep takes Msg out of its runner's keep-alive set; nil on a batch
	// handler's delivery. held is set by Hold.
	keep func()
	held *Held
}

// Hold takes the message over from the runner: when the handler returns
// nil the runner does not acknowledge it, and the returned Held does, when
// its holder says (Ack), or hands it back for redelivery (Nak). Until then
// the runner keeps it alive (InProgress), so it is redelivered only if this
// process dies or the holder hands it back; a handler that fails voids the
// hold, and the runner settles the message as usual. A holder that stays
// while the runner stops must settle it itself: past Stop it is no longer
// kept alive, and is redelivered after the consumer's AckWait.
//
// It returns nil on a batch handler's delivery (whose messages are settled
// with their batch) and on a second call.
func (d *Delivery) Hold() *Held {
	if d.keep == nil || d.held != nil || d.Msg == nil {
		return nil
	}
	d.held = &Held{msg: d.Msg, release: d.keep}
	return d.held
}

// Held is a message a handler took over (Delivery.Hold). Its methods settle
// it once; the first call wins, later ones do nothing and return nil.
type Held struct {
	msg     jetstream.Msg
	release func()
	once    sync.Once
	void    bool // the handler failed: the runner settled it
}

// Ack acknowledges the held message.
func (h *Held) Ack() error { return h.settle(func() error { return h.msg.Ack() }) }

// Nak hands the held message back, to be redelivered after delay.
func (h *Held) Nak(delay time.Duration) error {
	return h.settle(func() error { return h.msg.NakWithDelay(delay) })
}

func (h *Held) settle(fn func() error) error {
	var err error
	h.once.Do(func() {
		if h.void {
			return
		}
		h.release()
		err = fn()
	})
	return err
}

// Handler processes one event. Returning nil acknowledges it; an error
// redelivers it with back-off until the consumer's MaxDeliver, then moves it to
// the dead-letter stream. Wrap an error with Permanent to dead-letter at once.
// A transient error (IsTransient: NATS or JetStream did not answer) is no
// failure of the handler: the runner calls it again in place, with back-off,
// keeping the message alive, and the delivery budget is untouched.
// Handlers must be idempotent: delivery is at least once.
type Handler func(ctx context.Context, d *Delivery) error

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	Spec        provision.ConsumerSpec
	Handler     Handler
	Concurrency int // handlers at once in this replica; default 16
	Logger      *slog.Logger
	// Backoff returns the redelivery delay after a failed attempt; default
	// 100ms doubling up to 10s.
	Backoff func(attempt uint64) time.Duration
	// Poll, when set, makes the runner fetch what is waiting (up to
	// Concurrency messages) every Poll instead of having each message
	// pushed as it is stored: a consumer off the critical path (the
	// recorder) then wakes once per interval with a batch, rather than
	// once per event beside the services that are waiting for it.
	Poll time.Duration
	// Batch, with Poll, handles each fetch's events in one call instead of
	// Handler once per event: decoded in order on one goroutine, with at
	// most two fetches in hand (one written while the next is decoded). It
	// returns one error per delivery, treated as Handler's would be. A
	// consumer off the critical path then never has a goroutine per event
	// runnable at once beside the services that are waiting for the CPU.
	Batch BatchHandler
	// Observer hears of failures and dead letters, for metrics; nil: none.
	Observer Observer
	// Undecodable, when set, hears of a message that is not an event (its
	// CloudEvent cannot be decoded) before it is dead-lettered: the
	// orchestrator answers such a run request with its run's failed event.
	// Its error is logged; the message is dead-lettered either way.
	Undecodable func(ctx context.Context, subject string, cause error) error
	// TransientRetryFor bounds how long a message whose handler keeps
	// failing transiently (IsTransient) is retried in place before it is
	// handed back for redelivery; default DefaultTransientRetryFor. Those
	// retries use none of the message's delivery budget.
	TransientRetryFor time.Duration
}

// DefaultTransientRetryFor is how long a message is retried in place while
// the infrastructure fails: longer than a leader election or a node's
// restart.
const DefaultTransientRetryFor = 5 * time.Minute

// TransientObserver is an Observer that also hears of retries in place after
// a transient failure (RunnerConfig.TransientRetryFor).
type TransientObserver interface {
	TransientRetried(stream, consumer string)
}

// Observer hears what happens to a runner's deliveries that did not simply
// succeed; a service counts them (see service.ConsumerMetrics).
type Observer interface {
	// HandlerFailed: a handler returned an error (permanent, or to be
	// retried).
	HandlerFailed(stream, consumer string, permanent bool)
	// Redelivered: a message came back for another attempt.
	Redelivered(stream, consumer string)
	// DeadLettered: a message moved to the dead-letter stream, stored as how
	// says: DeadLetterInline, DeadLetterObject or DeadLetterTruncated.
	DeadLettered(stream, consumer, how string)
}

// How a dead letter was stored (Observer.DeadLettered).
const (
	DeadLetterInline    = "inline"    // headers and body in the dead-letter message
	DeadLetterObject    = "object"    // too large: the whole message in ObjectDeadLetters
	DeadLetterTruncated = "truncated" // too large and the object store failed: body cut, size and hash kept
)

// BatchHandler processes the events of one fetch; errs[i] is the outcome of
// ds[i], as Handler's.
type BatchHandler func(ctx context.Context, ds []*Delivery) (errs []error)

// batchesInHand bounds the fetches a Batch runner holds: one being written
// while the next one is decoded.
const batchesInHand = 2

// Runner consumes one durable pull consumer with a bounded pool of handlers.
// Start it once; Stop drains: it stops pulling, lets handlers in flight finish
// and acknowledge, and only then returns.
type Runner struct {
	js  jetstream.JetStream
	cfg RunnerConfig
	log *slog.Logger
	sem chan struct{}
	wg  sync.WaitGroup
	// jobs hands a message to an idle worker; workers counts the workers,
	// which end once the runner's context is cancelled (Stop).
	jobs    chan job
	workers sync.WaitGroup
	// batches holds a token per fetch in hand (RunnerConfig.Batch).
	batches chan struct{}
	cc      jetstream.ConsumeContext
	cons    jetstream.Consumer // set by Start (Lag)
	ctx     context.Context
	cancel  context.CancelFunc
	once    sync.Once
	// pollStop and pollDone run the polling loop (RunnerConfig.Poll);
	// nudge wakes it before its interval is over (Nudge).
	pollStop chan struct{}
	pollDone chan struct{}
	nudge    chan struct{}
	// mu orders wg.Add in dispatch before the wg.Wait of Stop: once closing
	// is set, a late dispatch (after a drain that ran out of time) hands its
	// message back instead of starting a handler.
	mu      sync.Mutex
	closing bool
	// failures is the failure history of the messages being retried (dlq.go).
	failures failureLog
	// alive holds the messages in hand, kept alive by one ticker loop
	// (keepAliveLoop) rather than a goroutine and a ticker per message.
	alive     aliveSet
	aliveStop chan struct{}
	aliveDone chan struct{}
	// stopping is closed when Stop begins: retries in place give up then,
	stopping chan struct{}
}

// NewRunner returns a runner for cfg on js.
func NewRunner(js jetstream.JetStream, cfg RunnerConfig) (*Runner, error) {
	if cfg.Handler == nil && cfg.Batch == nil {
		return nil, errors.New("runner: nil handler")
	}
	if cfg.Batch != nil && cfg.Poll <= 0 {
		return nil, errors.New("runner: a batch handler needs Poll")
	}
	if cfg.Spec.Stream == "" || cfg.Spec.Durable == "" {
		return nil, errors.New("runner: stream and durable are required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Backoff == nil {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.TransientRetryFor <= 0 {
		cfg.TransientRetryFor = DefaultTransientRetryFor
	}
	return &Runner{
		js: js, cfg: cfg, sem: make(chan struct{}, cfg.Concurrency), jobs: make(chan job),
		batches: make(chan struct{}, batchesInHand), stopping: make(chan struct{}), nudge: make(chan struct{}, 1),
		log: cfg.Logger.With("consumer", cfg.Spec.Durable, "stream", cfg.Spec.Stream),
	}, nil
}

// PullExpiry is how long one pull request of a runner lives. A pull the
// server lost (the consumer's leader moved to another node: a node died, an
// election) is noticed by its missing heartbeats (every half of it) and
// replaced within it, rather than after nats.go's default 30s, during which
// the consumer hands this replica nothing.
const PullExpiry = 5 * time.Second

// DefaultBackoff doubles from 100ms up to 10s.
func DefaultBackoff(attempt uint64) time.Duration {
	d := 100 * time.Millisecond
	for i := uint64(1); i < attempt && d < 10*time.Second; i++ {
		d *= 2
	}
	return min(d, 10*time.Second)
}

// Start creates or updates the consumer and starts pulling. The handlers' base
// context is ctx's values without its cancellation: they are cancelled by Stop,
// after draining.
func (r *Runner) Start(ctx context.Context) error {
	c, err := provision.EnsureConsumer(ctx, r.js, r.cfg.Spec)
	if err != nil {
		return err
	}
	r.cons = c
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.aliveStop, r.aliveDone = make(chan struct{}), make(chan struct{})
	if r.cfg.Poll > 0 {
		r.pollStop, r.pollDone = make(chan struct{}), make(chan struct{})
		go r.pollLoop(c)
		go r.keepAliveLoop()
		return nil
	}
	cc, err := c.Consume(r.dispatch,
		jetstream.PullMaxMessages(r.cfg.Concurrency), jetstream.PullExpiry(PullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) && !errors.Is(err, nats.ErrConnectionClosed) {
				r.log.Warn("consume", "err", err)
			}
		}))
	if err != nil {
		r.cancel()
		return fmt.Errorf("consume %s: %w", r.cfg.Spec.Durable, err)
	}
	r.cc = cc
	go r.keepAliveLoop()
	return nil
}

// pollLoop fetches the messages waiting, up to Concurrency at a time, and
// dispatches them; when fewer came than it asked for, it waits Poll before
// asking again. While its connection is down it does not ask. It ends on
// Stop.
func (r *Runner) pollLoop(c jetstream.Consumer) {
	defer close(r.pollDone)
	t := time.NewTimer(0)
	defer t.Stop()
	nudged := 0 // fetches left that a nudge asked for
	for {
		select {
		case <-r.pollStop:
			return
		case <-t.C:
		case <-r.nudge:
			nudged = nudgeFetches
		}
		if !r.connected() {
			// A pull made now would wait in the client's reconnect buffer,
			// reach the server after the reconnect for a reply inbox the
			// client has stopped listening on (a fetch gives up after its
			// client-side second), and keep the loop from asking again
			// until then. Look again shortly and fetch as soon as the
			// connection is back.
			t.Reset(min(r.cfg.Poll, reconnectPoll))
			continue
		}
		n := 0
		if r.cfg.Batch != nil {
			select { // a token first: at most batchesInHand fetches in hand
			case r.batches <- struct{}{}:
			case <-r.pollStop:
				return
			}
		}
		batch, err := c.FetchNoWait(r.cfg.Concurrency)
		var got []jetstream.Msg
		if err == nil {
			for m := range batch.Messages() {
				n++
				if r.cfg.Batch != nil {
					got = append(got, m)
					continue
				}
				r.dispatch(m)
			}
			err = batch.Error()
		}
		if r.cfg.Batch != nil {
			if len(got) > 0 {
				r.wg.Add(1)
				go r.handleBatch(got)
			} else {
				<-r.batches
			}
		}
		if err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) &&
			!errors.Is(err, nats.ErrConnectionClosed) {
			r.log.Warn("fetch", "err", err)
		}
		switch {
		case n >= r.cfg.Concurrency:
			t.Reset(0)
		case n == 0 && nudged > 1:
			// A live event can come a moment before its stream has
			// stored it: ask again shortly.
			nudged--
			t.Reset(nudgeRetry)
		default:
			nudged = 0
			t.Reset(r.cfg.Poll)
		}
	}
}

// Nudge makes a polling runner (RunnerConfig.Poll) fetch what is waiting now
// rather than at the end of its interval: a reader of the consumer's stream
// that has just heard of a new message live (the recorder, for the runs its
// API's clients wait on) has it handled without waiting out the poll. When
// the fetch finds nothing (the message is not stored yet) it asks again up
// to nudgeFetches times, nudgeRetry apart. It never blocks; nudges that come
// while one is pending are one. A runner that pushes (no Poll) ignores it.
func (r *Runner) Nudge() {
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// nudgeFetches is how many fetches a nudge asks for at most, nudgeRetry
// apart, while they find nothing.
const (
	nudgeFetches = 4
	nudgeRetry   = time.Millisecond
)

// reconnectPoll is how often a polling runner looks whether its connection
// is back, while it is not.
const reconnectPoll = 20 * time.Millisecond

// connected reports whether the runner's connection to NATS is up (or it
// cannot tell).
func (r *Runner) connected() bool {
	nc := r.js.Conn()
	return nc == nil || nc.IsConnected()
}

// Stop stops pulling, waits for the handlers in flight (bounded by ctx) and
// releases the runner. It is idempotent.
func (r *Runner) Stop(ctx context.Context) error {
	var err error
	r.once.Do(func() {
		close(r.stopping)
		switch {
		case r.pollStop != nil:
			close(r.pollStop)
			select {
			case <-r.pollDone:
			case <-ctx.Done():
				err = fmt.Errorf("drain %s: %w", r.cfg.Spec.Durable, ctx.Err())
			}
		case r.cc != nil:
			r.cc.Drain()
			select {
			case <-r.cc.Closed():
			case <-ctx.Done():
				err = fmt.Errorf("drain %s: %w", r.cfg.Spec.Durable, ctx.Err())
			}
		default:
			return
		}
		r.mu.Lock()
		r.closing = true
		r.mu.Unlock()
		done := make(chan struct{})
		go func() { r.wg.Wait(); close(done) }()
		finished := false
		select {
		case <-done:
			finished = true
		case <-ctx.Done():
			err = errors.Join(err, fmt.Errorf("wait handlers of %s: %w", r.cfg.Spec.Durable, ctx.Err()))
		}
		r.cancel()
		if finished {
			r.workers.Wait() // idle: they return at once
		}
		close(r.aliveStop)
		<-r.aliveDone
	})
	return err
}

func (r *Runner) dispatch(m jetstream.Msg) {
	// Keep the message alive from the moment it is ours, also while it waits
	// for a free handler, so that a slow pool never gets it redelivered to
	// another replica meanwhile.
	stopKeepAlive := r.keepAlive(m)
	r.sem <- struct{}{} // back-pressure: block the pull loop when all handlers are busy
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		stopKeepAlive()
		<-r.sem
		_ = m.Nak() // never started: another replica takes it
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	j := job{m: m, done: stopKeepAlive}
	select {
	case r.jobs <- j: // an idle worker takes it
	default:
		r.workers.Add(1)
		go r.work(j)
	}
}

// job is a message handed to a worker, with what releases its keep-alive.
type job struct {
	m    jetstream.Msg
	done func()
}

// work handles j, then each job handed to it, until Stop. Workers outlive
// their messages so that a handler runs on a stack that has already grown to
// what decoding and encoding need: a goroutine per message started at the
// minimum size and copied its stack up on every event, about 6% of the
// pipeline's CPU under load. There are never more workers than Concurrency:
// one is started only when none is idle, and each holds one message of the
// semaphore's.
func (r *Runner) work(j job) {
	defer r.workers.Done()
	for {
		r.run(j)
		select {
		case j = <-r.jobs:
		case <-r.ctx.Done():
			return
		}
	}
}

func (r *Runner) run(j job) {
	held := false
	defer func() {
		if !held {
			j.done()
		}
		<-r.sem
		r.wg.Done()
	}()
	held = r.handle(j)
}

// handle handles j's message and settles it, unless its handler held it
// (Delivery.Hold) and succeeded: then it reports true, and the message
// stays in the keep-alive set until its holder settles it.
func (r *Runner) handle(j job) bool {
	d, ctx, ok := r.delivery(j.m)
	if !ok {
		return false
	}
	d.keep = j.done
	err := r.safeHandle(ctx, d)
	if IsTransient(err) {
		err = r.retryTransient(d, err, func() error { d.voidHold(); return r.safeHandle(ctx, d) })
	}
	if d.held != nil && err == nil {
		return true
	}
	d.voidHold()
	r.settle(ctx, d, err)
	return false
}

// voidHold makes a hold of a handler that failed settle nothing: the
// runner settles the message (or the handler tries again).
func (d *Delivery) voidHold() {
	if d.held != nil {
		d.held.once.Do(func() { d.held.void = true })
		d.held = nil
	}
}

// retryTransient calls again, with back-off, a handler that failed with a
// transient error, as long as it keeps failing so and for at most
// TransientRetryFor: the message stays in hand (kept alive), and neither the
// server's delivery count nor the budget moves. It returns the last outcome;
// a transient one when it gave up (Stop, or the bound), which settle hands
// back for redelivery without counting it as a failure.
func (r *Runner) retryTransient(d *Delivery, err error, again func() error) error {
	until := time.Now().Add(r.cfg.TransientRetryFor)
	for n := uint64(1); IsTransient(err); n++ {
		if !r.waitRetry(d, err, n, until) {
			return err
		}
		d.Attempt++
		err = again()
	}
	return err
}

// waitRetry waits the back-off before retry n in place of d after err; it
// returns false, at once, when the runner stops or the wait would end past
// until.
func (r *Runner) waitRetry(d *Delivery, err error, n uint64, until time.Time) bool {
	delay := r.cfg.Backoff(n)
	if time.Now().Add(delay).After(until) {
		return false
	}
	if n == 1 || n%10 == 0 {
		r.log.Warn("infrastructure failure; retrying in place", "subject", d.Subject, "id", d.Event.ID(),
			"retry", n, "retry_in", delay, "err", err)
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		if obs, ok := r.cfg.Observer.(TransientObserver); ok {
			obs.TransientRetried(d.Meta.Stream, d.Meta.Consumer)
		}
		return true
	case <-r.stopping:
	case <-r.ctx.Done():
	}
	return false
}

// delivery reads m's metadata and event, and the hop's trace context; a
// message without metadata is terminated and one that is no event
// dead-lettered here, and ok is false.
func (r *Runner) delivery(m jetstream.Msg) (d *Delivery, ctx context.Context, ok bool) {
	meta, err := m.Metadata()
	if err != nil {
		r.log.Error("message without metadata", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return nil, nil, false
	}
	ctx = events.ExtractHop(r.ctx, m.Headers())
	if meta.NumDelivered > 1 && r.cfg.Observer != nil {
		r.cfg.Observer.Redelivered(meta.Stream, meta.Consumer)
	}
	if int(meta.NumDelivered) > r.maxDeliver() {
		// Past its budget (its dead-lettering failed, or its handler's
		// process died every time): dead-lettered without another try, so
		// that no message can make a handler run forever.
		r.deadLetter(ctx, m, meta, fmt.Errorf("delivered %d times, past the budget of %d", meta.NumDelivered, r.maxDeliver()))
		return nil, nil, false
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	if err != nil {
		if r.cfg.Undecodable != nil {
			if uerr := r.cfg.Undecodable(ctx, m.Subject(), err); uerr != nil {
				r.log.Error("an undecodable message could not be answered", "subject", m.Subject(), "err", uerr)
			}
		}
		r.deadLetter(ctx, m, meta, fmt.Errorf("decode: %w", err))
		return nil, nil, false
	}
	return &Delivery{Event: ev, Subject: m.Subject(), Attempt: meta.NumDelivered, Msg: m, Meta: meta}, ctx, true
}

// handleBatch decodes a fetch's messages, hands them to the batch handler in
// one call and settles each with its outcome. It holds one token of
// r.batches, released at the end.
func (r *Runner) handleBatch(msgs []jetstream.Msg) {
	defer func() { <-r.batches; r.wg.Done() }()
	var (
		ds   = make([]*Delivery, 0, len(msgs))
		ctxs = make([]context.Context, 0, len(msgs))
	)
	for _, m := range msgs {
		e := r.alive.add(m)
		defer r.alive.remove(e)
		if d, ctx, ok := r.delivery(m); ok {
			ds, ctxs = append(ds, d), append(ctxs, ctx)
		}
	}
	if len(ds) == 0 {
		return
	}
	errs := r.safeBatch(r.ctx, ds)
	r.retryBatchTransient(ds, errs)
	for i, d := range ds {
		r.settle(ctxs[i], d, errs[i])
	}
}

// retryBatchTransient hands the deliveries of a batch that failed
// transiently to the batch handler again, as retryTransient does for one
// delivery, replacing their outcomes in errs.
func (r *Runner) retryBatchTransient(ds []*Delivery, errs []error) {
	until := time.Now().Add(r.cfg.TransientRetryFor)
	for n := uint64(1); ; n++ {
		var again []int
		for i, err := range errs {
			if IsTransient(err) {
				again = append(again, i)
			}
		}
		if len(again) == 0 || !r.waitRetry(ds[again[0]], errs[again[0]], n, until) {
			return
		}
		sub := make([]*Delivery, len(again))
		for k, i := range again {
			ds[i].Attempt++
			sub[k] = ds[i]
		}
		for k, err := range r.safeBatch(r.ctx, sub) {
			errs[again[k]] = err
		}
	}
}

// safeBatch runs the batch handler; a panic, or a handler that answers for
// other than every delivery, fails them all (they are retried).
func (r *Runner) safeBatch(ctx context.Context, ds []*Delivery) (errs []error) {
	defer func() {
		if p := recover(); p != nil {
			errs = slices.Repeat([]error{fmt.Errorf("batch handler panic: %v", p)}, len(ds))
		}
	}()
	errs = r.cfg.Batch(ctx, ds)
	if len(errs) != len(ds) {
		return slices.Repeat([]error{fmt.Errorf("batch handler answered %d outcomes for %d events", len(errs), len(ds))}, len(ds))
	}
	return errs
}

// settle acknowledges d, retries it later or dead-letters it, by herr.
func (r *Runner) settle(ctx context.Context, d *Delivery, herr error) {
	m, meta, ev := d.Msg, d.Meta, d.Event
	switch {
	case herr == nil:
		r.failures.take(meta.Sequence.Stream)
		// A plain Ack, not DoubleAck: the handler's effects are durable
		// before it returns (its publishes have their PubAcks, its writes
		// are committed), so waiting for the server to confirm the ack
		// protects nothing. A lost ack only redelivers the message after
		// AckWait, and handlers are idempotent (at least once).
		if err := m.Ack(); err != nil {
			r.log.Warn("ack", "subject", m.Subject(), "err", err)
		}
	case IsTransient(herr):
		// Retried in place until the bound or Stop: handed back for
		// another replica (or this one, later) without counting as a
		// failure of the handler.
		r.log.Warn("infrastructure failure; message handed back for redelivery", "subject", m.Subject(), "id", ev.ID(),
			"attempt", d.Attempt, "err", herr)
		_ = m.NakWithDelay(r.cfg.Backoff(d.Attempt))
	case IsPermanent(herr) || int(meta.NumDelivered) >= r.maxDeliver():
		if r.cfg.Observer != nil {
			r.cfg.Observer.HandlerFailed(meta.Stream, meta.Consumer, true)
		}
		r.deadLetter(ctx, m, meta, herr)
	default:
		if r.cfg.Observer != nil {
			r.cfg.Observer.HandlerFailed(meta.Stream, meta.Consumer, false)
		}
		r.failures.add(meta.Sequence.Stream, meta.NumDelivered, herr)
		delay := r.cfg.Backoff(meta.NumDelivered)
		r.log.Warn("handler failed; will retry", "subject", m.Subject(), "id", ev.ID(),
			"attempt", meta.NumDelivered, "retry_in", delay, "err", herr)
		_ = m.NakWithDelay(delay)
	}
}

func (r *Runner) maxDeliver() int {
	if r.cfg.Spec.MaxDeliver > 0 {
		return r.cfg.Spec.MaxDeliver
	}
	return 8
}

func (r *Runner) safeHandle(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panic: %v", p)
		}
	}()
	return r.cfg.Handler(ctx, d)
}

// keepAlive tells JetStream the message is still being worked on while a slow
// handler runs, so that it is not redelivered to another replica meanwhile.
// The message joins the set that keepAliveLoop touches; the returned func
// takes it out.
func (r *Runner) keepAlive(m jetstream.Msg) func() {
	e := r.alive.add(m)
	return func() { r.alive.remove(e) }
}

// keepAliveInterval is a third of the consumer's AckWait.
func (r *Runner) keepAliveInterval() time.Duration {
	wait := r.cfg.Spec.AckWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	return wait / 3
}

// keepAliveLoop sends InProgress, every third of AckWait, for each message in
// hand that was already in hand at the previous tick. A message taken at any
// moment is thus touched at most two thirds of AckWait later, then every
// third: before its AckWait runs out, as with a ticker per message; a quick
// message is never touched at all.
func (r *Runner) keepAliveLoop() {
	defer close(r.aliveDone)
	t := time.NewTicker(r.keepAliveInterval())
	defer t.Stop()
	var due []jetstream.Msg
	for {
		select {
		case <-r.aliveStop:
			return
		case <-t.C:
			due = r.alive.due(due[:0])
			for _, m := range due {
				_ = m.InProgress()
			}
			clear(due)
		}
	}
}

// aliveEntry is one message in hand; fresh until the first tick after it
// was taken.
type aliveEntry struct {
	m     jetstream.Msg
	fresh bool
}

// aliveSet is the set of messages in hand.
type aliveSet struct {
	mu sync.Mutex
	m  map[*aliveEntry]struct{}
}

func (a *aliveSet) add(m jetstream.Msg) *aliveEntry {
	e := &aliveEntry{m: m, fresh: true}
	a.mu.Lock()
	if a.m == nil {
		a.m = map[*aliveEntry]struct{}{}
	}
	a.m[e] = struct{}{}
	a.mu.Unlock()
	return e
}

func (a *aliveSet) remove(e *aliveEntry) {
	a.mu.Lock()
	delete(a.m, e)
	a.mu.Unlock()
}

// due appends the messages held since before the previous tick to buf and
// marks the others as no longer fresh.
func (a *aliveSet) due(buf []jetstream.Msg) []jetstream.Msg {
	a.mu.Lock()
	defer a.mu.Unlock()
	for e := range a.m {
		if e.fresh {
			e.fresh = false
			continue
		}
		buf = append(buf, e.m)
	}
	return buf
}

func (r *Runner) deadLetter(ctx context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata, cause error) {
	dl := nats.NewMsg(DLQSubject(r.cfg.Spec.Stream, r.cfg.Spec.Durable))
	copyEventHeaders(dl.Header, m.Headers())
	seq := strconv.FormatUint(meta.Sequence.Stream, 10)
	dl.Header.Set(HeaderDLQSubject, m.Subject())
	dl.Header.Set(HeaderDLQStream, meta.Stream)
	dl.Header.Set(HeaderDLQConsumer, meta.Consumer)
	dl.Header.Set(HeaderDLQStreamSeq, seq)
	dl.Header.Set(HeaderDLQDeliveries, strconv.FormatUint(meta.NumDelivered, 10))
	dl.Header.Set(HeaderDLQError, truncate(cause.Error(), 2000))
	dl.Header.Set(HeaderDLQTime, time.Now().UTC().Format(time.RFC3339Nano))
	dl.Header.Set(HeaderDLQHistory, historyHeader(r.failures.take(meta.Sequence.Stream), DeliveryFailure{
		Attempt: meta.NumDelivered, At: time.Now().UTC(), Error: truncate(cause.Error(), maxHistoryError)}))
	dl.Header.Set(events.HeaderMsgID, "dlq/"+meta.Stream+"/"+meta.Consumer+"/"+seq)
	dl.Data = m.Data()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	how := DeadLetterInline
	if msgSize(dl) > r.maxPayload()-dlqHeadroom {
		// The dead-letter headers push it past what a message may weigh:
		// the whole original goes to the object store, the message keeps
		// where it is.
		how = r.storeOversized(pctx, dl, m, meta)
	}
	if _, err := r.js.PublishMsg(pctx, dl); err != nil {
		// Not stored anywhere yet: leave it to be redelivered rather than lose it.
		r.log.Error("dead-letter publish failed; message left for redelivery", "subject", m.Subject(), "err", err)
		_ = m.NakWithDelay(r.cfg.Backoff(meta.NumDelivered))
		return
	}
	if r.cfg.Observer != nil {
		r.cfg.Observer.DeadLettered(meta.Stream, meta.Consumer, how)
	}
	r.log.Error("event moved to dead-letter stream", "subject", m.Subject(), "seq", seq,
		"deliveries", meta.NumDelivered, "stored", how, "err", cause)
	_ = m.Term()
}

// dlqHeadroom is kept free under the server's max_payload for the framing of
// a dead letter's headers.
const dlqHeadroom = 1 << 10

// maxPayload is the most a message may weigh, as the connection learnt it.
func (r *Runner) maxPayload() int {
	if nc := r.js.Conn(); nc != nil {
		if mp := nc.MaxPayload(); mp > 0 {
			return int(mp)
		}
	}
	return 1 << 20
}

// msgSize is what m weighs on the wire: its headers as NATS writes them and
// its body.
func msgSize(m *nats.Msg) int {
	n := len("NATS/1.0\r\n\r\n") + len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// storeOversized puts the original message, headers and body, in the
// ObjectDeadLetters store, and leaves in dl only the dead-letter headers, the
// event's id and type and the object's name, size and hash. When the store
// fails too, dl keeps as much of the body as fits, with its full size and
// hash: never is a dead letter dropped for its size.
func (r *Runner) storeOversized(ctx context.Context, dl *nats.Msg, m jetstream.Msg, meta *jetstream.MsgMetadata) string {
	whole, err := json.Marshal(storedMsg{Header: m.Headers(), Data: m.Data()})
	for k := range dl.Header {
		lk := strings.ToLower(k)
		if !strings.HasPrefix(lk, "toolwire-dlq-") && k != events.HeaderMsgID && lk != events.HeaderPrefix+"id" && lk != events.HeaderPrefix+"type" {
			delete(dl.Header, k)
		}
	}
	dl.Header.Set(HeaderDLQBodyBytes, strconv.Itoa(len(whole)))
	dl.Header.Set(HeaderDLQBodySHA256, bodySHA256(whole))
	dl.Data = nil
	name := DeadLetterObjectName(meta.Stream, meta.Consumer, meta.Sequence.Stream)
	if err == nil {
		var obs jetstream.ObjectStore
		if obs, err = r.js.ObjectStore(ctx, provision.ObjectDeadLetters); err == nil {
			_, err = obs.PutBytes(ctx, name, whole)
		}
	}
	if err == nil {
		dl.Header.Set(HeaderDLQBodyObject, name)
		return DeadLetterObject
	}
	r.log.Error("oversized dead letter: object store failed; keeping what fits of the body", "subject", m.Subject(), "err", err)
	dl.Header.Set(HeaderDLQBodyTruncated, "true")
	room := max(r.maxPayload()-dlqHeadroom-msgSize(dl), 0)
	dl.Data = m.Data()[:min(room, len(m.Data()))]
	return DeadLetterTruncated
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Runners is the group of runners a service starts together: Stop drains them
// all at once, so that a service's shutdown takes as long as its slowest
// consumer, not the sum of them.
type Runners struct {
	// Observer is given to every runner the group starts without one of its
	// own (a service's consumer metrics).
	Observer Observer

	mu   sync.Mutex
	list []*Runner
}

// Start builds a runner of cfg, starts it (ctx bounds the start only) and adds
// it to the group.
func (g *Runners) Start(ctx context.Context, js jetstream.JetStream, cfg RunnerConfig) (*Runner, error) {
	if cfg.Observer == nil {
		cfg.Observer = g.Observer
	}
	r, err := NewRunner(js, cfg)
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.list = append(g.list, r)
	g.mu.Unlock()
	if t, ok := cfg.Observer.(LagTracker); ok {
		t.Track(r)
	}
	return r, nil
}

// Stop stops every runner of the group concurrently (each drains its handlers
// in flight, bounded by ctx) and joins their errors. The group is empty
// afterwards.
func (g *Runners) Stop(ctx context.Context) error {
	g.mu.Lock()
	list := g.list
	g.list = nil
	g.mu.Unlock()
	errs := make([]error, len(list))
	var wg sync.WaitGroup
	for i, r := range list {
		wg.Go(func() { errs[i] = r.Stop(ctx) })
	}
	wg.Wait()
	for _, r := range list {
		if t, ok := r.cfg.Observer.(LagTracker); ok {
			t.Untrack(r)
		}
	}
	return errors.Join(errs...)
}

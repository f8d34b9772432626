package consume_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

const durable = "test-runner"

// shortBackoff keeps retries fast in tests.
func shortBackoff(uint64) time.Duration { return 10 * time.Millisecond }

// startRunner starts a runner on the calls stream; Stop runs at cleanup.
func startRunner(t *testing.T, env *eventstest.Env, cfg consume.RunnerConfig) *consume.Runner {
	t.Helper()
	if cfg.Spec.Stream == "" {
		cfg.Spec.Stream, cfg.Spec.Durable = events.StreamCalls, durable
		cfg.Spec.Filters = []string{"toolwire.call.>"}
	}
	if cfg.Backoff == nil {
		cfg.Backoff = shortBackoff
	}
	cfg.Logger = quietLogger()
	r, err := consume.NewRunner(env.JS, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(testCtx(t)))
	eventstest.StopAtCleanup(t, r)
	return r
}

// stopAtCleanup stops a started runner when the test ends.

// callsSpec is the test consumer on the calls stream, with a delivery budget
// (0 for the default).
func callsSpec(maxDeliver int) provision.ConsumerSpec {
	return provision.ConsumerSpec{Stream: events.StreamCalls, Durable: durable, Filters: []string{"toolwire.call.>"}, MaxDeliver: maxDeliver}
}

// attemptLog is a handler that records the attempt of each call and fails
// the first failures calls with err.
type attemptLog struct {
	failures int
	err      error

	mu       sync.Mutex
	attempts []uint64
}

func (a *attemptLog) handle(_ context.Context, d *consume.Delivery) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.attempts = append(a.attempts, d.Attempt)
	if len(a.attempts) <= a.failures {
		return a.err
	}
	return nil
}

// seen is the attempts recorded so far.
func (a *attemptLog) seen() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.attempts)
}

func consumerInfo(t testing.TB, env *eventstest.Env) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := env.JS.Consumer(testCtx(t), events.StreamCalls, durable)
	require.NoError(t, err)
	info, err := c.Info(testCtx(t))
	require.NoError(t, err)
	return info
}

// requireAllAcked waits until the consumer has acknowledged n stream messages
// and holds none pending.
func requireAllAcked(t testing.TB, env *eventstest.Env, n uint64) *jetstream.ConsumerInfo {
	t.Helper()
	return requireAllAckedWithin(t, env, n, 5*time.Second)
}

// waitDLQ waits for the dead letter of the test consumer.
func waitDLQ(t testing.TB, env *eventstest.Env) *nats.Msg {
	t.Helper()
	subject := consume.DLQSubject(events.StreamCalls, durable)
	require.Equal(t, "toolwire.dlq.TOOLWIRE_CALLS."+durable, subject)
	require.Eventually(t, func() bool { return streamMsgs(t, env.JS, events.StreamDLQ) > 0 },
		5*time.Second, 10*time.Millisecond, "nothing reached the dead-letter stream")
	return lastMsg(t, env.JS, events.StreamDLQ, subject)
}

func TestNewRunnerValidates(t *testing.T) {
	h := func(context.Context, *consume.Delivery) error { return nil }
	_, err := consume.NewRunner(nil, consume.RunnerConfig{Spec: provision.ConsumerSpec{Stream: "S", Durable: "d"}})
	require.ErrorContains(t, err, "nil handler")
	_, err = consume.NewRunner(nil, consume.RunnerConfig{Handler: h, Spec: provision.ConsumerSpec{Stream: "S"}})
	require.ErrorContains(t, err, "stream and durable are required")
	_, err = consume.NewRunner(nil, consume.RunnerConfig{Handler: h, Spec: provision.ConsumerSpec{Durable: "d"}})
	require.ErrorContains(t, err, "stream and durable are required")

	// Stop before Start is harmless, and so is a second Stop.
	r, err := consume.NewRunner(nil, consume.RunnerConfig{Handler: h, Spec: provision.ConsumerSpec{Stream: "S", Durable: "d"}})
	require.NoError(t, err)
	require.NoError(t, r.Stop(context.Background()))
	require.NoError(t, r.Stop(context.Background()))
}

func TestDefaultBackoff(t *testing.T) {
	cases := map[uint64]time.Duration{
		0: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		3: 400 * time.Millisecond, 7: 6400 * time.Millisecond, 8: 10 * time.Second, 1000: 10 * time.Second,
	}
	for attempt, want := range cases {
		require.Equal(t, want, consume.DefaultBackoff(attempt), "attempt %d", attempt)
	}
}

func TestPermanent(t *testing.T) {
	require.NoError(t, consume.Permanent(nil))
	base := errors.New("bad input")
	p := consume.Permanent(base)
	require.True(t, consume.IsPermanent(p))
	require.True(t, consume.IsPermanent(fmt.Errorf("wrapped: %w", p)))
	require.ErrorIs(t, p, base)
	require.Equal(t, "bad input", p.Error())
	require.False(t, consume.IsPermanent(base))
	require.False(t, consume.IsPermanent(nil))
}

func TestRunnerAcksOnSuccess(t *testing.T) {
	env := eventstest.Start(t)
	out := callStarted(t, 1)
	var (
		mu  sync.Mutex
		got []*consume.Delivery
	)
	startRunner(t, env, consume.RunnerConfig{Spec: provision.ConsumerSpec{
		Stream: events.StreamCalls, Durable: durable, Filters: []string{"toolwire.call.>"}, AckWait: time.Second,
	}, Handler: func(_ context.Context, d *consume.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, d)
		return nil
	}})
	env.Publish(t, out)

	info := requireAllAcked(t, env, 1)
	require.Zero(t, info.NumRedelivered)
	// Past the ack wait, an acknowledged message is not delivered again.
	time.Sleep(1500 * time.Millisecond)
	info = requireAllAcked(t, env, 1)
	require.EqualValues(t, 1, info.Delivered.Consumer)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	d := got[0]
	require.Equal(t, out.Subject, d.Subject)
	require.EqualValues(t, 1, d.Attempt)
	eventstest.RequireSameEvent(t, &out.Event, d.Event)
	require.NotNil(t, d.Msg)
	require.Zero(t, streamMsgs(t, env.JS, events.StreamDLQ))
}

func TestRunnerRetriesThenAcks(t *testing.T) {
	env := eventstest.Start(t)
	log := &attemptLog{failures: 2, err: errors.New("transient")}
	startRunner(t, env, consume.RunnerConfig{Spec: callsSpec(5), Handler: log.handle})
	env.Publish(t, callStarted(t, 1))

	info := requireAllAcked(t, env, 1)
	require.EqualValues(t, 3, info.Delivered.Consumer)
	require.Equal(t, []uint64{1, 2, 3}, log.seen())
	require.Zero(t, streamMsgs(t, env.JS, events.StreamDLQ))
}

func TestRunnerDeadLettersAfterMaxDeliver(t *testing.T) {
	env := eventstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, consume.RunnerConfig{Spec: callsSpec(3), Handler: func(context.Context, *consume.Delivery) error {
		calls.Add(1)
		return errors.New("tool registry unreachable")
	}})
	out := callStarted(t, 1)
	env.Publish(t, out)

	dl := waitDLQ(t, env)
	require.EqualValues(t, 3, calls.Load())
	require.Equal(t, "tool registry unreachable", dl.Header.Get(consume.HeaderDLQError))
	require.Equal(t, "3", dl.Header.Get(consume.HeaderDLQDeliveries))
	require.Equal(t, out.Subject, dl.Header.Get(consume.HeaderDLQSubject))
	require.Equal(t, events.StreamCalls, dl.Header.Get(consume.HeaderDLQStream))
	require.Equal(t, durable, dl.Header.Get(consume.HeaderDLQConsumer))
	require.Equal(t, "1", dl.Header.Get(consume.HeaderDLQStreamSeq))
	_, err := time.Parse(time.RFC3339Nano, dl.Header.Get(consume.HeaderDLQTime))
	require.NoError(t, err)
	require.Equal(t, "dlq/"+events.StreamCalls+"/"+durable+"/1", dl.Header.Get(events.HeaderMsgID))
	require.Equal(t, out.Event.Data(), dl.Data, "the dead letter keeps the original body")
	require.Equal(t, out.Event.ID(), dl.Header.Get("ce-id"), "and the original event headers")

	info := requireAllAcked(t, env, 1)
	require.EqualValues(t, 3, info.Delivered.Consumer, "no delivery after the dead letter")
	require.EqualValues(t, 3, calls.Load())
	require.EqualValues(t, 1, streamMsgs(t, env.JS, events.StreamDLQ))
}

func TestRunnerDeadLettersPermanentAtOnce(t *testing.T) {
	env := eventstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, consume.RunnerConfig{Spec: callsSpec(5), Handler: func(context.Context, *consume.Delivery) error {
		calls.Add(1)
		return fmt.Errorf("decide: %w", consume.Permanent(errors.New("unknown tool")))
	}})
	env.Publish(t, callStarted(t, 1))

	dl := waitDLQ(t, env)
	require.Equal(t, "decide: unknown tool", dl.Header.Get(consume.HeaderDLQError))
	require.Equal(t, "1", dl.Header.Get(consume.HeaderDLQDeliveries))
	info := requireAllAcked(t, env, 1)
	require.EqualValues(t, 1, info.Delivered.Consumer)
	require.EqualValues(t, 1, calls.Load())
}

func TestRunnerDeadLettersMalformedMessage(t *testing.T) {
	env := eventstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, consume.RunnerConfig{Handler: func(context.Context, *consume.Delivery) error {
		calls.Add(1)
		return nil
	}})
	subject := "toolwire.call." + runID + "." + callID + ".requested"
	_, err := env.JS.Publish(testCtx(t), subject, []byte(`{"not":"an event"}`))
	require.NoError(t, err)

	dl := waitDLQ(t, env)
	require.Contains(t, dl.Header.Get(consume.HeaderDLQError), "decode")
	require.Contains(t, dl.Header.Get(consume.HeaderDLQError), events.ErrNotCloudEvent.Error())
	require.Equal(t, "1", dl.Header.Get(consume.HeaderDLQDeliveries))
	require.Equal(t, subject, dl.Header.Get(consume.HeaderDLQSubject))
	require.Equal(t, []byte(`{"not":"an event"}`), dl.Data)
	requireAllAcked(t, env, 1)
	require.Zero(t, calls.Load(), "the handler never sees a malformed message")
}

func TestRunnerTreatsPanicAsFailure(t *testing.T) {
	env := eventstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, consume.RunnerConfig{Spec: callsSpec(2), Handler: func(context.Context, *consume.Delivery) error {
		calls.Add(1)
		panic("boom")
	}})
	env.Publish(t, callStarted(t, 1))

	dl := waitDLQ(t, env)
	require.Equal(t, "handler panic: boom", dl.Header.Get(consume.HeaderDLQError))
	require.Equal(t, "2", dl.Header.Get(consume.HeaderDLQDeliveries))
	requireAllAcked(t, env, 1)
	require.EqualValues(t, 2, calls.Load(), "a panic is retried like an error")
}

func TestRunnerBoundsConcurrency(t *testing.T) {
	env := eventstest.Start(t)
	const limit, total = 3, 12
	var (
		inFlight, maxSeen, done atomic.Int32
		release                 = make(chan struct{})
	)
	startRunner(t, env, consume.RunnerConfig{Concurrency: limit, Handler: func(context.Context, *consume.Delivery) error {
		n := inFlight.Add(1)
		for {
			m := maxSeen.Load()
			if n <= m || maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		done.Add(1)
		return nil
	}})
	outs := make([]events.Outgoing, total)
	for i := range outs {
		outs[i] = callStarted(t, i+1)
	}
	env.Publish(t, outs...)

	require.Eventually(t, func() bool { return inFlight.Load() == limit }, 5*time.Second, 5*time.Millisecond)
	// With every slot taken, no further handler starts.
	time.Sleep(200 * time.Millisecond)
	require.EqualValues(t, limit, inFlight.Load())
	require.EqualValues(t, limit, maxSeen.Load())

	close(release)
	require.Eventually(t, func() bool { return done.Load() == total }, 5*time.Second, 5*time.Millisecond)
	require.EqualValues(t, limit, maxSeen.Load(), "never more than %d handlers at once", limit)
	requireAllAcked(t, env, total)
}

func TestRunnerStopDrainsInFlight(t *testing.T) {
	env := eventstest.Start(t)
	started := make(chan struct{})
	release := make(chan struct{})
	var finished atomic.Bool
	var handlerCtxErr atomic.Value
	r, err := consume.NewRunner(env.JS, consume.RunnerConfig{
		Spec:    callsSpec(0),
		Logger:  quietLogger(),
		Backoff: shortBackoff,
		Handler: func(ctx context.Context, _ *consume.Delivery) error {
			close(started)
			<-release
			handlerCtxErr.Store(fmt.Sprint(ctx.Err()))
			finished.Store(true)
			return nil
		},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(testCtx(t)))
	env.Publish(t, callStarted(t, 1))
	<-started

	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(testCtx(t)) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a handler was in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after the handler finished")
	}
	require.True(t, finished.Load())
	require.Equal(t, "<nil>", handlerCtxErr.Load(), "the handler's context is not cancelled while it drains")

	// Acknowledged before Stop returned: nothing pending, nothing redelivered.
	info := consumerInfo(t, env)
	require.Zero(t, info.NumAckPending)
	require.Zero(t, info.NumRedelivered)
	require.EqualValues(t, 1, info.AckFloor.Stream)
	require.NoError(t, r.Stop(testCtx(t)), "Stop is idempotent")
}

func TestRunnerStopBoundedByContext(t *testing.T) {
	env := eventstest.Start(t)
	started := make(chan struct{})
	release := make(chan struct{})
	r, err := consume.NewRunner(env.JS, consume.RunnerConfig{
		Spec:   callsSpec(0),
		Logger: quietLogger(),
		Handler: func(context.Context, *consume.Delivery) error {
			close(started)
			<-release
			return nil
		},
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(testCtx(t)))
	env.Publish(t, callStarted(t, 1))
	<-started

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = r.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, durable)
	close(release)
}

func TestRunnerHandlerSeesHopTrace(t *testing.T) {
	env := eventstest.Start(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	ctx, span := tp.Tracer("test").Start(testCtx(t), "publish")
	defer span.End()

	type seen struct{ hop, run string }
	got := make(chan seen, 1)
	startRunner(t, env, consume.RunnerConfig{Handler: func(ctx context.Context, d *consume.Delivery) error {
		sc := trace.SpanContextFromContext(ctx)
		if !sc.IsRemote() {
			return consume.Permanent(errors.New("handler ctx has no remote span"))
		}
		got <- seen{hop: sc.SpanID().String() + "/" + sc.TraceID().String(), run: events.TraceOf(d.Event).TraceID()}
		return nil
	}})
	require.NoError(t, publish.NewPublisher(env.JS).Publish(ctx, callStarted(t, 1)))

	select {
	case s := <-got:
		require.Equal(t, span.SpanContext().SpanID().String()+"/"+span.SpanContext().TraceID().String(), s.hop)
		require.Equal(t, runTrace.TraceID(), s.run, "the run's trace rides in the event")
	case <-time.After(5 * time.Second):
		t.Fatal("handler never ran")
	}
	requireAllAcked(t, env, 1)
}

func TestConsumerSpecConfig(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)

	c, err := provision.EnsureConsumer(ctx, env.JS, provision.ConsumerSpec{Stream: events.StreamCalls, Durable: "one",
		Filters: []string{"toolwire.call.*.*.approved"}})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, "toolwire.call.*.*.approved", info.Config.FilterSubject)
	require.Empty(t, info.Config.FilterSubjects)
	require.Equal(t, -1, info.Config.MaxDeliver, "the runner keeps the budget; the server never drops a message")
	require.Equal(t, 30*time.Second, info.Config.AckWait)
	require.Equal(t, 1024, info.Config.MaxAckPending)
	require.Equal(t, jetstream.AckExplicitPolicy, info.Config.AckPolicy)
	require.Equal(t, jetstream.DeliverAllPolicy, info.Config.DeliverPolicy)

	c, err = provision.EnsureConsumer(ctx, env.JS, provision.ConsumerSpec{Stream: events.StreamCalls, Durable: "two",
		Filters:    []string{"toolwire.call.*.*.approved", "toolwire.call.*.*.decided"},
		MaxDeliver: 3, AckWait: time.Minute, MaxAckPending: 7, DeliverNew: true})
	require.NoError(t, err)
	info, err = c.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"toolwire.call.*.*.approved", "toolwire.call.*.*.decided"}, info.Config.FilterSubjects)
	require.Equal(t, -1, info.Config.MaxDeliver)
	require.Equal(t, time.Minute, info.Config.AckWait)
	require.Equal(t, 7, info.Config.MaxAckPending)
	require.Equal(t, jetstream.DeliverNewPolicy, info.Config.DeliverPolicy)

	// Ensuring again with a changed setting updates it in place.
	_, err = provision.EnsureConsumer(ctx, env.JS, provision.ConsumerSpec{Stream: events.StreamCalls, Durable: "two",
		Filters: []string{"toolwire.call.*.*.approved"}, AckWait: 2 * time.Minute, DeliverNew: true})
	require.NoError(t, err)
	info, err = c.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, info.Config.AckWait)

	_, err = provision.EnsureConsumer(ctx, env.JS, provision.ConsumerSpec{Stream: "NO_SUCH_STREAM", Durable: "x"})
	require.ErrorContains(t, err, "consumer x on NO_SUCH_STREAM")
}

// TestRunnerKeepsSlowMessagesAlive: a handler that outlasts AckWait, and a
// message queued behind it for a free handler, are kept alive by the runner's
// single keep-alive loop: neither is delivered a second time.
func TestRunnerKeepsSlowMessagesAlive(t *testing.T) {
	env := eventstest.Start(t)
	const ackWait = time.Second
	var (
		deliveries atomic.Int32
		first      = make(chan struct{})
	)
	startRunner(t, env, consume.RunnerConfig{Concurrency: 1, Spec: provision.ConsumerSpec{
		Stream: events.StreamCalls, Durable: durable, Filters: []string{"toolwire.call.>"}, AckWait: ackWait,
	}, Handler: func(ctx context.Context, d *consume.Delivery) error {
		if deliveries.Add(1) == 1 {
			close(first)
			// Outlast the ack wait twice and a half: only InProgress keeps
			// this message (and the one queued behind it) from redelivery.
			select {
			case <-time.After(5 * ackWait / 2):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}})
	env.Publish(t, callStarted(t, 1), callStarted(t, 2))
	<-first

	info := requireAllAckedWithin(t, env, 2, 10*time.Second)
	require.Zero(t, info.NumRedelivered)
	require.EqualValues(t, 2, info.Delivered.Consumer, "each message delivered once")
	require.EqualValues(t, 2, deliveries.Load())
}

func requireAllAckedWithin(t testing.TB, env *eventstest.Env, n uint64, within time.Duration) *jetstream.ConsumerInfo {
	t.Helper()
	var info *jetstream.ConsumerInfo
	require.Eventually(t, func() bool {
		info = consumerInfo(t, env)
		return info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == n
	}, within, 10*time.Millisecond, "consumer never acknowledged %d messages", n)
	return info
}

// A polling runner (RunnerConfig.Poll) handles what is waiting in batches of
// at most Concurrency, keeps up with events published while it runs, retries
// a failure as the pushing runner does, and drains on Stop.
func TestRunnerPolls(t *testing.T) {
	env := eventstest.Start(t)
	var (
		mu       sync.Mutex
		seen     = map[string]int{}
		inFlight atomic.Int32
		maxSeen  atomic.Int32
	)
	for i := 1; i <= 5; i++ { // waiting before the runner starts
		env.Publish(t, callStarted(t, i))
	}
	r := startRunner(t, env, consume.RunnerConfig{Poll: 20 * time.Millisecond, Concurrency: 2,
		Handler: func(_ context.Context, d *consume.Delivery) error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				m := maxSeen.Load()
				if n <= m || maxSeen.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			seen[d.Event.ID()]++
			if seen[d.Event.ID()] == 1 && d.Event.ID() == callStarted(t, 3).Event.ID() {
				return errors.New("first attempt fails")
			}
			return nil
		}})
	for i := 6; i <= 8; i++ { // published while it runs
		env.Publish(t, callStarted(t, i))
	}
	requireAllAcked(t, env, 8)
	require.LessOrEqual(t, maxSeen.Load(), int32(2), "at most Concurrency handlers at once")
	mu.Lock()
	require.Len(t, seen, 8)
	require.Equal(t, 2, seen[callStarted(t, 3).Event.ID()], "the failed event came back once")
	mu.Unlock()
	require.NoError(t, r.Stop(testCtx(t)))
	require.NoError(t, r.Stop(testCtx(t)), "Stop is idempotent")
}

// Nudge makes a polling runner fetch at once: with an hour's poll, an event
// stored after the first fetch is handled as soon as the runner is nudged,
// as often as that happens.
func TestRunnerNudged(t *testing.T) {
	env := eventstest.Start(t)
	env.Publish(t, callStarted(t, 1)) // the first fetch, at the start, takes it
	handled := make(chan string, 8)
	r := startRunner(t, env, consume.RunnerConfig{Poll: time.Hour, Concurrency: 4,
		Handler: func(_ context.Context, d *consume.Delivery) error {
			handled <- d.Event.ID()
			return nil
		}})
	next := func() string {
		select {
		case id := <-handled:
			return id
		case <-testCtx(t).Done():
			t.Fatal("nothing handled")
			return ""
		}
	}
	require.Equal(t, callStarted(t, 1).Event.ID(), next())
	for i := 2; i <= 4; i++ {
		env.Publish(t, callStarted(t, i))
		r.Nudge()
		require.Equal(t, callStarted(t, i).Event.ID(), next(), "handled once nudged, not after the hour")
	}
	requireAllAcked(t, env, 4)
}

// A batch runner hands each fetch to its batch handler in one call, in
// stream order, holds at most two fetches at once, and settles each event by
// its own outcome: acknowledged, retried later, or dead-lettered.
func TestRunnerBatches(t *testing.T) {
	env := eventstest.Start(t)
	for i := 1; i <= 6; i++ { // waiting before the runner starts: one fetch
		env.Publish(t, callStarted(t, i))
	}
	var (
		mu       sync.Mutex
		seen     = map[string]int{}
		sizes    []int
		inFlight atomic.Int32
		maxSeen  atomic.Int32
		retried  = callStarted(t, 2).Event.ID()
		poison   = callStarted(t, 4).Event.ID()
	)
	startRunner(t, env, consume.RunnerConfig{Poll: 20 * time.Millisecond, Concurrency: 16,
		Batch: func(_ context.Context, ds []*consume.Delivery) []error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			if m := maxSeen.Load(); n > m {
				maxSeen.CompareAndSwap(m, n)
			}
			time.Sleep(5 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(ds))
			errs := make([]error, len(ds))
			for i, d := range ds {
				require.NotNil(t, d.Meta)
				if i > 0 {
					require.Greater(t, d.Meta.Sequence.Stream, ds[i-1].Meta.Sequence.Stream, "in stream order")
				}
				id := d.Event.ID()
				seen[id]++
				switch {
				case id == retried && seen[id] == 1:
					errs[i] = errors.New("first attempt fails")
				case id == poison:
					errs[i] = consume.Permanent(errors.New("poison"))
				}
			}
			return errs
		}})
	for i := 7; i <= 9; i++ { // published while it runs
		env.Publish(t, callStarted(t, i))
	}
	waitDLQ(t, env)
	requireAllAcked(t, env, 9)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 9)
	require.Equal(t, 2, seen[retried], "the failed event came back once")
	require.Equal(t, 1, seen[poison], "the poison event was dead-lettered at once")
	require.GreaterOrEqual(t, sizes[0], 6, "what waited came in one fetch")
	require.LessOrEqual(t, maxSeen.Load(), int32(2), "at most two fetches in hand")
}

// A batch handler needs Poll.
func TestRunnerBatchNeedsPoll(t *testing.T) {
	env := eventstest.Start(t)
	_, err := consume.NewRunner(env.JS, consume.RunnerConfig{
		Spec:  provision.ConsumerSpec{Stream: events.StreamCalls, Durable: durable},
		Batch: func(context.Context, []*consume.Delivery) []error { return nil },
	})
	require.ErrorContains(t, err, "needs Poll")
}

func TestIsTransient(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("bad input"), false},
		{"no responders", fmt.Errorf("publish: %w", nats.ErrNoResponders), true},
		{"request timeout", fmt.Errorf("load run r1: %w", nats.ErrTimeout), true},
		{"no response from stream", fmt.Errorf("publish: %w", jetstream.ErrNoStreamResponse), true},
		{"leader changed", jetstream.ErrConsumerLeadershipChanged, true},
		{"deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), true},
		{"cancelled is not", fmt.Errorf("get: %w", context.Canceled), false},
		{"503 from the API", fmt.Errorf("update: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream cluster not available"}), true},
		{"stream offline (its node is down)", fmt.Errorf("open TOOLWIRE_CALLS: %w", &jetstream.APIError{Code: 500, ErrorCode: 10118, Description: "stream is offline"}), true},
		{"consumer offline", &jetstream.APIError{Code: 500, ErrorCode: 10119, Description: "consumer is offline"}, true},
		{"no leader", &jetstream.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster can not handle request"}, true},
		{"offline for a reason that stays", &jetstream.APIError{Code: 500, ErrorCode: 10194, Description: "stream is offline: unsupported"}, false},
		{"400 from the API", fmt.Errorf("update: %w", &jetstream.APIError{Code: 400, Description: "bad request"}), false},
		{"not found", jetstream.ErrKeyNotFound, false},
		{"marked", consume.Transient(errors.New("the outcomes bucket hiccupped")), true},
		{"marked, wrapped", fmt.Errorf("outcome: %w", consume.Transient(errors.New("hiccup"))), true},
		{"permanent wins", consume.Permanent(fmt.Errorf("x: %w", nats.ErrTimeout)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, consume.IsTransient(tc.err))
		})
	}
	require.ErrorIs(t, consume.Transient(errors.New("x")), consume.ErrTransient)
	require.NoError(t, consume.Transient(nil))
}

// An infrastructure failure is retried in place: the server delivers the
// message once, its budget (MaxDeliver 2) is untouched however many times
// the handler is called, and nothing is dead-lettered.
func TestRunnerRetriesTransientInPlace(t *testing.T) {
	env := eventstest.Start(t)
	log := &attemptLog{failures: 5, err: fmt.Errorf("publish turn: %w", jetstream.ErrNoStreamResponse)}
	startRunner(t, env, consume.RunnerConfig{Spec: callsSpec(2), Handler: log.handle})
	env.Publish(t, callStarted(t, 1))

	info := requireAllAcked(t, env, 1)
	require.EqualValues(t, 1, info.Delivered.Consumer, "delivered once: the retries were in place")
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6}, log.seen(), "each retry says it is one")
	require.Zero(t, streamMsgs(t, env.JS, events.StreamDLQ))
}

// A handler failure after transient ones counts once against the budget;
// only handler failures lead to the dead letters.
func TestRunnerCountsOnlyHandlerFailures(t *testing.T) {
	env := eventstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, consume.RunnerConfig{Spec: callsSpec(2), Handler: func(context.Context, *consume.Delivery) error {
		if calls.Add(1)%3 != 0 {
			return nats.ErrNoResponders // two transient failures, then the handler's own
		}
		return errors.New("tool registry says no")
	}})
	env.Publish(t, callStarted(t, 1))

	dl := waitDLQ(t, env)
	require.Equal(t, "tool registry says no", dl.Header.Get(consume.HeaderDLQError))
	require.Equal(t, "2", dl.Header.Get(consume.HeaderDLQDeliveries))
	require.EqualValues(t, 6, calls.Load(), "two deliveries, each with two retries in place")
}

// Past TransientRetryFor the message is handed back (a redelivery), still
// not dead-lettered by a transient failure.
func TestRunnerHandsBackAfterTransientBound(t *testing.T) {
	env := eventstest.Start(t)
	var calls atomic.Int32
	startRunner(t, env, consume.RunnerConfig{Spec: callsSpec(5), TransientRetryFor: 25 * time.Millisecond,
		Handler: func(context.Context, *consume.Delivery) error {
			if calls.Add(1) <= 4 {
				return consume.Transient(errors.New("kv hiccup"))
			}
			return nil
		}})
	env.Publish(t, callStarted(t, 1))
	info := requireAllAcked(t, env, 1)
	require.Greater(t, info.Delivered.Consumer, uint64(1), "handed back at least once")
	require.Zero(t, streamMsgs(t, env.JS, events.StreamDLQ))
}

// A batch's transient failures are retried in place too; the others of the
// batch are settled as the handler said.
func TestRunnerBatchRetriesTransientInPlace(t *testing.T) {
	env := eventstest.Start(t)
	for i := 1; i <= 4; i++ {
		env.Publish(t, callStarted(t, i))
	}
	flaky := callStarted(t, 3).Event.ID()
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	startRunner(t, env, consume.RunnerConfig{Poll: 10 * time.Millisecond, Concurrency: 16,
		Batch: func(_ context.Context, ds []*consume.Delivery) []error {
			mu.Lock()
			defer mu.Unlock()
			errs := make([]error, len(ds))
			for i, d := range ds {
				seen[d.Event.ID()]++
				if d.Event.ID() == flaky && seen[flaky] <= 3 {
					errs[i] = fmt.Errorf("write: %w", nats.ErrTimeout)
				}
			}
			return errs
		}})
	info := requireAllAcked(t, env, 4)
	require.EqualValues(t, 4, info.Delivered.Consumer, "each delivered once")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 4, seen[flaky])
	for i := 1; i <= 4; i++ {
		if id := callStarted(t, i).Event.ID(); id != flaky {
			require.Equal(t, 1, seen[id])
		}
	}
}

// A handler that holds its message (Delivery.Hold) and succeeds leaves it
// unacknowledged, and kept alive past the ack wait, until its holder acks or
// naks it; a nak redelivers it; a handler that holds and then fails voids
// the hold (the runner retries the message as usual and the holder's ack
// does nothing); a second Hold, and a hold on a batch delivery, are nil.
func TestRunnerHold(t *testing.T) {
	env := eventstest.Start(t)
	const ackWait = time.Second
	type held struct {
		seq     int
		attempt uint64
		h       *consume.Held
	}
	got := make(chan held, 16)
	startRunner(t, env, consume.RunnerConfig{Spec: provision.ConsumerSpec{
		Stream: events.StreamCalls, Durable: durable, Filters: []string{"toolwire.call.>"}, AckWait: ackWait,
	}, Handler: func(_ context.Context, d *consume.Delivery) error {
		h := d.Hold()
		require.NotNil(t, h)
		require.Nil(t, d.Hold(), "held once")
		seq := int(d.Meta.Sequence.Stream)
		got <- held{seq, d.Attempt, h}
		if seq == 3 && d.Attempt == 1 {
			return errors.New("failed after holding")
		}
		return nil
	}})
	next := func() held {
		t.Helper()
		select {
		case h := <-got:
			return h
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery")
		}
		return held{}
	}

	env.Publish(t, callStarted(t, 1))
	first := next()
	time.Sleep(5 * ackWait / 2) // past the ack wait twice: kept alive
	info := consumerInfo(t, env)
	require.EqualValues(t, 1, info.NumAckPending, "held: not acknowledged")
	require.Zero(t, info.NumRedelivered, "held: kept alive")
	require.NoError(t, first.h.Ack())
	require.NoError(t, first.h.Nak(0), "settled once: the nak does nothing")
	requireAllAcked(t, env, 1)

	env.Publish(t, callStarted(t, 2))
	second := next()
	require.NoError(t, second.h.Nak(0))
	again := next()
	require.Equal(t, second.seq, again.seq)
	require.EqualValues(t, 2, again.attempt, "handed back: redelivered")
	require.NoError(t, again.h.Ack())
	requireAllAcked(t, env, 2)

	env.Publish(t, callStarted(t, 3))
	failed := next()
	retried := next()
	require.Equal(t, failed.seq, retried.seq)
	require.EqualValues(t, 2, retried.attempt, "the failure is retried as without a hold")
	require.NoError(t, failed.h.Ack(), "a void hold settles nothing")
	require.EqualValues(t, 1, consumerInfo(t, env).NumAckPending, "the retry's hold is pending")
	require.NoError(t, retried.h.Ack())
	requireAllAcked(t, env, 3)
	require.Empty(t, got)
}

func TestHoldOnABatchDeliveryIsNil(t *testing.T) {
	env := eventstest.Start(t)
	holds := make(chan *consume.Held, 1)
	startRunner(t, env, consume.RunnerConfig{Poll: 10 * time.Millisecond, Spec: callsSpec(0),
		Batch: func(_ context.Context, ds []*consume.Delivery) []error {
			for _, d := range ds {
				holds <- d.Hold()
			}
			return make([]error, len(ds))
		}})
	env.Publish(t, callStarted(t, 1))
	select {
	case h := <-holds:
		require.Nil(t, h)
	case <-time.After(10 * time.Second):
		t.Fatal("no batch")
	}
	requireAllAcked(t, env, 1)
}

func TestDLQSubject(t *testing.T) {
	require.Equal(t, "toolwire.dlq.TOOLWIRE_CALLS.executor", consume.DLQSubject(events.StreamCalls, "executor"))
}

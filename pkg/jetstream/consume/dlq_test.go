package consume_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// TestPoisonMessageDeadLetteredThenReplayed: a handler that always fails
// moves the event to the dead-letter stream after the consumer's MaxDeliver
// attempts, with where it failed and every failed attempt; once the fault is
// removed, replaying the dead letter brings the event back to the handler,
// which now handles it, and the dead letter is gone.
func TestPoisonMessageDeadLetteredThenReplayed(t *testing.T) {
	env := eventstest.Start(t)
	var fault atomic.Bool
	fault.Store(true)
	var attempts, handled atomic.Int32
	got := make(chan string, 4)
	startRunner(t, env, consume.RunnerConfig{
		Spec: callsSpec(3),
		Handler: func(_ context.Context, d *consume.Delivery) error {
			attempts.Add(1)
			if fault.Load() {
				return errors.New("downstream refused: quota exhausted (attempt " + itoa(d.Attempt) + ")")
			}
			handled.Add(1)
			got <- d.Event.ID()
			return nil
		},
	})
	poison := callStarted(t, 7)
	require.NoError(t, publish.NewPublisher(env.JS).Publish(testCtx(t), poison))

	// Dead-lettered after the third attempt, with its history.
	dl := waitDeadLetters(t, env, consume.DeadLetterFilter{}, 1)[0]
	require.Equal(t, int32(3), attempts.Load())
	require.Equal(t, poison.Subject, dl.Subject)
	require.Equal(t, events.StreamCalls, dl.Stream)
	require.Equal(t, durable, dl.Consumer)
	require.Equal(t, uint64(3), dl.Deliveries)
	require.Equal(t, poison.Event.ID(), dl.EventID)
	require.Equal(t, events.TypeCallStarted, dl.EventType)
	require.Contains(t, dl.Error, "quota exhausted (attempt 3)")
	require.Len(t, dl.History, 3)
	for i, f := range dl.History {
		require.Equal(t, uint64(i+1), f.Attempt)
		require.Contains(t, f.Error, "(attempt "+itoa(uint64(i+1))+")")
		require.False(t, f.At.IsZero())
	}
	require.Equal(t, poison.Event.Data(), dl.Data)
	require.Empty(t, dl.Header.Get(consume.HeaderDLQError), "dead-letter headers are not part of the original's")
	require.Equal(t, poison.Event.ID(), dl.Header.Get("ce-id"))

	// The filters and a lookup by sequence see it.
	for _, f := range []consume.DeadLetterFilter{{Stream: events.StreamCalls}, {Consumer: durable},
		{Stream: events.StreamCalls, Consumer: durable}} {
		l, err := consume.ListDeadLetters(testCtx(t), env.JS, f)
		require.NoError(t, err)
		require.Len(t, l, 1, "filter %+v", f)
	}
	l, err := consume.ListDeadLetters(testCtx(t), env.JS, consume.DeadLetterFilter{Stream: events.StreamRuns})
	require.NoError(t, err)
	require.Empty(t, l)
	_, err = consume.ListDeadLetters(testCtx(t), env.JS, consume.DeadLetterFilter{Stream: "A.>"})
	require.Error(t, err)
	same, err := consume.GetDeadLetter(testCtx(t), env.JS, dl.Seq)
	require.NoError(t, err)
	require.Equal(t, dl.EventID, same.EventID)

	// The fault is fixed; the operator replays the dead letter.
	fault.Store(false)
	r, err := consume.ReplayDeadLetter(testCtx(t), env.JS, dl.Seq)
	require.NoError(t, err)
	require.Equal(t, events.StreamCalls, r.Stream)
	require.Equal(t, poison.Event.ID()+"/replay/"+itoa(dl.Seq), r.MsgID)
	require.False(t, r.Duplicate)
	select {
	case id := <-got:
		require.Equal(t, poison.Event.ID(), id)
	case <-time.After(10 * time.Second):
		t.Fatal("the replayed event never reached the handler")
	}
	requireAllAcked(t, env, 2) // the original (dead-lettered, terminated) and the replay
	require.Equal(t, int32(1), handled.Load())
	require.Equal(t, uint64(0), streamMsgs(t, env.JS, events.StreamDLQ))
	_, err = consume.ReplayDeadLetter(testCtx(t), env.JS, dl.Seq)
	require.ErrorIs(t, err, consume.ErrDeadLetterNotFound)
}

// What JetStream acts on when it stores a message (here the condition that
// its subject held nothing, as a run's turn and end and a tenant's handed-over
// request are published, and a "Nats-" header in another spelling) is not
// copied into its dead letter or its replay: two such messages dead-letter
// side by side on one dead-letter subject, and each replays beside its
// original.
func TestDeadLetterLeavesOutStoreDirectives(t *testing.T) {
	env := eventstest.Start(t)
	startRunner(t, env, consume.RunnerConfig{
		Spec: callsSpec(3),
		Handler: func(context.Context, *consume.Delivery) error {
			return consume.Permanent(errors.New("refused"))
		},
	})
	for _, n := range []int{1, 2} {
		out := callStarted(t, n)
		m, err := out.Msg()
		require.NoError(t, err)
		m.Header.Set("nats-rollup", "sub")
		_, err = env.JS.PublishMsg(testCtx(t), m, jetstream.WithExpectLastSequencePerSubject(0))
		require.NoError(t, err)
	}
	dls := waitDeadLetters(t, env, consume.DeadLetterFilter{}, 2)
	for _, dl := range dls {
		require.Empty(t, dl.Header.Get(jetstream.ExpectedLastSubjSeqHeader), "a condition of the original's publish")
		require.Empty(t, dl.Header.Get("nats-rollup"))
		require.NotEmpty(t, dl.Header.Get("ce-id"), "the event's own headers are kept")
		r, err := consume.ReplayDeadLetter(testCtx(t), env.JS, dl.Seq)
		require.NoError(t, err, "replayed beside the original on %s", dl.Subject)
		require.False(t, r.Duplicate)
	}
	require.Len(t, waitDeadLetters(t, env, consume.DeadLetterFilter{}, 2), 2, "the replays failed as the originals did")
}

// TestDeadLetterOfStructuredAndUndecodable: an undecodable message is
// dead-lettered at once with one failure; the id and type of a structured
// CloudEvent are read from its body.
func TestDeadLetterOfStructuredAndUndecodable(t *testing.T) {
	env := eventstest.Start(t)
	startRunner(t, env, consume.RunnerConfig{Handler: func(context.Context, *consume.Delivery) error {
		return consume.Permanent(errors.New("refused"))
	}})
	bad := nats.NewMsg("toolwire.call.r1." + hexID(1) + ".started")
	bad.Data = []byte("not an event")
	_, err := env.JS.PublishMsg(testCtx(t), bad)
	require.NoError(t, err)
	out := callStarted(t, 2)
	m, err := events.EncodeStructured(out.Subject, &out.Event)
	require.NoError(t, err)
	_, err = env.JS.PublishMsg(testCtx(t), m)
	require.NoError(t, err)

	dls := waitDeadLetters(t, env, consume.DeadLetterFilter{Limit: 10}, 2)
	// The runner handles messages concurrently: the dead letters come in
	// either order.
	if string(dls[0].Data) != "not an event" {
		dls[0], dls[1] = dls[1], dls[0]
	}
	require.Contains(t, dls[0].Error, "decode")
	require.Len(t, dls[0].History, 1)
	require.Equal(t, []byte("not an event"), dls[0].Data)
	require.Equal(t, out.Event.ID(), dls[1].EventID)
	require.Equal(t, events.TypeCallStarted, dls[1].EventType)
	require.Len(t, dls[1].History, 1)
	require.True(t, strings.HasPrefix(dls[1].History[0].Error, "refused"))
	b, err := json.Marshal(dls[1])
	require.NoError(t, err)
	require.Contains(t, string(b), `"consumer":"`+durable+`"`)

	limited, err := consume.ListDeadLetters(testCtx(t), env.JS, consume.DeadLetterFilter{Limit: 1})
	require.NoError(t, err)
	require.Len(t, limited, 1)
	_, err = consume.GetDeadLetter(testCtx(t), env.JS, 999)
	require.ErrorIs(t, err, consume.ErrDeadLetterNotFound)
}

// waitDeadLetters waits until filter lists n dead letters and returns them.
func waitDeadLetters(t testing.TB, env *eventstest.Env, filter consume.DeadLetterFilter, n int) []consume.DeadLetter {
	t.Helper()
	var dls []consume.DeadLetter
	require.Eventually(t, func() bool {
		var err error
		dls, err = consume.ListDeadLetters(testCtx(t), env.JS, filter)
		require.NoError(t, err)
		return len(dls) == n
	}, 10*time.Second, 10*time.Millisecond, "never %d dead letters", n)
	return dls
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// FuzzDeadLetterOf: any headers and body read as a dead letter without a
// panic, and the original headers never keep a Toolwire-Dlq-* header.
func FuzzDeadLetterOf(f *testing.F) {
	f.Add("toolwire.call.r.ab.started", "3", `[{"attempt":1,"at":"2026-03-01T12:00:00Z","error":"x"}]`, "2026-03-01T12:00:00Z", `{"id":"a","type":"t"}`)
	f.Add("", "-1", "[", "yesterday", "")
	f.Add("s", "18446744073709551616", `{"attempt":"x"}`, "", "\x00")
	f.Fuzz(func(t *testing.T, subject, deliveries, history, at, body string) {
		h := nats.Header{}
		h.Set(consume.HeaderDLQSubject, subject)
		h.Set(consume.HeaderDLQDeliveries, deliveries)
		h.Set(consume.HeaderDLQHistory, history)
		h.Set(consume.HeaderDLQTime, at)
		h.Set("ce-id", body)
		d := consume.DeadLetterOf(&jetstream.RawStreamMsg{Subject: "toolwire.dlq.A.b", Sequence: 1, Header: h, Data: []byte(body)})
		if d.Subject != subject || d.Seq != 1 || d.History == nil {
			t.Fatalf("dead letter %+v", d)
		}
		for k := range d.Header {
			if strings.HasPrefix(strings.ToLower(k), "toolwire-dlq-") {
				t.Fatalf("kept header %s", k)
			}
		}
	})
}

// countingObserver counts what a runner tells its observer.
type countingObserver struct {
	mu                             sync.Mutex
	failed, permanent, redelivered int
	deadLettered                   map[string]int
}

func (o *countingObserver) HandlerFailed(_, _ string, permanent bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failed++
	if permanent {
		o.permanent++
	}
}

func (o *countingObserver) Redelivered(string, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.redelivered++
}

func (o *countingObserver) DeadLettered(_, _, how string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.deadLettered == nil {
		o.deadLettered = map[string]int{}
	}
	o.deadLettered[how]++
}

func (o *countingObserver) dead(how string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deadLettered[how]
}

// bigUndecodable publishes a message that is no event and weighs almost the
// server's max_payload, with a large header of its own.
func bigUndecodable(t *testing.T, env *eventstest.Env, n int) *nats.Msg {
	t.Helper()
	m := nats.NewMsg("toolwire.call.r1." + hexID(n) + ".started")
	m.Header.Set("X-Upstream-Trace", strings.Repeat("t", 2000))
	max := int(env.JS.Conn().MaxPayload())
	m.Data = []byte(strings.Repeat("x", max-2200))
	_, err := env.JS.PublishMsg(testCtx(t), m)
	require.NoError(t, err)
	return m
}

// An undecodable event close to the maximum payload, which the dead-letter
// headers would push over it, is dead-lettered anyway: whole, in the object
// store, and replayed byte for byte. It is counted.
func TestOversizedDeadLetterGoesToTheObjectStore(t *testing.T) {
	env := eventstest.Start(t)
	obs := &countingObserver{}
	startRunner(t, env, consume.RunnerConfig{Observer: obs, Handler: func(context.Context, *consume.Delivery) error {
		t.Error("an undecodable message reached the handler")
		return nil
	}})
	orig := bigUndecodable(t, env, 1)

	dl := waitDeadLetters(t, env, consume.DeadLetterFilter{}, 1)[0]
	// Counted once the dead letter is stored: wait for the count too.
	require.Eventually(t, func() bool { return obs.dead(consume.DeadLetterObject) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, consume.DeadLetterObjectName(events.StreamCalls, durable, 1), dl.Object)
	require.Empty(t, dl.Data, "the message holds a reference, not the body")
	require.Contains(t, dl.Error, "decode")
	require.False(t, dl.Truncated)
	requireAllAcked(t, env, 1)

	full, err := consume.LoadDeadLetter(testCtx(t), env.JS, dl)
	require.NoError(t, err)
	require.Equal(t, orig.Data, full.Data)
	require.Equal(t, orig.Header.Get("X-Upstream-Trace"), full.Header.Get("X-Upstream-Trace"))

	// Replayed, it is the original again (and, still undecodable, goes back
	// to the dead letters: the runner's budget holds).
	r, err := consume.ReplayDeadLetter(testCtx(t), env.JS, dl.Seq)
	require.NoError(t, err)
	s, err := env.JS.Stream(testCtx(t), events.StreamCalls)
	require.NoError(t, err)
	back, err := s.GetMsg(testCtx(t), r.Seq)
	require.NoError(t, err)
	require.Equal(t, orig.Data, back.Data)
	require.Eventually(t, func() bool { return obs.dead(consume.DeadLetterObject) == 2 }, 10*time.Second, 10*time.Millisecond)
	o, err := env.JS.ObjectStore(testCtx(t), provision.ObjectDeadLetters)
	require.NoError(t, err)
	_, err = o.GetInfo(testCtx(t), dl.Object)
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound, "a replayed dead letter's object is deleted")
}

// Without the object store, an oversized dead letter keeps what fits of its
// body, with its full size and hash; it is not dropped, and it is refused for
// replay with a clear reason.
func TestOversizedDeadLetterWithoutObjectStoreIsTruncated(t *testing.T) {
	env := eventstest.Start(t)
	require.NoError(t, env.JS.DeleteObjectStore(testCtx(t), provision.ObjectDeadLetters))
	obs := &countingObserver{}
	startRunner(t, env, consume.RunnerConfig{Observer: obs, Handler: func(context.Context, *consume.Delivery) error { return nil }})
	orig := bigUndecodable(t, env, 2)
	dl := waitDeadLetters(t, env, consume.DeadLetterFilter{}, 1)[0]
	require.True(t, dl.Truncated)
	// Counted once the dead letter is stored: wait for the count too.
	require.Eventually(t, func() bool { return obs.dead(consume.DeadLetterTruncated) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NotEmpty(t, dl.Data)
	require.Equal(t, orig.Data[:len(dl.Data)], dl.Data)
	require.Greater(t, dl.Bytes, len(orig.Data))
	require.Len(t, dl.SHA256, 64)
	_, err := consume.ReplayDeadLetter(testCtx(t), env.JS, dl.Seq)
	require.ErrorContains(t, err, "cannot be replayed")
}

// A message past its delivery budget (its dead-lettering failed before, or
// its handler's process died on every delivery) is dead-lettered without
// another try of the handler; failures and redeliveries are counted.
func TestRunnerBudgetAndObserver(t *testing.T) {
	env := eventstest.Start(t)
	obs := &countingObserver{}
	var calls atomic.Int32
	startRunner(t, env, consume.RunnerConfig{Observer: obs,
		Spec: callsSpec(3),
		Handler: func(context.Context, *consume.Delivery) error {
			calls.Add(1)
			return errors.New("flaky")
		}})
	env.Publish(t, callStarted(t, 3))
	require.Eventually(t, func() bool { return obs.dead(consume.DeadLetterInline) == 1 }, 10*time.Second, 10*time.Millisecond)
	obs.mu.Lock()
	require.Equal(t, 3, obs.failed)
	require.Equal(t, 1, obs.permanent, "the last failure is the one that dead-letters")
	require.Equal(t, 2, obs.redelivered)
	obs.mu.Unlock()
	require.EqualValues(t, 3, calls.Load())
}

// A delivery already past its budget is dead-lettered without running the
// handler: here a replica with a smaller budget takes over a message that
// another had retried.
func TestRunnerDeadLettersADeliveryPastItsBudget(t *testing.T) {
	env := eventstest.Start(t)
	var first atomic.Int32
	r, err := consume.NewRunner(env.JS, consume.RunnerConfig{Logger: quietLogger(), Backoff: shortBackoff,
		Spec:    callsSpec(10),
		Handler: func(context.Context, *consume.Delivery) error { first.Add(1); return errors.New("flaky") }})
	require.NoError(t, err)
	require.NoError(t, r.Start(testCtx(t)))
	env.Publish(t, callStarted(t, 4))
	require.Eventually(t, func() bool { return first.Load() >= 3 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, r.Stop(testCtx(t)))

	var second atomic.Int32
	startRunner(t, env, consume.RunnerConfig{
		Spec:    callsSpec(2),
		Handler: func(context.Context, *consume.Delivery) error { second.Add(1); return nil }})
	dl := waitDLQ(t, env)
	require.Contains(t, dl.Header.Get(consume.HeaderDLQError), "past the budget of 2")
	require.Zero(t, second.Load(), "the handler never saw it")
}

// TestReplayNeedsAReason: a replay says why and who, or nothing is
// replayed; the audit starts empty.
func TestReplayNeedsAReason(t *testing.T) {
	env := eventstest.Start(t)
	audit, err := consume.ListReplays(testCtx(t), env.JS)
	require.NoError(t, err)
	require.Empty(t, audit)
	_, err = consume.ReplayDeadLetterAs(testCtx(t), env.JS, 1, "  ", "alice")
	require.ErrorIs(t, err, consume.ErrNoReason)
	_, err = consume.ReplayDeadLetterAs(testCtx(t), env.JS, 1, strings.Repeat("x", 1001), "alice")
	require.ErrorContains(t, err, "at most 1000 bytes")
	_, err = consume.ReplayDeadLetterAs(testCtx(t), env.JS, 1, "fixed", "")
	require.ErrorContains(t, err, "who replays it")
	_, err = consume.ReplayDeadLetterAs(testCtx(t), env.JS, 1, "fixed", "alice")
	require.ErrorIs(t, err, consume.ErrDeadLetterNotFound, "nothing at 1: nothing recorded")
	audit, err = consume.ListReplays(testCtx(t), env.JS)
	require.NoError(t, err)
	require.Empty(t, audit)
}

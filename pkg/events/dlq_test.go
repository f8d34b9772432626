package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/internal/natstest"
)

// TestPoisonMessageDeadLetteredThenReplayed: a handler that always fails
// moves the event to the dead-letter stream after the consumer's MaxDeliver
// attempts, with where it failed and every failed attempt; once the fault is
// removed, replaying the dead letter brings the event back to the handler,
// which now handles it, and the dead letter is gone.
func TestPoisonMessageDeadLetteredThenReplayed(t *testing.T) {
	env := natstest.Start(t)
	var fault atomic.Bool
	fault.Store(true)
	var attempts, handled atomic.Int32
	got := make(chan string, 4)
	startRunner(t, env, events.RunnerConfig{
		Spec: events.ConsumerSpec{Stream: events.StreamCalls, Durable: durable, Filters: []string{"toolwire.call.>"}, MaxDeliver: 3},
		Handler: func(_ context.Context, d *events.Delivery) error {
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
	require.NoError(t, events.NewPublisher(env.JS).Publish(testCtx(t), poison))

	// Dead-lettered after the third attempt, with its history.
	var dls []events.DeadLetter
	require.Eventually(t, func() bool {
		var err error
		dls, err = events.ListDeadLetters(testCtx(t), env.JS, events.DeadLetterFilter{})
		require.NoError(t, err)
		return len(dls) == 1
	}, 10*time.Second, 10*time.Millisecond)
	dl := dls[0]
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
	require.Empty(t, dl.Header.Get(events.HeaderDLQError), "dead-letter headers are not part of the original's")
	require.Equal(t, poison.Event.ID(), dl.Header.Get("ce-id"))

	// The filters and a lookup by sequence see it.
	for _, f := range []events.DeadLetterFilter{{Stream: events.StreamCalls}, {Consumer: durable},
		{Stream: events.StreamCalls, Consumer: durable}} {
		l, err := events.ListDeadLetters(testCtx(t), env.JS, f)
		require.NoError(t, err)
		require.Len(t, l, 1, "filter %+v", f)
	}
	l, err := events.ListDeadLetters(testCtx(t), env.JS, events.DeadLetterFilter{Stream: events.StreamRuns})
	require.NoError(t, err)
	require.Empty(t, l)
	_, err = events.ListDeadLetters(testCtx(t), env.JS, events.DeadLetterFilter{Stream: "A.>"})
	require.Error(t, err)
	same, err := events.GetDeadLetter(testCtx(t), env.JS, dl.Seq)
	require.NoError(t, err)
	require.Equal(t, dl.EventID, same.EventID)

	// The fault is fixed; the operator replays the dead letter.
	fault.Store(false)
	r, err := events.ReplayDeadLetter(testCtx(t), env.JS, dl.Seq)
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
	_, err = events.ReplayDeadLetter(testCtx(t), env.JS, dl.Seq)
	require.ErrorIs(t, err, events.ErrDeadLetterNotFound)
}

// TestDeadLetterOfStructuredAndUndecodable: an undecodable message is
// dead-lettered at once with one failure; the id and type of a structured
// CloudEvent are read from its body.
func TestDeadLetterOfStructuredAndUndecodable(t *testing.T) {
	env := natstest.Start(t)
	startRunner(t, env, events.RunnerConfig{Handler: func(context.Context, *events.Delivery) error {
		return events.Permanent(errors.New("refused"))
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

	var dls []events.DeadLetter
	require.Eventually(t, func() bool {
		dls, err = events.ListDeadLetters(testCtx(t), env.JS, events.DeadLetterFilter{Limit: 10})
		require.NoError(t, err)
		return len(dls) == 2
	}, 10*time.Second, 10*time.Millisecond)
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

	limited, err := events.ListDeadLetters(testCtx(t), env.JS, events.DeadLetterFilter{Limit: 1})
	require.NoError(t, err)
	require.Len(t, limited, 1)
	_, err = events.GetDeadLetter(testCtx(t), env.JS, 999)
	require.ErrorIs(t, err, events.ErrDeadLetterNotFound)
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
		h.Set(events.HeaderDLQSubject, subject)
		h.Set(events.HeaderDLQDeliveries, deliveries)
		h.Set(events.HeaderDLQHistory, history)
		h.Set(events.HeaderDLQTime, at)
		h.Set("ce-id", body)
		d := events.DeadLetterOf(&jetstream.RawStreamMsg{Subject: "toolwire.dlq.A.b", Sequence: 1, Header: h, Data: []byte(body)})
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

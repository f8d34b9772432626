package publish_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

func TestPublishSameEventTwiceStoresOne(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)
	require.Equal(t, env.JS, pub.JetStream())
	ctx := testCtx(t)

	out := eventstest.CallCompleted(t, 1, `{"results":[]}`)
	require.NoError(t, pub.Publish(ctx, out))
	require.NoError(t, pub.Publish(ctx, out), "a retried publish is not an error")
	require.EqualValues(t, 1, streamMsgs(t, env.JS, events.StreamCalls), "Nats-Msg-Id drops the duplicate")

	m := lastMsg(t, env.JS, events.StreamCalls, out.Subject)
	got, err := events.Decode(m)
	require.NoError(t, err)
	eventstest.RequireSameEvent(t, &out.Event, got)
	require.Empty(t, m.Header.Get(events.HeaderTraceParent), "no span in ctx, no hop header")
}

// PublishFirst stores an event only onto an empty subject: a retried
// publish of it and another event on its subject are both refused without
// an error, and nothing beside the first is stored.
func TestPublishFirstOntoAnEmptySubjectOnly(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)
	ctx := testCtx(t)

	first := eventstest.CallCompleted(t, 1, `{"results":[]}`)
	stored, err := pub.PublishFirst(ctx, first)
	require.NoError(t, err)
	require.True(t, stored)
	stored, err = pub.PublishFirst(ctx, first)
	require.NoError(t, err)
	require.False(t, stored, "a retried publish: the duplicate check answers")

	other := eventstest.CallCompleted(t, 1, `{"results":[]}`)
	other.Event.SetID(first.Event.ID() + "-other")
	stored, err = pub.PublishFirst(ctx, other)
	require.NoError(t, err)
	require.False(t, stored, "another event on a subject that holds one")
	require.EqualValues(t, 1, streamMsgs(t, env.JS, events.StreamCalls))
	got, err := events.Decode(lastMsg(t, env.JS, events.StreamCalls, first.Subject))
	require.NoError(t, err)
	eventstest.RequireSameEvent(t, &first.Event, got)

	_, err = pub.PublishFirst(ctx, events.Outgoing{Subject: "toolwire.nowhere", Event: first.Event})
	require.Error(t, err, "a subject no stream takes")
	require.False(t, publish.WrongLastSequence(err))
}

// FirstOnSubject trusts only the condition as the server reads and checks
// it: the exact header name, the value 0, on the message's own subject.
func TestFirstOnSubject(t *testing.T) {
	const key, subj = "Nats-Expected-Last-Subject-Sequence", "Nats-Expected-Last-Subject-Sequence-Subject"
	for _, tc := range []struct {
		name string
		h    nats.Header
		want bool
	}{
		{"the condition", nats.Header{key: {"0"}}, true},
		{"with an empty override", nats.Header{key: {"0"}, subj: {""}}, true},
		{"none", nats.Header{}, false},
		{"nil", nil, false},
		{"another sequence", nats.Header{key: {"7"}}, false},
		{"the first of two values counts", nats.Header{key: {"5", "0"}}, false},
		{"zero spelled otherwise", nats.Header{key: {"00"}}, false},
		{"trailing space", nats.Header{key: {"0 "}}, false},
		{"lower case: the server ignores it", nats.Header{"nats-expected-last-subject-sequence": {"0"}}, false},
		{"upper case", nats.Header{"NATS-EXPECTED-LAST-SUBJECT-SEQUENCE": {"0"}}, false},
		{"checked on another subject", nats.Header{key: {"0"}, subj: {"toolwire.run.x.>"}}, false},
	} {
		require.Equal(t, tc.want, publish.FirstOnSubject(tc.h), tc.name)
	}
}

func TestPublishedHeadersSurviveTheWire(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)
	e := specialEvent(t)
	subject := "toolwire.sandbox." + runID + "." + callID + ".requested"
	require.NoError(t, pub.Publish(testCtx(t), events.Outgoing{Subject: subject, Event: *e}))

	m := lastMsg(t, env.JS, events.StreamSandbox, subject)
	got, err := events.Decode(m)
	require.NoError(t, err)
	eventstest.RequireSameEvent(t, e, got)
	require.Equal(t, "", events.Ext(got, "empty"))
	require.Contains(t, got.Extensions(), "empty")
}

func TestPublishAll(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)
	ctx := testCtx(t)

	require.NoError(t, pub.PublishAll(ctx, nil))

	outs := make([]events.Outgoing, 20)
	for i := range outs {
		outs[i] = callStarted(t, i+1)
	}
	require.NoError(t, pub.PublishAll(ctx, outs))
	require.EqualValues(t, 20, streamMsgs(t, env.JS, events.StreamCalls))

	require.NoError(t, pub.PublishAll(ctx, outs), "republishing the batch is not an error")
	require.EqualValues(t, 20, streamMsgs(t, env.JS, events.StreamCalls), "and stores nothing new")

	require.NoError(t, pub.PublishAll(ctx, outs[:1]))
	require.EqualValues(t, 20, streamMsgs(t, env.JS, events.StreamCalls))
}

func TestPublishErrors(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)
	ctx := testCtx(t)

	good := callStarted(t, 1)
	bad := good
	bad.Event = good.Event.Clone()
	bad.Event.SetID("")
	err := pub.Publish(ctx, bad)
	require.ErrorIs(t, err, events.ErrInvalidEvent)

	nowhere := callStarted(t, 2)
	nowhere.Subject = "nowhere.at.all"
	err = pub.Publish(ctx, nowhere)
	require.Error(t, err)
	require.ErrorContains(t, err, events.TypeCallStarted)
	require.ErrorContains(t, err, nowhere.Event.ID())

	// PublishAll stores what it can and reports every failure.
	err = pub.PublishAll(ctx, []events.Outgoing{callStarted(t, 3), bad, nowhere})
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	require.ErrorContains(t, err, "nowhere.at.all")
	require.EqualValues(t, 1, streamMsgs(t, env.JS, events.StreamCalls))
}

func TestPublishInjectsHopTrace(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)

	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(testCtx(t))) })
	ctx, span := tp.Tracer("test").Start(testCtx(t), "publish")
	sc := span.SpanContext()
	want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())

	one := callStarted(t, 1)
	require.NoError(t, pub.Publish(ctx, one))
	batch := []events.Outgoing{callStarted(t, 2), callStarted(t, 3)}
	require.NoError(t, pub.PublishAll(ctx, batch))
	span.End()
	require.Len(t, sr.Ended(), 1)

	for _, out := range append(batch, one) {
		m := lastMsg(t, env.JS, events.StreamCalls, out.Subject)
		require.Equal(t, want, m.Header.Get(events.HeaderTraceParent), out.Subject)
		// The run's trace stays in the distributed-tracing extension.
		got, err := events.Decode(m)
		require.NoError(t, err)
		require.Equal(t, runTrace, events.TraceOf(got))
		// ExtractHop recovers the hop's span as the remote parent.
		hop := events.ExtractHop(testCtx(t), m.Header)
		require.Equal(t, sc.TraceID(), trace.SpanContextFromContext(hop).TraceID())
		require.True(t, trace.SpanContextFromContext(hop).IsRemote())
	}
}

func TestPublishAsync(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)
	ctx := testCtx(t)

	out := eventstest.CallCompleted(t, 1, `{"results":[]}`)
	pd, err := pub.PublishAsync(ctx, out)
	require.NoError(t, err)
	require.NoError(t, pd.Wait(ctx), "stored once its PubAck arrived")
	require.NoError(t, pd.Retry(ctx), "a retried publish is not an error")
	require.EqualValues(t, 1, streamMsgs(t, env.JS, events.StreamCalls), "Nats-Msg-Id drops the retried copy")

	m := lastMsg(t, env.JS, events.StreamCalls, out.Subject)
	got, err := events.Decode(m)
	require.NoError(t, err)
	eventstest.RequireSameEvent(t, &out.Event, got)
}

func TestPublishAsyncRejectsWhatCannotBeStored(t *testing.T) {
	env := eventstest.Start(t)
	pub := publish.NewPublisher(env.JS)
	ctx := testCtx(t)

	out := eventstest.CallCompleted(t, 1, `{"results":[]}`)
	out.Subject = "no.stream.takes.this"
	pd, err := pub.PublishAsync(ctx, out)
	if err == nil {
		err = pd.Wait(ctx)
	}
	require.Error(t, err, "a subject no stream stores has no PubAck")
	require.Contains(t, err.Error(), out.Event.ID())
}

package events_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/events"
)

func spanContext(ctx context.Context) trace.SpanContext { return trace.SpanContextFromContext(ctx) }

func TestTracesURL(t *testing.T) {
	cases := []struct{ template, id, want string }{
		{"http://jaeger:16686/trace/{trace_id}", "4bf92f3577b34da6a3ce929d0e0e4736", "http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"},
		{"https://t.example.com/{trace_id}?from={trace_id}", "ab", "https://t.example.com/ab?from=ab"},
		{"", "4bf92f3577b34da6a3ce929d0e0e4736", ""},
		{"http://jaeger/trace/{trace_id}", "", ""},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, events.TracesURL(tc.template, tc.id), tc.template)
	}
}

func TestRunTraceRoundTrip(t *testing.T) {
	// No span: an empty run trace, and a context without one stays as it is.
	require.Equal(t, events.RunTrace{}, events.RunTraceFrom(context.Background()))
	ctx := context.Background()
	require.Equal(t, ctx, events.ContextWithRunTrace(ctx, events.RunTrace{}))
	require.Empty(t, events.RunTrace{}.TraceID())

	// A real span becomes a run trace and back.
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	sctx, span := tp.Tracer("test").Start(context.Background(), "run")
	defer span.End()
	rt := events.RunTraceFrom(sctx)
	sc := span.SpanContext()
	require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", rt.TraceParent)
	require.Equal(t, sc.TraceID().String(), rt.TraceID())

	back := spanContext(events.ContextWithRunTrace(context.Background(), rt))
	require.True(t, back.IsRemote())
	require.Equal(t, sc.TraceID(), back.TraceID())
	require.Equal(t, sc.SpanID(), back.SpanID())
	require.True(t, back.IsSampled())
	require.Equal(t, rt, events.RunTraceFrom(events.ContextWithRunTrace(context.Background(), rt)))

	// The trace state travels with it.
	require.Equal(t, runTrace, events.RunTraceFrom(events.ContextWithRunTrace(context.Background(), runTrace)))
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", runTrace.TraceID())
}

func TestRunTraceIgnoresInvalidTraceParent(t *testing.T) {
	for _, tp := range []string{"garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"} {
		rt := events.RunTrace{TraceParent: tp}
		require.Empty(t, rt.TraceID(), tp)
		require.False(t, spanContext(events.ContextWithRunTrace(context.Background(), rt)).IsValid(), tp)
	}
}

func TestHopHeaders(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "hop")
	defer span.End()

	h := nats.Header{}
	events.InjectHop(ctx, h)
	require.NotEmpty(t, h.Get(events.HeaderTraceParent))

	// Keys are matched without regard to case, as any producer may write them.
	other := nats.Header{"TraceParent": {h.Get(events.HeaderTraceParent)}}
	sc := spanContext(events.ExtractHop(context.Background(), other))
	require.Equal(t, span.SpanContext().TraceID(), sc.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), sc.SpanID())

	c := events.HeaderCarrier(other)
	require.Equal(t, []string{"TraceParent"}, c.Keys())
	c.Set("tracestate", "a=b")
	require.Equal(t, "a=b", c.Get("TRACESTATE"))

	// No span, no header.
	empty := nats.Header{}
	events.InjectHop(context.Background(), empty)
	require.Empty(t, empty)
}

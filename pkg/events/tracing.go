package events

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HeaderCarrier adapts nats.Header to OpenTelemetry's TextMapCarrier, matching
// keys without regard to case.
type HeaderCarrier nats.Header

// Get implements propagation.TextMapCarrier.
func (c HeaderCarrier) Get(key string) string { return headerFold(nats.Header(c), key) }

// Set implements propagation.TextMapCarrier.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys implements propagation.TextMapCarrier.
func (c HeaderCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// TraceContext is the W3C trace-context propagator used on every hop.
var traceContext propagation.TraceContext

// InjectHop writes ctx's span into the hop headers (traceparent, tracestate).
func InjectHop(ctx context.Context, h nats.Header) { traceContext.Inject(ctx, HeaderCarrier(h)) }

// ExtractHop returns ctx carrying the remote span of the hop headers.
func ExtractHop(ctx context.Context, h nats.Header) context.Context {
	return traceContext.Extract(ctx, HeaderCarrier(h))
}

// RunTraceFrom returns the trace context of ctx's span as a RunTrace, for the
// distributed-tracing extension of a run's events.
func RunTraceFrom(ctx context.Context) RunTrace {
	c := propagation.MapCarrier{}
	traceContext.Inject(ctx, c)
	return RunTrace{TraceParent: c["traceparent"], TraceState: c["tracestate"]}
}

// ContextWithRunTrace returns ctx carrying rt as its remote parent span.
func ContextWithRunTrace(ctx context.Context, rt RunTrace) context.Context {
	if rt.TraceParent == "" {
		return ctx
	}
	c := propagation.MapCarrier{"traceparent": rt.TraceParent}
	if rt.TraceState != "" {
		c["tracestate"] = rt.TraceState
	}
	return traceContext.Extract(ctx, c)
}

// TraceID returns the trace id of rt, or "".
func (rt RunTrace) TraceID() string {
	sc := trace.SpanContextFromContext(ContextWithRunTrace(context.Background(), rt))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// TracesURL fills a template such as "http://jaeger:16686/trace/{trace_id}"
// with the trace id; an empty template or trace id yields "".
func TracesURL(template, traceID string) string {
	if template == "" || traceID == "" {
		return ""
	}
	return strings.ReplaceAll(template, "{trace_id}", traceID)
}

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

// TraceID returns the trace id of rt, or "". A well-formed version 00
// traceparent is read directly (the recorder does it for every event); any
// other goes through the W3C propagator.
func (rt RunTrace) TraceID() string {
	if id, ok := traceIDFast(rt.TraceParent); ok {
		return id
	}
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

// traceIDFast reads the trace id of a traceparent of the common shape
// "00-<32 hex>-<16 hex>-<00 or 01>" with non-zero ids, all of which the W3C
// propagator accepts. ok is false for anything
// else, which is then left to the propagator.
func traceIDFast(p string) (string, bool) {
	if len(p) != 55 || p[0] != '0' || p[1] != '0' || p[2] != '-' || p[35] != '-' || p[52] != '-' {
		return "", false
	}
	traceID, spanID, flags := p[3:35], p[36:52], p[53:55]
	if flags != "00" && flags != "01" { // other flags: the propagator's rules
		return "", false
	}
	if !lowerHex(traceID) || !lowerHex(spanID) || allZero(traceID) || allZero(spanID) {
		return "", false
	}
	return traceID, true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}

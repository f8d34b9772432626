package recorder

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Spans of the recorder.
const (
	// SpanWrite is one transaction of the batch writer: the events it
	// records, linked to the runs' traces.
	SpanWrite = "recorder write"

	// maxSpanLinks bounds the links of a write span to the traces of its
	// events' runs.
	maxSpanLinks = 64
)

// startWrite starts the span of one write of recs to a database of kind
// ("postgres" or "sqlite"), linked to the traces of the runs it records
// (deduplicated, at most maxSpanLinks); end ends it with err.
func startWrite(ctx context.Context, tr trace.Tracer, kind string, recs []store.Record) (context.Context, func(err error)) {
	if tr == nil {
		return ctx, func(error) {}
	}
	system := kind
	if kind == "postgres" {
		system = "postgresql" // OTel's db.system.name value
	}
	var links []trace.Link
	seen := map[trace.TraceID]bool{}
	for i := range recs {
		if len(links) == maxSpanLinks {
			break
		}
		tp := recs[i].Event.Extensions[events.ExtTraceParent]
		if tp == "" {
			continue
		}
		sc := trace.SpanContextFromContext(events.ContextWithRunTrace(ctx, events.RunTrace{TraceParent: tp}))
		if !sc.IsValid() || seen[sc.TraceID()] {
			continue
		}
		seen[sc.TraceID()] = true
		links = append(links, trace.Link{SpanContext: sc})
	}
	ctx, span := tr.Start(ctx, SpanWrite, trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("db.system.name", system),
			attribute.String("db.operation.name", "record"),
			attribute.Int("db.operation.batch.size", len(recs)),
		))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

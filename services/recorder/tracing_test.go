package recorder_test

import (
	"path/filepath"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestRecorderWritesAreSpans: each transaction of the recorder is a span
// naming the database and how many events it recorded, linked to the trace
// of the run whose events it holds.
func TestRecorderWritesAreSpans(t *testing.T) {
	env := eventstest.Start(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	rec, err := recorder.New(service.Deps{JS: env.JetStream(t), Log: quietLog(), Tracer: tp},
		recorder.Config{DatabaseURL: sqlite.URL(filepath.Join(t.TempDir(), "r.db"))})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, rec)
	fx := storetest.CompletedRun(t, "traced-run", "weather", storetest.TenantA, time.Now())
	publishEvents(t, env.JS, fx.Events...)
	runTrace := trace.SpanContextFromContext(events.ContextWithRunTrace(t.Context(), fx.Trace)).TraceID()
	eventually(t, "write spans of every event, linked to the run's trace", func() (bool, string) {
		recorded, linked := 0, false
		for _, s := range spans.Ended() {
			if s.Name() != recorder.SpanWrite {
				continue
			}
			attrs := map[string]any{}
			for _, a := range s.Attributes() {
				attrs[string(a.Key)] = a.Value.AsInterface()
			}
			if attrs["db.system.name"] != "sqlite" {
				return false, "db.system.name " + attrs["db.system.name"].(string)
			}
			n, _ := attrs["db.operation.batch.size"].(int64)
			recorded += int(n)
			for _, l := range s.Links() {
				linked = linked || l.SpanContext.TraceID() == runTrace
			}
		}
		return recorded >= len(fx.Events) && linked, "not yet"
	})
}

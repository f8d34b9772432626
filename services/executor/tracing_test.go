package executor

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// spanSink hands every ended execute_tool span to the test.
type spanSink struct{ ended chan sdktrace.ReadOnlySpan }

func (s spanSink) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (s spanSink) OnEnd(sp sdktrace.ReadOnlySpan) {
	if strings.HasPrefix(sp.Name(), "execute_tool ") {
		s.ended <- sp
	}
}
func (s spanSink) Shutdown(context.Context) error   { return nil }
func (s spanSink) ForceFlush(context.Context) error { return nil }

func TestExecuteToolSpans(t *testing.T) {
	env := eventstest.Start(t)
	sink := spanSink{ended: make(chan sdktrace.ReadOnlySpan, 16)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sink))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	startExecutorWith(t, testDeps(t, env, tp), Config{})
	schemas := newEventSchemas(t)

	const runID = "run-spans"
	w := watchRun(t, env.JS, runID)
	pub := publish.NewPublisher(env.JS)
	// The caller's span travels in the hop headers and parents the tool's span.
	ctx, parent := tp.Tracer("test").Start(t.Context(), "policy")
	ok := callRequest(t, runID, 1, "echo", "1.0.0", `{"text":"traced"}`)
	bad := callRequest(t, runID, 2, "calculator", "1.0.0", `{"expression":"1/0"}`)
	for _, req := range []events.CallRequest{ok, bad} {
		require.NoError(t, pub.Publish(ctx, approved(t, req, events.RunTrace{})))
	}
	parent.End()
	w.envelopeOf(t, schemas, ok)
	w.envelopeOf(t, schemas, bad)

	spans := map[string]sdktrace.ReadOnlySpan{}
	for len(spans) < 2 {
		select {
		case sp := <-sink.ended:
			spans[sp.Name()] = sp
		case <-t.Context().Done():
			t.Fatal("spans never ended")
		}
	}

	tests := []struct {
		name    string
		req     events.CallRequest
		errType string
	}{
		{name: "execute_tool echo", req: ok},
		{name: "execute_tool calculator", req: bad, errType: "VALIDATION_ERROR"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sp, found := spans[tc.name]
			require.True(t, found)
			require.Equal(t, trace.SpanKindInternal, sp.SpanKind())
			require.Equal(t, parent.SpanContext().TraceID(), sp.SpanContext().TraceID(), "one trace")
			require.Equal(t, parent.SpanContext().SpanID(), sp.Parent().SpanID(), "parented by the hop")
			attrs := map[attribute.Key]string{}
			for _, kv := range sp.Attributes() {
				attrs[kv.Key] = kv.Value.String()
			}
			require.Equal(t, "execute_tool", attrs["gen_ai.operation.name"])
			require.Equal(t, tc.req.Name, attrs["gen_ai.tool.name"])
			require.Equal(t, tc.req.CallID, attrs["gen_ai.tool.call.id"])
			require.Equal(t, "extension", attrs["gen_ai.tool.type"])
			require.Equal(t, runID, attrs["toolwire.run_id"])
			require.Equal(t, "1.0.0", attrs["toolwire.tool.version"])
			if tc.errType == "" {
				require.NotContains(t, attrs, attribute.Key("error.type"))
				require.Equal(t, codes.Unset, sp.Status().Code)
				return
			}
			require.Equal(t, tc.errType, attrs["error.type"])
			require.Equal(t, codes.Error, sp.Status().Code)
		})
	}

	// The completed event's hop headers carry the tool's span onwards.
	st, err := env.JS.Stream(t.Context(), events.StreamCalls)
	require.NoError(t, err)
	msg, err := st.GetLastMsgForSubject(t.Context(), completedSubject(t, ok))
	require.NoError(t, err)
	hop := msg.Header.Get(events.HeaderTraceParent)
	require.Contains(t, hop, spans["execute_tool echo"].SpanContext().SpanID().String())
}

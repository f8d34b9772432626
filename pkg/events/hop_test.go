package events

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// BenchmarkCallRequestHop is what one hop costs a service besides NATS: build
// and encode a call request, decode it, read its data and trace.
func BenchmarkCallRequestHop(b *testing.B) {
	req := CallRequest{
		RunID: "run-1", CallID: "1cddb19ff260abc62231ef762d936bc03f3df400d7d6986f5a9e12f302969302", Seq: 1, Iteration: 1,
		Name: "echo", Version: "1.0.0", Input: json.RawMessage(`{"text":"hello"}`), Tenant: envelope.Tenant{OrgID: "acme"},
		Agent: "bench", Queue: envelope.DefaultQueue,
	}
	tr := RunTrace{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	b.ReportAllocs()
	for b.Loop() {
		out, err := NewCallApproved("/toolwire/policy", req, tr)
		if err != nil {
			b.Fatal(err)
		}
		m, err := Encode(out.Subject, &out.Event)
		if err != nil {
			b.Fatal(err)
		}
		ev, err := Decode(m)
		if err != nil {
			b.Fatal(err)
		}
		var got CallRequest
		if err := DecodeData(ev, &got); err != nil {
			b.Fatal(err)
		}
		if TraceOf(ev).TraceParent != tr.TraceParent || Ext(ev, ExtRunID) != req.RunID {
			b.Fatal("trace or run id lost")
		}
	}
}

// The direct reading of a traceparent's trace id agrees with the W3C
// propagator on every input, well-formed or not.
func TestTraceIDFastAgreesWithThePropagator(t *testing.T) {
	ok := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	inputs := []string{ok, "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
		"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz", "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"}
	for i := 0; i < len(ok); i++ { // every single-byte change of a valid one
		for _, c := range []byte{'0', 'f', 'g', 'A', '-', ' '} {
			inputs = append(inputs, ok[:i]+string(c)+ok[i+1:])
		}
	}
	for _, p := range inputs {
		rt := RunTrace{TraceParent: p}
		want := ""
		if sc := trace.SpanContextFromContext(ContextWithRunTrace(context.Background(), rt)); sc.IsValid() {
			want = sc.TraceID().String()
		}
		require.Equal(t, want, rt.TraceID(), "traceparent %q", p)
	}
}

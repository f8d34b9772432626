package events

import (
	"encoding/json"
	"testing"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// BenchmarkCallRequestHop is what one hop costs a service besides NATS: build
// and encode a call request, decode it, read its data and trace.
func BenchmarkCallRequestHop(b *testing.B) {
	req := CallRequest{
		RunID: "run-1", CallID: "1cddb19ff260abc62231ef762d936bc03f3df400d7d6986f5a9e12f302969302", Seq: 1, Iteration: 1,
		Name: "echo", Version: "1.0.0", Input: json.RawMessage(`{"text":"hello"}`), Tenant: envelope.Tenant{OrgID: "acme"},
		Agent: "bench", EnabledTools: []string{"echo@1.0.0"}, Policy: envelope.Policy{MaxToolCalls: 8},
	}
	tr := RunTrace{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	b.ReportAllocs()
	for b.Loop() {
		out, err := NewCallRequest("/toolwire/policy", "approved", req, tr)
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

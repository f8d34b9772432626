package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
)

// The contract chain is the raw chain carrying what toolwire's event contract
// puts on the wire, with none of the services' work: each message has the
// headers and data of a real call.approved event (the CloudEvents binary
// mode's ce-* headers, the run's and the hop's trace context, a Nats-Msg-Id
// as long as an event id), and each hop consumes and publishes on a
// connection of its own, as each service has. Beside the raw chain it shows
// how much of the pipeline's cost per hop is the contract's and how much the
// services'.
const (
	contractStream  = "BENCH_CONTRACT_CHAIN"
	contractSubject = "benchcontract"
)

// contractMessage returns the headers and data of a real call approved
// event, on the default queue.
func contractMessage() (nats.Header, []byte, error) {
	input := json.RawMessage(`{"text":"0"}`)
	callID, err := envelope.CallID("echo", "1.0.0", input, 1)
	if err != nil {
		return nil, nil, err
	}
	rt := events.RunTrace{TraceParent: "00-8a009bcf404c4fa11021c03f8886e1bc-6eb3ff6158514a47-01"}
	out, err := events.NewCallApproved("/toolwire/policy", events.CallRequest{
		RunID: "bench-000000000-1", CallID: callID, Seq: 1, Iteration: 1, Name: "echo", Version: "1.0.0",
		Input: input, Tenant: envelope.Tenant{OrgID: "bench"}, Agent: "bench", Queue: envelope.DefaultQueue,
	}, rt)
	if err != nil {
		return nil, nil, err
	}
	m, err := events.Encode(out.Subject, &out.Event)
	if err != nil {
		return nil, nil, err
	}
	// The hop's own trace context, as events.InjectHop writes it.
	m.Header.Set(events.HeaderTraceParent, "00-8a009bcf404c4fa11021c03f8886e1bc-fd07b9b6d5e927ed-01")
	// msg sets the Nats-Msg-Id from the chain's id, which contractChain
	// makes as long as this one.
	return m.Header, m.Data, nil
}

// contractChain is a chain shaped as above, with its three connections; close
// both when done.
type contractChain struct {
	*chain
	conns   []*nats.Conn
	payload []byte
}

func newContractChain(ctx context.Context, js jetstream.JetStream, url string) (_ *contractChain, err error) {
	h, data, err := contractMessage()
	if err != nil {
		return nil, fmt.Errorf("contract chain: %w", err)
	}
	cc := &contractChain{payload: data}
	defer func() {
		if err != nil {
			cc.closeConns()
		}
	}()
	var hops []jetstream.JetStream
	for i := range 3 {
		nc, hjs, err := service.Connect(ctx, url, fmt.Sprintf("bench-hop%d", i+1), slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, fmt.Errorf("contract chain: %w", err)
		}
		cc.conns = append(cc.conns, nc)
		hops = append(hops, hjs)
	}
	// Ids as long as an event's (<run>/<call>/<verb>): the duplicate window
	// holds them, and the Nats-Msg-Id header carries one per message.
	idPrefix := strings.TrimSuffix(h.Get(nats.MsgIdHdr), "approved")
	h.Del(nats.MsgIdHdr)
	cc.chain, err = newShapedChain(ctx, js, chainOptions{stream: contractStream, subject: contractSubject,
		hops: hops, header: h, idPrefix: idPrefix})
	if err != nil {
		return nil, fmt.Errorf("contract chain: %w", err)
	}
	return cc, nil
}

func (c *contractChain) closeConns() {
	for _, nc := range c.conns {
		nc.Close()
	}
}

func (c *contractChain) close(ctx context.Context) {
	if c.chain != nil {
		c.chain.close(ctx)
	}
	c.closeConns()
}

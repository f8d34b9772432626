package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// chain is the raw baseline: three hops of publish (waiting for the PubAck),
// pull-consume, and ack, on a stream of its own, as toolwire's services do.
type chain struct {
	js      jetstream.JetStream
	stream  jetstream.Stream
	subject string // subject prefix: <subject>.hop<n>
	header  nats.Header
	// idPrefix starts every chain id (contractChain makes them event-sized).
	idPrefix string
	ccs      []jetstream.ConsumeContext
	mu       sync.Mutex
	waiters  map[string]chan struct{}
	seq      atomic.Int64
}

// chainOptions shape a chain. The zero value is the raw baseline: its own
// stream, every hop on js, and no header but the Nats-Msg-Id (which carries
// the chain's id).
type chainOptions struct {
	stream, subject string
	// hops, when set, are the connections of hops 1-3 (each consumes and
	// publishes on its own), as each service has its own.
	hops []jetstream.JetStream
	// header is copied into every message: the chain then carries the
	// headers an event of toolwire carries.
	header nats.Header
	// idPrefix starts every chain id.
	idPrefix string
}

const chainStream = "BENCH_CHAIN"

func newChain(ctx context.Context, js jetstream.JetStream) (*chain, error) {
	return newShapedChain(ctx, js, chainOptions{})
}

func newShapedChain(ctx context.Context, js jetstream.JetStream, o chainOptions) (_ *chain, err error) {
	if o.stream == "" {
		o.stream, o.subject = chainStream, "benchchain"
	}
	_ = js.DeleteStream(ctx, o.stream)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: o.stream, Subjects: []string{o.subject + ".>"}, Storage: jetstream.FileStorage,
		Retention: jetstream.LimitsPolicy, Duplicates: 2 * time.Minute, MaxAge: time.Hour,
	})
	if err != nil {
		return nil, fmt.Errorf("baseline stream: %w", err)
	}
	c := &chain{js: js, stream: st, subject: o.subject, header: o.header, idPrefix: o.idPrefix, waiters: map[string]chan struct{}{}}
	defer func() {
		if err != nil {
			c.close(context.WithoutCancel(ctx))
		}
	}()
	for hop := 1; hop <= 3; hop++ {
		hjs := js
		if len(o.hops) == 3 {
			hjs = o.hops[hop-1]
		}
		if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "hop" + strconv.Itoa(hop), FilterSubject: c.hopSubject(hop),
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 4096, AckWait: 30 * time.Second,
		}); err != nil {
			return nil, err
		}
		cons, err := hjs.Consumer(ctx, o.stream, "hop"+strconv.Itoa(hop))
		if err != nil {
			return nil, err
		}
		next := hop + 1
		cc, err := cons.Consume(func(m jetstream.Msg) {
			id := m.Headers().Get(nats.MsgIdHdr)
			id = id[:max(strings.LastIndexByte(id, '/'), 0)] // <chain id>/<hop>
			if next <= 3 {
				if _, err := hjs.PublishMsg(context.Background(), c.msg(next, id, m.Data())); err != nil {
					_ = m.Nak()
					return
				}
			}
			_ = m.Ack()
			if next > 3 {
				c.mu.Lock()
				ch := c.waiters[id]
				delete(c.waiters, id)
				c.mu.Unlock()
				if ch != nil {
					close(ch)
				}
			}
		}, jetstream.PullMaxMessages(256))
		if err != nil {
			return nil, err
		}
		c.ccs = append(c.ccs, cc)
	}
	return c, nil
}

// once runs one chain and returns when the third hop has it.
func (c *chain) once(ctx context.Context, payload []byte) error {
	id := c.idPrefix + "c" + strconv.FormatInt(c.seq.Add(1), 10)
	done := make(chan struct{})
	c.mu.Lock()
	c.waiters[id] = done
	c.mu.Unlock()
	if _, err := c.js.PublishMsg(ctx, c.msg(1, id, payload)); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *chain) hopSubject(hop int) string { return c.subject + ".hop" + strconv.Itoa(hop) }

// msg is the chain's message for hop: its headers and a Nats-Msg-Id, as
// every event has, made of the chain's id and the hop.
func (c *chain) msg(hop int, id string, data []byte) *nats.Msg {
	m := nats.NewMsg(c.hopSubject(hop))
	for k, v := range c.header {
		m.Header[k] = v
	}
	m.Header.Set(nats.MsgIdHdr, id+"/"+strconv.Itoa(hop))
	m.Data = data
	return m
}

func (c *chain) close(ctx context.Context) {
	for _, cc := range c.ccs {
		cc.Stop()
	}
	_ = c.js.DeleteStream(ctx, c.stream.CachedInfo().Config.Name)
}

// latency runs n chains one at a time.
func (c *chain) latency(ctx context.Context, n int, payload []byte) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if err := c.once(ctx, payload); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// throughput keeps inFlight chains going for d and returns chains per second.
func (c *chain) throughput(ctx context.Context, inFlight int, d time.Duration, payload []byte) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	n, elapsed, err := keepBusy(inFlight, d, func() error { return c.once(ctx, payload) })
	if err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// kvRoundTrip measures a KV get plus a compare-and-set update.
func kvRoundTrip(ctx context.Context, js jetstream.JetStream, n int) ([]time.Duration, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_kv", Storage: jetstream.FileStorage})
	if err != nil {
		return nil, err
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), "bench_kv") }()
	if _, err := kv.Put(ctx, "k", []byte("0")); err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, n)
	for i := range n {
		t := time.Now()
		e, err := kv.Get(ctx, "k")
		if err != nil {
			return nil, err
		}
		if _, err := kv.Update(ctx, "k", []byte(strconv.Itoa(i)), e.Revision()); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

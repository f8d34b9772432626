// Package eventstest gives tests a hermetic JetStream: an in-process
// nats-server on a random port with a temporary store, provisioned with
// toolwire's streams and buckets, torn down by t.Cleanup.
package eventstest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

// Env is a running test server with a provisioned JetStream.
type Env struct {
	Server *server.Server
	URL    string
	Conn   *nats.Conn
	JS     jetstream.JetStream
}

// Start starts a server for t and provisions toolwire's streams and buckets.
func Start(t testing.TB) *Env {
	t.Helper()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	t.Cleanup(func() { embedded.Stop(s) })
	env := &Env{Server: s, URL: s.ClientURL()}
	env.Conn = env.Connect(t)
	env.JS, err = jetstream.New(env.Conn)
	if err != nil {
		t.Fatalf("eventstest: jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := provision.Provision(ctx, env.JS, provision.StoreConfig{}); err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	return env
}

// Connect opens another connection to the test server, closed by t.Cleanup.
func (e *Env) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(e.URL, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("eventstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream opens a new connection and returns a JetStream handle on it.
func (e *Env) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(e.Connect(t))
	if err != nil {
		t.Fatalf("eventstest: jetstream: %v", err)
	}
	return js
}

// Publish publishes events and waits for their PubAcks.
func (e *Env) Publish(t testing.TB, outs ...events.Outgoing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := publish.NewPublisher(e.JS).PublishAll(ctx, outs); err != nil {
		t.Fatalf("eventstest: publish: %v", err)
	}
}

// Next waits, at most within, for the first event stored in stream on one of
// the subjects filters match, and returns it decoded with its subject.
func (e *Env) Next(t testing.TB, stream string, within time.Duration, filters ...string) (*event.Event, string) {
	t.Helper()
	ev, subject, err := NextEvent(context.Background(), e.JS, stream, within, filters...)
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	return ev, subject
}

// NextEvent is Next for code that handles the error itself.
func NextEvent(ctx context.Context, js jetstream.JetStream, stream string, within time.Duration, filters ...string) (*event.Event, string, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		return nil, "", fmt.Errorf("consumer on %s %v: %w", stream, filters, err)
	}
	m, err := cons.Next(jetstream.FetchContext(ctx))
	if err != nil {
		return nil, "", fmt.Errorf("no event on %s %v within %s: %w", stream, filters, within, err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	if err != nil {
		return nil, "", fmt.Errorf("decode %s: %w", m.Subject(), err)
	}
	return ev, m.Subject(), nil
}

// Package eventstest gives tests a hermetic JetStream: an in-process
// nats-server on a random port with a temporary store, provisioned with
// toolwire's streams and buckets, torn down by t.Cleanup.
package eventstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/embedded"
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
	if err := events.Provision(ctx, env.JS, events.StoreConfig{}); err != nil {
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

// Package natstest starts the in-process JetStream server of this module's
// own tests. Users' tests use pkg/service/eventstest, which does the same
// with the embedded server of `toolwire dev`; this module cannot import it
// (pkg/service imports pkg/events), and keeping the server out of pkg/events'
// packages keeps the wire light for upstream systems.
package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
)

// Env is a running test server with toolwire's streams and buckets.
type Env struct {
	URL string
	JS  jetstream.JetStream
}

// Start starts a server for t on a random port with a temporary store,
// provisions it and stops it at t's cleanup.
func Start(t testing.TB) *Env {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
	})
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("natstest: server not ready after 10s")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL(), nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := events.Provision(ctx, js, events.StoreConfig{}); err != nil {
		t.Fatalf("natstest: provision: %v", err)
	}
	return &Env{URL: s.ClientURL(), JS: js}
}

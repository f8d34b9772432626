// Package embedded starts an in-process nats-server with JetStream, for
// `toolwire dev` and for users' integration tests.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toolwire/toolwire/pkg/service/identity"
)

// Options configure an embedded server.
type Options struct {
	// Listen is host:port; port 0 (or "") picks a free port on 127.0.0.1.
	Listen string
	// StoreDir is JetStream's data folder; required.
	StoreDir string
	// ReadyTimeout bounds the wait for the server to accept connections.
	// Default 10s.
	ReadyTimeout time.Duration
	// Logs turns on the server's own log output (to stderr).
	Logs bool
	// Identities, when set, are the only clients the server lets in, each
	// in its account with its permissions (identity.Keys.ServerConfig, the
	// configuration a production server gets); nil lets anyone in.
	Identities *identity.Keys
}

// ErrAddrInUse is returned when the listen address is already taken.
var ErrAddrInUse = errors.New("address already in use")

// Start starts the server and waits until it is ready.
func Start(o Options) (*server.Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("embedded nats: StoreDir is required")
	}
	if err := os.MkdirAll(o.StoreDir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded nats: store dir: %w", err)
	}
	host, port := "127.0.0.1", -1
	if o.Listen != "" {
		h, p, err := net.SplitHostPort(o.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen %q: %w", o.Listen, err)
		}
		if h != "" {
			host = h
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 65535 {
			return nil, fmt.Errorf("embedded nats: listen %q: bad port", o.Listen)
		}
		if n != 0 {
			port = n
			// nats-server only logs a taken port and never becomes ready: check
			// first so that the user gets a clear error instead of a wait.
			l, err := net.Listen("tcp", net.JoinHostPort(host, p))
			if err != nil {
				return nil, fmt.Errorf("embedded nats: cannot listen on %s: %w (%w): stop what holds it or pick another address", o.Listen, ErrAddrInUse, err)
			}
			_ = l.Close()
		}
	}
	opts := &server.Options{}
	if o.Identities != nil {
		if err := opts.ProcessConfigString(o.Identities.ServerConfig()); err != nil {
			return nil, fmt.Errorf("embedded nats: accounts: %w", err)
		}
	}
	opts.ServerName = "toolwire-embedded"
	opts.Host, opts.Port = host, port
	opts.JetStream, opts.StoreDir = true, o.StoreDir
	opts.NoSigs, opts.NoLog = true, !o.Logs
	// JetStream's memory and storage limits stay at their defaults (a share
	// of the machine), which suits one developer machine.
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if o.Logs {
		s.ConfigureLogger()
	}
	go s.Start()
	wait := o.ReadyTimeout
	if wait <= 0 {
		wait = 10 * time.Second
	}
	if !s.ReadyForConnections(wait) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after %s on %s:%d", wait, host, port)
	}
	return s, nil
}

// Stop shuts the server down and waits until it has.
func Stop(s *server.Server) {
	if s == nil {
		return
	}
	s.Shutdown()
	s.WaitForShutdown()
}

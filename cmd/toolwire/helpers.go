package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/stack"
)

func readAll(r io.Reader) ([]byte, error) { return io.ReadAll(io.LimitReader(r, 16<<20)) }

// readInput reads the file a command was given; "-" reads stdin.
func readInput(path string, stdin io.Reader) ([]byte, error) {
	if path == "-" {
		return readAll(stdin)
	}
	return os.ReadFile(path)
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// decodeStrict decodes the one JSON value of b into v: a field v lacks, or
// anything but white space after the value, is an error.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("invalid JSON: it ends before its value does (%w)", err)
		}
		return fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("invalid JSON: content after its value, at byte %d", dec.InputOffset())
	}
	return nil
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func contextWithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// withJetStream runs fn on a connection made for one command, within its
// --timeout (none when timeout is 0), and closes the connection after.
func withJetStream(ctx context.Context, url string, timeout time.Duration, fn func(ctx context.Context, js jetstream.JetStream) error) error {
	ctx, cancel := contextWithTimeout(ctx, timeout)
	defer cancel()
	nc, js, err := connectCLI(ctx, url)
	if err != nil {
		return err
	}
	defer nc.Close()
	return fn(ctx, js)
}

// connectWait bounds how long a command waits for NATS to answer: a server
// that is there answers within milliseconds, one that is not never does.
const connectWait = 10 * time.Second

// connectCLI connects a command to NATS within ctx (its --timeout) and at
// most connectWait; when nothing answers, it says where it looked and how to
// start toolwire.
func connectCLI(ctx context.Context, url string) (*nats.Conn, jetstream.JetStream, error) {
	cctx, cancel := context.WithTimeout(ctx, connectWait)
	defer cancel()
	id, where, implicit, err := cliIdentity(os.Getenv, devDataDir)
	if err != nil {
		return nil, nil, err
	}
	opts, err := id.NATSOptions()
	if err != nil {
		return nil, nil, err
	}
	nc, js, err := service.Connect(cctx, url, "cli", discardLogger(), opts...)
	if errors.Is(err, nats.ErrNkeysNotSupported) && implicit {
		// The dev's seed is there, but this server takes anyone (a dev
		// with --nats-auth=false, a NATS without authentication).
		nc, js, err = service.Connect(cctx, url, "cli", discardLogger())
	}
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return nil, nil, fmt.Errorf("NATS at %s refused the CLI (%s): `toolwire dev` keeps the operator's nkey seed in "+
			"<data-dir>/identities/operator.nk (%s by default); point %s at it, or %s at a .creds file: %w",
			url, where, stack.IdentitiesDir(devDataDir), service.EnvNATSSeedFile, service.EnvNATSCreds, err)
	}
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && cctx.Err() != nil {
		waited := connectWait
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < 0 {
			waited = 0
		}
		return nil, nil, withCode(exitUnreachable, fmt.Errorf("no toolwire at %s: nothing answered%s; start it with `toolwire dev`, "+
			"or point --nats (or NATS_URL) at your NATS server", url, waitedText(waited)))
	}
	return nc, js, err
}

func waitedText(d time.Duration) string {
	if d <= 0 {
		return " within the command's timeout"
	}
	return " within " + d.String()
}

// devDataDir is `toolwire dev`'s data folder by default.
const devDataDir = ".toolwire"

// cliIdentity is who the CLI connects to NATS as: the seed file or .creds
// file the environment names (TOOLWIRE_NATS_NKEY_SEED_FILE, NATS_CREDS, as
// for the services), else the operator's seed of a `toolwire dev` started in
// this folder (implicit: used only if the server asks for a key), else
// nobody (a server without authentication). where says which, for messages.
func cliIdentity(getenv func(string) string, dataDir string) (c service.Common, where string, implicit bool, err error) {
	c, err = service.CommonFromEnv("cli", "127.0.0.1:0", func(k string) string {
		switch k {
		case service.EnvNATSSeedFile, service.EnvNATSCreds, service.EnvNATSInbox:
			return getenv(k)
		}
		return ""
	})
	if err != nil {
		return c, "", false, err
	}
	switch {
	case c.NATSSeedFile != "":
		return c, service.EnvNATSSeedFile + "=" + c.NATSSeedFile, false, nil
	case c.NATSCredsFile != "":
		return c, service.EnvNATSCreds + "=" + c.NATSCredsFile, false, nil
	}
	dev := identity.SeedFile(stack.IdentitiesDir(dataDir), identity.Operator)
	if _, err := os.Stat(dev); err == nil {
		c.NATSSeedFile = dev
		return c, "the operator's seed " + dev, true, nil
	}
	return c, "no credentials: neither " + service.EnvNATSSeedFile + ", " + service.EnvNATSCreds + " nor " + dev, false, nil
}

// devNATSURL is where `toolwire dev` serves NATS by default.
const devNATSURL = "nats://127.0.0.1:4223"

// natsFlag adds a command's --nats flag: default $NATS_URL, else the dev
// server's URL.
func natsFlag(fl *pflag.FlagSet, dst *string) {
	def := os.Getenv("NATS_URL")
	if def == "" {
		def = devNATSURL
	}
	fl.StringVar(dst, "nats", def, "NATS URL (default $NATS_URL, else the dev server)")
}

package events_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// testCtx is a context bounded for one test.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// quietLogger drops the runner's logs; the tests assert on effects instead.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// hexID is a valid call id made from n.
func hexID(n int) string { return fmt.Sprintf("%064x", n) }

// callStarted is a call event of its own call id n.
func callStarted(t testing.TB, n int) events.Outgoing {
	t.Helper()
	out, err := events.NewCallStarted("/toolwire/test",
		events.CallStarted{RunID: runID, CallID: hexID(n), Name: "web_search", Version: "1.2.0", TStart: t0},
		tenant, runTrace)
	require.NoError(t, err)
	return out
}

func streamMsgs(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(testCtx(t), stream)
	require.NoError(t, err)
	info, err := s.Info(testCtx(t))
	require.NoError(t, err)
	return info.State.Msgs
}

// lastMsg returns the last message stored on subject, as a nats.Msg.
func lastMsg(t testing.TB, js jetstream.JetStream, stream, subject string) *nats.Msg {
	t.Helper()
	s, err := js.Stream(testCtx(t), stream)
	require.NoError(t, err)
	raw, err := s.GetLastMsgForSubject(testCtx(t), subject)
	require.NoError(t, err)
	return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
}

package eventstest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// The tenant, run and trace of the events CallStarted and CallCompleted make.
var (
	Tenant   = envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "u-42"}
	RunID    = "run_2025-03-14_001"
	RunTrace = events.RunTrace{
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		TraceState:  "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
	}
	// T0 is the fixed time of those events.
	T0 = time.Date(2025, 3, 14, 9, 26, 53, 589793000, time.UTC)
)

// Context is a context bounded for one test (30 s), cancelled at its end.
func Context(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// QuietLogger drops every log line: tests assert on effects instead.
func QuietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// HexID is a valid call id made from n.
func HexID(n int) string { return fmt.Sprintf("%064x", n) }

// CallStarted is a call event of RunID whose call id is HexID(n).
func CallStarted(t testing.TB, n int) events.Outgoing {
	t.Helper()
	out, err := events.NewCallStarted("/toolwire/test",
		events.CallStarted{RunID: RunID, CallID: HexID(n), Name: "web_search", Version: "1.2.0", TStart: T0},
		Tenant, RunTrace)
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	return out
}

// CallCompleted is the completion of RunID's call HexID(n), with output.
func CallCompleted(t testing.TB, n int, output string) events.Outgoing {
	t.Helper()
	env := envelope.ToolEnvelope{CallID: HexID(n), Name: "web_search", Version: "1.2.0",
		Output: []byte(output), TStart: T0, TEnd: T0.Add(time.Second)}
	out, err := events.NewCallCompleted("/toolwire/test", RunID, env, Tenant, RunTrace)
	if err != nil {
		t.Fatalf("eventstest: %v", err)
	}
	return out
}

// StreamMsgs is how many messages stream holds.
func StreamMsgs(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(Context(t), stream)
	if err != nil {
		t.Fatalf("eventstest: stream %s: %v", stream, err)
	}
	info, err := s.Info(Context(t))
	if err != nil {
		t.Fatalf("eventstest: stream %s: %v", stream, err)
	}
	return info.State.Msgs
}

// LastMsg returns the last message stream stores on subject, as a nats.Msg.
func LastMsg(t testing.TB, js jetstream.JetStream, stream, subject string) *nats.Msg {
	t.Helper()
	s, err := js.Stream(Context(t), stream)
	if err != nil {
		t.Fatalf("eventstest: stream %s: %v", stream, err)
	}
	raw, err := s.GetLastMsgForSubject(Context(t), subject)
	if err != nil {
		t.Fatalf("eventstest: last message on %s: %v", subject, err)
	}
	return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
}

// RequireSameEvent fails t unless got has want's attributes, extensions and
// data, byte for byte.
func RequireSameEvent(t testing.TB, want, got *event.Event) {
	t.Helper()
	require.NotNil(t, got)
	require.Equal(t, want.SpecVersion(), got.SpecVersion(), "specversion")
	require.Equal(t, want.ID(), got.ID(), "id")
	require.Equal(t, want.Source(), got.Source(), "source")
	require.Equal(t, want.Type(), got.Type(), "type")
	require.Equal(t, want.Subject(), got.Subject(), "subject")
	require.Equal(t, want.DataSchema(), got.DataSchema(), "dataschema")
	require.Equal(t, want.DataContentType(), got.DataContentType(), "datacontenttype")
	require.True(t, want.Time().Equal(got.Time()), "time: want %s, got %s", want.Time(), got.Time())
	require.Equal(t, extensionStrings(t, want), extensionStrings(t, got), "extensions")
	require.True(t, bytes.Equal(want.Data(), got.Data()), "data: want %q, got %q", want.Data(), got.Data())
}

func extensionStrings(t testing.TB, e *event.Event) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range e.Extensions() {
		s, err := types.Format(v)
		require.NoError(t, err, "extension %s", k)
		out[k] = s
	}
	return out
}

// StopAtCleanup stops r (a runner, a watch) when t ends, within 10 s.
func StopAtCleanup(t testing.TB, r interface{ Stop(context.Context) error }) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
}

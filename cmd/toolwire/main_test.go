package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package's tests when one leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCommandsSayWhenNothingAnswers: every command that talks to toolwire
// gives up within its --timeout when no NATS answers, and says where it
// looked and how to start toolwire.
func TestCommandsSayWhenNothingAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nowhere := "nats://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	for _, args := range [][]string{
		{"run", "--demo"},
		{"call", "echo@1.0.0", "--input", "{}"},
		{"tools", "list"},
		{"secrets", "list"},
		{"approve", "run-1", strings.Repeat("a", 64)},
		{"dlq", "list"},
		{"provision"},
	} {
		t.Run(args[0], func(t *testing.T) {
			start := time.Now()
			_, _, err := runCLI(t, "", append(args, "--nats", nowhere, "--timeout", "1s")...)
			require.ErrorContains(t, err, "no toolwire at "+nowhere)
			require.ErrorContains(t, err, "start it with `toolwire dev`")
			require.Less(t, time.Since(start), 30*time.Second, "bounded by --timeout, not the default wait")
		})
	}
}

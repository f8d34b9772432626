package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/stack"
)

// TestMain fails the package's tests when one leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runCLI runs the toolwire command with args and returns its output.
func runCLI(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd()
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

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
		{"runs", "follow", "run-1"},
	} {
		t.Run(strings.Join(args[:min(2, len(args))], " "), func(t *testing.T) {
			start := time.Now()
			_, _, err := runCLI(t, "", append(args, "--nats", nowhere, "--timeout", "1s")...)
			require.ErrorContains(t, err, "no toolwire at "+nowhere)
			require.ErrorContains(t, err, "start it with `toolwire dev`")
			require.Equal(t, exitUnreachable, exitCode(err), "the exit status of an unreachable server")
			require.Less(t, time.Since(start), 30*time.Second, "bounded by --timeout, not the default wait")
		})
	}
}

// runCompleted runs req on st and requires that it completed.
func runCompleted(t *testing.T, st *stack.Stack, req envelope.RunRequest) *events.RunStatus {
	t.Helper()
	final, err := st.Client.Run(t.Context(), req, time.Minute)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	return final
}

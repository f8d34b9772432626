package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/stack"
)

// TestProvisionCommand: provision raises retention, refuses to lower it
// without --lower (naming what and how), and lowers it with --lower.
func TestProvisionCommand(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	maxAge := func() time.Duration {
		s, err := st.JS.Stream(t.Context(), events.StreamRuns)
		require.NoError(t, err)
		info, err := s.Info(t.Context())
		require.NoError(t, err)
		return info.Config.MaxAge
	}

	out, _, err := runCLI(t, "", "provision", "--nats", st.URL, "--max-age", "720h")
	require.NoError(t, err)
	require.Contains(t, out, "TOOLWIRE_RUNS")
	require.Contains(t, out, "max age 720h0m0s")
	require.Equal(t, 720*time.Hour, maxAge())

	// A size bound where there was none drops events sooner: a lowering.
	_, _, err = runCLI(t, "", "provision", "--nats", st.URL, "--max-age", "720h", "--max-bytes", "512")
	require.ErrorContains(t, err, "TOOLWIRE_RUNS (max bytes none -> 536870912)")
	out, _, err = runCLI(t, "", "provision", "--nats", st.URL, "--max-age", "720h", "--max-bytes", "512", "--lower")
	require.NoError(t, err)
	require.Contains(t, out, "max bytes 512 MiB")

	_, _, err = runCLI(t, "", "provision", "--nats", st.URL, "--max-age", "24h")
	require.ErrorIs(t, err, provision.ErrWouldLower)
	require.ErrorContains(t, err, "TOOLWIRE_RUNS (max age 720h0m0s -> 24h0m0s")
	require.ErrorContains(t, err, "--lower")
	require.Equal(t, 720*time.Hour, maxAge(), "nothing changed")

	_, _, err = runCLI(t, "", "provision", "--nats", st.URL, "--max-age", "24h", "--lower")
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour, maxAge())

	_, _, err = runCLI(t, "", "provision", "--nats", st.URL, "--replicas", "9")
	require.ErrorContains(t, err, "replicas 9: must be between 1 and 5")
}

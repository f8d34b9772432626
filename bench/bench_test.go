package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/recorder/pgtest"
	"github.com/toolwire/toolwire/stack"
)

// TestHarnessFillsEveryFigure runs the harness with tiny settings: it checks
// that every measurement runs and reports something, not how fast it is.
func TestHarnessFillsEveryFigure(t *testing.T) {
	// The recorder on Postgres, as the figures in the README are taken.
	dsn := pgtest.Schema(t)
	before := benchSchemas(t, dsn)
	r, err := Run(t.Context(), Options{Samples: 5, Duration: 300 * time.Millisecond, InFlight: 4, DatabaseURL: dsn})
	require.NoError(t, err)
	require.Equal(t, before, benchSchemas(t, dsn), "the bench's scratch schema is dropped at the end")
	require.Equal(t, 5, r.Baseline.Chain.N)
	require.Positive(t, r.Baseline.Chain.P50)
	require.Positive(t, r.Baseline.ChainsPerSec)
	require.Positive(t, r.Baseline.KVGetCAS.P50)
	require.Equal(t, 5, r.ToolCall.Latency.N, "one call per measured run")
	require.Positive(t, r.ToolCall.RatioP50)
	require.Positive(t, r.Run.Latency.P50)
	require.Len(t, r.Run.OverheadPerK, 3)
	require.Positive(t, r.Throughput.CallsPerSec)
	require.Positive(t, r.Throughput.CPUPerCallUS)
	require.Positive(t, r.TurnThroughput.CallsPerSec)
	require.Equal(t, "postgres", r.Recorder)
	require.Positive(t, r.TurnThroughput.RecorderLag, "the recorder served the last run")
	require.GreaterOrEqual(t, r.FanOut.EightMS, 100.0, "eight 100 ms sleeps take at least 100 ms")
	require.GreaterOrEqual(t, r.FanOut.SingleMS, 100.0)
	require.Len(t, r.ScaleOut.CallsPerSec, 3)
	require.Positive(t, r.Memory.PeakRSSMB)
	b, err := r.JSON()
	require.NoError(t, err)
	require.Contains(t, string(b), `"ratio_p50_to_chain_p50"`)
}

// benchSchemas lists the bench's scratch schemas in the database of dsn.
func benchSchemas(t *testing.T, dsn string) []string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(t.Context(), `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, 'toolwire_bench_') ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// BenchmarkRawChain is the baseline: one three-hop JetStream chain per op.
func BenchmarkRawChain(b *testing.B) {
	st := benchStack(b)
	ch, err := newChain(b.Context(), st.JS)
	require.NoError(b, err)
	defer ch.close(context.Background())
	payload := make([]byte, 512)
	b.ResetTimer()
	for b.Loop() {
		if err := ch.once(b.Context(), payload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOneCallRun is one whole run with one no-op tool call per op;
// compare its ns/op with BenchmarkRawChain's.
func BenchmarkOneCallRun(b *testing.B) {
	st := benchStack(b)
	obs, err := newObserver(st.Conn)
	require.NoError(b, err)
	defer obs.close()
	run := &runner{c: st.Client, obs: obs, name: "gobench"}
	b.ResetTimer()
	for b.Loop() {
		if _, err := run.run(b.Context(), run.request("echo", echoArgs(1))); err != nil {
			b.Fatal(err)
		}
	}
}

func benchStack(b *testing.B) *stack.Stack {
	b.Helper()
	st, err := stack.Start(b.Context(), stack.Options{DataDir: b.TempDir()})
	require.NoError(b, err)
	b.Cleanup(func() { _ = st.Stop(context.Background()) })
	return st
}

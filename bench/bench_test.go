package bench

import (
	"context"
	"math"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/stack"
)

// TestHarnessFillsEveryFigure runs the harness with tiny settings: it checks
// that every measurement runs and reports something, not how fast it is.
func TestHarnessFillsEveryFigure(t *testing.T) {
	// The recorder on Postgres, as the figures of docs/performance.md (The
	// latest figures) are taken.
	dsn := pgtest.Schema(t)
	before := benchSchemas(t, dsn)
	r, err := Run(t.Context(), Options{Samples: 5, Duration: 300 * time.Millisecond, InFlight: 4, DatabaseURL: dsn})
	require.NoError(t, err)
	// Another bench on the same database (a second checkout's tests, an
	// engineer's `toolwire bench`) may add or drop its own schema meanwhile:
	// this run's is the one that must be gone.
	require.NotEmpty(t, r.RecorderSchema)
	require.NotContains(t, before, r.RecorderSchema)
	require.NotContains(t, benchSchemas(t, dsn), r.RecorderSchema, "the bench's scratch schema is dropped at the end")
	require.Equal(t, 5, r.Baseline.Chain.N)
	require.Positive(t, r.Baseline.Chain.P50)
	require.Positive(t, r.Baseline.ChainsPerSec)
	require.Positive(t, r.Baseline.KVGetCAS.P50)
	require.Equal(t, 5, r.Baseline.ContractChain.N)
	require.Positive(t, r.Baseline.ContractRatioP50)
	require.Positive(t, r.Baseline.ContractChainsPerSec)
	require.Len(t, r.Baseline.ContractChainsPerSecRuns, 2)
	require.Positive(t, r.ToolCall.ContractRatioP50)
	require.Equal(t, 5, r.Baseline.ContractChainLoaded.N)
	require.Positive(t, r.ToolCall.LoadedContractRatioP50)
	require.Equal(t, 5, r.ToolCall.Latency.N+r.ToolCall.Misordered, "one call per measured run, timed or misordered")
	require.Positive(t, r.ToolCall.Latency.N)
	require.Positive(t, r.ToolCall.RatioP50)
	require.Positive(t, r.Run.Latency.P50)
	require.Len(t, r.Run.OverheadPerK, 3)
	// Each hop of the measured runs, timed by the server's stored times:
	// every run has all four, and none is longer than the longest run (the
	// server's clock is the process's: it runs in it).
	require.Len(t, r.Run.ByHop, 4)
	for _, h := range r.Run.ByHop {
		require.Equal(t, 5, h.Latency.N, h.Name)
		require.Positive(t, h.Latency.P50, h.Name)
		require.LessOrEqual(t, h.Latency.Max, r.Run.Latency.Max, h.Name)
	}
	require.Positive(t, r.Throughput.CallsPerSec)
	require.Positive(t, r.Throughput.CPUPerCallUS)
	require.Positive(t, r.TurnThroughput.CallsPerSec)
	require.Equal(t, "postgres", r.Recorder)
	require.Positive(t, r.TurnThroughput.RecorderLag, "the recorder served the last run")
	require.GreaterOrEqual(t, r.FanOut.EightMS, 100.0, "eight 100 ms sleeps take at least 100 ms")
	require.GreaterOrEqual(t, r.FanOut.SingleMS, 100.0)
	require.Len(t, r.ScaleOut.CallsPerSec, 3)
	// What runs store is counted, not estimated: a one-call run stores its
	// request, turn 1, the call's approved and completed events and its end
	// (a quick call publishes no started event; the final answer rides on
	// the end).
	require.Equal(t, 10, r.Stored.OneCall.Runs)
	require.Equal(t, 5.0, r.Stored.OneCall.PerRun, "%+v", r.Stored.OneCall)
	require.Equal(t, uint64(30), r.Stored.OneCall.ByStream[events.StreamRuns])
	require.Equal(t, uint64(20), r.Stored.OneCall.ByStream[events.StreamCalls])
	require.Equal(t, 3+2*16.0, r.Stored.Turn.PerRun, "%+v", r.Stored.Turn)
	require.LessOrEqual(t, r.Stored.Turn.PerCall, 2.2)
	require.Positive(t, r.Stored.Turn.KVPerCall)
	require.Len(t, r.Scenarios, 5)
	for _, sc := range r.Scenarios {
		require.Positive(t, sc.Runs, sc.Name)
		require.Positive(t, sc.P50MS, sc.Name)
		require.GreaterOrEqual(t, sc.P99MS, sc.P50MS, sc.Name)
		require.InDelta(t, sc.RunsPerSec*float64(sc.CallsPerRun), sc.CallsPerSec, 1e-6, sc.Name)
	}
	require.Equal(t, 12, r.Scenarios[2].CallsPerRun, "b: 3 turns x 4 calls")
	require.GreaterOrEqual(t, r.Scenarios[4].P50MS, 100.0, "d: eight 100 ms sleeps take at least 100 ms")
	require.NotEmpty(t, r.Targets)
	for _, tg := range r.Targets {
		require.Equal(t, tg.Op == "<=" && tg.Value <= tg.Bound || tg.Op == ">=" && tg.Value >= tg.Bound, tg.Met, tg.Name)
	}
	require.Positive(t, r.Memory.PeakRSSMB)
	b, err := r.JSON()
	require.NoError(t, err)
	require.Contains(t, string(b), `"ratio_p50_to_chain_p50"`)
}

// TestGCSettingsReadsTheRuntime: the report's GOGC and GOMEMLIMIT are the
// runtime's, off and none included.
func TestGCSettingsReadsTheRuntime(t *testing.T) {
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	for _, tc := range []struct {
		percent int
		limit   int64
		wantMiB float64
	}{
		{250, 512 << 20, 512},
		{-1, math.MaxInt64, 0},
	} {
		debug.SetGCPercent(tc.percent)
		debug.SetMemoryLimit(tc.limit)
		p, l := gcSettings()
		require.Equal(t, tc.percent, p)
		require.Equal(t, tc.wantMiB, l)
	}
}

// TestContractChainCarriesAnEvent: the contract-shaped chain's messages are
// toolwire events as the services publish them (they decode as a
// call.approved, with a Nats-Msg-Id as long as an event id), stored on a
// stream of their own, and each hop has its own connection.
func TestContractChainCarriesAnEvent(t *testing.T) {
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Stop(context.Background()) })
	cc, err := newContractChain(t.Context(), st.JS, st.URL)
	require.NoError(t, err)
	t.Cleanup(func() { cc.close(context.Background()) })
	require.Len(t, cc.conns, 3)
	_, err = cc.latency(t.Context(), 1, cc.payload)
	require.NoError(t, err)

	h, data, err := contractMessage()
	require.NoError(t, err)
	s, err := st.JS.Stream(t.Context(), contractStream)
	require.NoError(t, err)
	for seq := uint64(1); seq <= 3; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		require.NoError(t, err)
		require.Equal(t, contractSubject+".hop"+strconv.Itoa(int(seq)), m.Subject)
		ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		require.NoError(t, err)
		require.Equal(t, events.TypeCallApproved, ev.Type())
		require.Equal(t, data, m.Data)
		require.Equal(t, h.Get(events.HeaderTraceParent), m.Header.Get(events.HeaderTraceParent), "the hop's trace context")
		id := m.Header.Get(nats.MsgIdHdr)
		require.InDelta(t, len(ev.ID()), len(id), 8, "Nats-Msg-Id %q is about as long as an event id", id)
	}
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

// BenchmarkContractChain is the same chain carrying a real event's headers
// and data, each hop on its own connection (contract.go); compare its ns/op
// with BenchmarkRawChain's for what the event contract costs on the wire.
func BenchmarkContractChain(b *testing.B) {
	st := benchStack(b)
	ch, err := newContractChain(b.Context(), st.JS, st.URL)
	require.NoError(b, err)
	defer ch.close(context.Background())
	b.ResetTimer()
	for b.Loop() {
		if err := ch.once(b.Context(), ch.payload); err != nil {
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
	run := &runner{c: st.Client, js: st.JS, obs: obs, name: "gobench"}
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

package postgres_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/postgres"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// The load the benchmark models: benchRuns runs in flight at once, each
// calling benchCalls tools in parallel, their events group-committed
// benchBatch at a time (recorder.DefaultBatch).
const (
	benchRuns  = 64
	benchCalls = 16
	benchBatch = 1024
)

// BenchmarkPostgresWrite writes batches of realistic records through
// postgres.Store.Write. interleaved: the events of benchRuns runs in flight,
// taken in the order they happen and sorted within each batch as the batch
// writer sorts them (one op: one batch). one_run: the whole of one run in one
// batch (one op: one run).
func BenchmarkPostgresWrite(b *testing.B) {
	b.Run("interleaved", func(b *testing.B) {
		benchWrite(b, func(gen int) [][]store.Record {
			return interleavedBatches(b, gen)
		})
	})
	b.Run("one_run", func(b *testing.B) {
		benchWrite(b, func(gen int) [][]store.Record {
			return [][]store.Record{benchRunRecords(b, fmt.Sprintf("bench-g%06d-r00", gen), benchBase(gen))}
		})
	})
}

// benchWrite writes b.N batches, asking next for more (outside the timer)
// whenever those built are used up. Besides the time, it reports the CPU the
// Postgres backend spent per record when it can read it (a local server):
// on a shared machine that is steadier than the wall clock, and it is the
// cost the write path is meant to cut.
func benchWrite(b *testing.B, next func(gen int) [][]store.Record) {
	s, backend := newBenchStore(b)
	ctx := testCtx(b)
	var (
		pending [][]store.Record
		gen     int
		records int
	)
	b.ReportAllocs()
	cpu0, cpuOK := backendCPU(backend)
	b.ResetTimer()
	for range b.N {
		if len(pending) == 0 {
			b.StopTimer()
			pending = next(gen)
			gen++
			b.StartTimer()
		}
		batch := pending[0]
		pending = pending[1:]
		if err := s.Write(ctx, batch...); err != nil {
			b.Fatal(err)
		}
		records += len(batch)
	}
	b.StopTimer()
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(records)/float64(b.N), "records/op")
	if cpu1, ok := backendCPU(backend); ok && cpuOK {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(records), "pg-cpu-µs/record")
	}
}

// newBenchStore returns a migrated store whose pool holds one connection,
// and the pid of that connection's Postgres backend.
func newBenchStore(b *testing.B) (*postgres.Store, int) {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.Schema(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	pool, err := pgxpool.NewWithConfig(testCtx(b), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := postgres.Migrate(testCtx(b), pool, quietLog()); err != nil {
		b.Fatal(err)
	}
	var pid int
	if err := pool.QueryRow(testCtx(b), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	return postgres.New(pool), pid
}

// backendCPU is the CPU time (user and system) process pid has used, from
// /proc; false when it cannot be read (Postgres on another machine).
func backendCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command (which may hold spaces) start after its
	// closing parenthesis; utime and stime are the 14th and 15th of the line.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const clockTicks = 100 // USER_HZ: the unit of /proc's times on Linux
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}

func benchBase(gen int) time.Time {
	return time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(gen) * time.Minute)
}

// interleavedBatches returns the batches of one generation of benchRuns runs:
// their events round-robin (event k of every run, then event k+1), cut into
// batches of benchBatch sorted by run then call.
func interleavedBatches(b testing.TB, gen int) [][]store.Record {
	runs := make([][]store.Record, benchRuns)
	for i := range runs {
		runs[i] = benchRunRecords(b, fmt.Sprintf("bench-g%06d-r%02d", gen, i), benchBase(gen))
	}
	var all []store.Record
	for k := range len(runs[0]) {
		for _, r := range runs {
			all = append(all, r[k])
		}
	}
	var batches [][]store.Record
	for len(all) > 0 {
		n := min(benchBatch, len(all))
		batch := slices.Clone(all[:n])
		all = all[n:]
		slices.SortStableFunc(batch, func(x, y store.Record) int {
			return cmp.Or(cmp.Compare(x.Event.RunID, y.Event.RunID), cmp.Compare(x.Event.CallID, y.Event.CallID))
		})
		batches = append(batches, batch)
	}
	return batches
}

// benchRunRecords returns the records of one run as contract v2 records it,
// in the order its events happen: requested, model turn 1 asking for
// benchCalls tools at once, every call approved and completed (quick calls
// are never announced started), model turn 2 answering, then completed.
func benchRunRecords(b testing.TB, runID string, base time.Time) []store.Record {
	b.Helper()
	var (
		outs []events.Outgoing
		at   = base
	)
	add := func(o events.Outgoing, err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		at = at.Add(time.Millisecond)
		o.Event.SetTime(at)
		outs = append(outs, o)
	}
	tenant := storetest.TenantA
	trace := storetest.TraceFor(runID)
	req := envelope.RunRequest{RunID: runID, Tenant: tenant, Agent: envelope.Agent{
		Name: "bench-agent", Model: envelope.Model{Provider: "scripted", Name: "script-1"},
		SystemPrompt: "You call tools.", EnabledTools: []string{"web_search@1.2.0"},
		Policy: envelope.Policy{MaxIterations: 4, MaxToolCalls: 64}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Search for sixteen things."}}}
	status := func(s string) events.RunStatus {
		return events.RunStatus{RunID: runID, Status: s, Agent: req.Agent.Name, Tenant: tenant, TraceID: trace.TraceID()}
	}
	turn := func(n int, resp *envelope.ModelResponse, spend float64, results []events.TurnResult, calls []events.TurnCall) events.Turn {
		return events.Turn{RunID: runID, Iteration: n, Tenant: tenant, Agent: req.Agent.Name,
			Verdict: events.LoopVerdict{Allowed: true}, Model: events.ModelRef{Provider: "scripted", Name: "script-1"},
			Tools: req.Agent.EnabledTools, Results: results, Response: resp, Cost: 0.002, TStart: at,
			TEnd: at.Add(time.Millisecond), Policy: req.Agent.Policy, EnabledTools: req.Agent.EnabledTools,
			Spend: spend, Calls: calls}
	}
	add(events.NewRunRequested(storetest.Source, req, trace))

	calls := make([]events.TurnCall, benchCalls)
	var toolCalls []envelope.ToolCall
	for i := range calls {
		input := json.RawMessage(fmt.Sprintf(`{"query":"thing number %d","max_results":3}`, i))
		id, err := envelope.CallID("web_search", "1.2.0", input, i+1)
		if err != nil {
			b.Fatal(err)
		}
		calls[i] = events.TurnCall{CallID: id, Seq: i + 1, Name: "web_search", Version: "1.2.0", Input: input,
			ProviderCallID: fmt.Sprintf("tc_%d", i), Cost: 0.001, Queue: envelope.DefaultQueue}
		toolCalls = append(toolCalls, envelope.ToolCall{ID: calls[i].ProviderCallID, Name: "web_search", Arguments: input})
	}
	add(events.NewTurnCompleted(storetest.Source, turn(1, &envelope.ModelResponse{ToolCalls: toolCalls, StopReason: "tool_use"},
		0.002, nil, calls), trace))
	for _, c := range calls {
		add(events.NewCallApproved(storetest.Source, events.CallRequest{RunID: runID, CallID: c.CallID, Seq: c.Seq,
			Iteration: 1, Name: c.Name, Version: c.Version, Input: c.Input, ProviderCallID: c.ProviderCallID,
			Tenant: tenant, Agent: req.Agent.Name, Queue: c.Queue}, trace))
	}
	var envs []envelope.ToolEnvelope
	var results []events.TurnResult
	for _, c := range calls {
		start := at.Add(time.Millisecond)
		env := envelope.ToolEnvelope{CallID: c.CallID, Name: c.Name, Version: c.Version, Input: c.Input,
			Output: json.RawMessage(`{"results":[{"title":"a result","url":"https://example.com/a"}]}`),
			TStart: start, TEnd: start.Add(40 * time.Millisecond), Cost: c.Cost}
		envs = append(envs, env)
		results = append(results, events.TurnResult{CallID: c.CallID, ProviderCallID: c.ProviderCallID})
		add(events.NewCallCompleted(storetest.Source, runID, env, tenant, trace))
	}
	add(events.NewTurnCompleted(storetest.Source, turn(2, &envelope.ModelResponse{Content: "Found sixteen things.",
		StopReason: "end_turn"}, 0.02, results, nil), trace))
	out := envelope.NewAgentOutputs("Found sixteen things.", envs, "")
	done := status(events.StatusCompleted)
	done.Outputs, done.Iteration, done.ToolCalls, done.Spend = &out, 2, benchCalls, 0.02
	add(events.NewRunStatus(storetest.Source, done, "", trace))
	return storetest.Records(b, outs...)
}

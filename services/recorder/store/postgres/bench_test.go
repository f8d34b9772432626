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

// benchRunRecords returns the records of one run, in the order its events
// happen: requested, started, one iteration (check, verdict, model turn asking
// for benchCalls tools), every call requested, approved, started and completed
// with its usage record, then completed.
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
	add(events.NewRunRequested(storetest.Source, req, trace))
	add(events.NewRunStatus(storetest.Source, status(events.StatusStarted), "", trace))
	add(events.NewIterationRequested(storetest.Source, events.IterationCheck{RunID: runID, Iteration: 1,
		Tenant: tenant, Agent: req.Agent.Name, Policy: req.Agent.Policy}, trace))
	add(events.NewVerdict(storetest.Source, events.Verdict{RunID: runID, Iteration: 1, Allowed: true}, tenant, trace))

	calls := make([]events.CallRequest, benchCalls)
	var toolCalls []envelope.ToolCall
	for i := range calls {
		input := json.RawMessage(fmt.Sprintf(`{"query":"thing number %d","max_results":3}`, i))
		id, err := envelope.CallID("web_search", "1.2.0", input, i+1)
		if err != nil {
			b.Fatal(err)
		}
		calls[i] = events.CallRequest{RunID: runID, CallID: id, Seq: i + 1, Iteration: 1, Name: "web_search",
			Version: "1.2.0", Input: input, Tenant: tenant, Agent: req.Agent.Name,
			EnabledTools: req.Agent.EnabledTools, Policy: req.Agent.Policy}
		toolCalls = append(toolCalls, envelope.ToolCall{ID: fmt.Sprintf("tc_%d", i), Name: "web_search", Arguments: input})
	}
	add(events.NewLLMCompleted(storetest.Source, events.LLMCompleted{RunID: runID, Turn: envelope.ModelTurn{
		Iteration: 1, Model: req.Agent.Model, Messages: req.Messages, Tools: req.Agent.EnabledTools,
		Response: envelope.ModelResponse{ToolCalls: toolCalls, StopReason: "tool_use"},
		TStart:   at, TEnd: at.Add(time.Millisecond)}}, tenant, trace))
	for _, verb := range []events.Verb{events.VerbRequested, events.VerbApproved} {
		for _, c := range calls {
			add(events.NewCallRequest(storetest.Source, verb, c, trace))
		}
	}
	starts := make([]time.Time, len(calls))
	for i, c := range calls {
		starts[i] = at.Add(time.Millisecond)
		add(events.NewCallStarted(storetest.Source, events.CallStarted{RunID: runID, CallID: c.CallID, Name: c.Name,
			Version: c.Version, TStart: starts[i], Executor: "executor-0"}, tenant, trace))
	}
	var envs []envelope.ToolEnvelope
	for i, c := range calls {
		env := envelope.ToolEnvelope{CallID: c.CallID, Name: c.Name, Version: c.Version, Input: c.Input,
			Output: json.RawMessage(`{"results":[{"title":"a result","url":"https://example.com/a"}]}`),
			TStart: starts[i], TEnd: starts[i].Add(40 * time.Millisecond)}
		envs = append(envs, env)
		add(events.NewCallCompleted(storetest.Source, runID, env, tenant, trace))
		add(events.NewUsage(storetest.Source, events.Usage{RunID: runID, N: i + 1, Kind: events.UsageKindTool,
			Tenant: tenant, Agent: req.Agent.Name, Iteration: 1, Tool: c.Name + "@" + c.Version, CallID: c.CallID,
			Cost: 0.001, Billed: true}, trace))
	}
	out := envelope.NewAgentOutputs("Found sixteen things.", envs, "")
	done := status(events.StatusCompleted)
	done.Outputs, done.Iteration, done.ToolCalls, done.Spend = &out, 1, benchCalls, 0.016
	add(events.NewRunStatus(storetest.Source, done, "", trace))
	return storetest.Records(b, outs...)
}

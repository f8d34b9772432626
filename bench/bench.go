package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apiclient"
	"github.com/toolwire/toolwire/stack"
)

// Options configure a benchmark run.
type Options struct {
	Samples  int           // latency samples per measurement; default 1000
	Duration time.Duration // each throughput window; default 5s
	InFlight int           // concurrent runs (and raw chains) in throughput tests; default 64
	// DatabaseURL is the recorder's Postgres; "" records into the embedded
	// SQLite store in the bench's temporary directory.
	DatabaseURL string
	// TurnCalls is the number of parallel calls per turn in the second
	// throughput test; default 16.
	TurnCalls int
	// ProcessMemory builds the service binaries and measures each one's idle
	// RSS as its own process (needs the go tool and the source tree).
	ProcessMemory bool
	Progress      io.Writer // progress lines; default discard
}

func (o Options) withDefaults() Options {
	if o.Samples <= 0 {
		o.Samples = 1000
	}
	if o.Duration <= 0 {
		o.Duration = 5 * time.Second
	}
	if o.InFlight <= 0 {
		o.InFlight = 64
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.TurnCalls <= 0 {
		o.TurnCalls = 16
	}
	return o
}

// Report holds every figure, each beside its baseline where it has one.
type Report struct {
	Started   time.Time `json:"started"`
	GoVersion string    `json:"go_version"`
	CPUs      int       `json:"cpus"`
	Recorder  string    `json:"recorder"`
	// RecorderSchema is the scratch schema the recorder wrote into on
	// Postgres, dropped at the end.
	RecorderSchema string `json:"recorder_schema,omitempty"`
	// GCPercent and MemoryLimitMiB are the collector's settings in force:
	// GOGC (-1: off) and GOMEMLIMIT (0: none).
	GCPercent      int     `json:"gc_percent"`
	MemoryLimitMiB float64 `json:"memory_limit_mib"`

	Baseline struct {
		Chain Dist `json:"chain_3hop"`
		// ChainsPerSec is the mean of two windows, one before and one after
		// the pipeline's throughput tests (ChainsPerSecRuns).
		ChainsPerSec     float64   `json:"chains_per_s"`
		ChainsPerSecRuns []float64 `json:"chains_per_s_before_after"`
		InFlight         int       `json:"in_flight"`
		KVGetCAS         Dist      `json:"kv_get_cas"`
		// ContractChain is the same chain carrying a real event's headers
		// and data, each hop on a connection of its own (contract.go): what
		// the event contract costs on the wire before any service's work.
		ContractChain    Dist    `json:"contract_chain_3hop"`
		ContractRatioP50 float64 `json:"contract_chain_ratio_p50_to_chain_p50"`
		ContractRatioP99 float64 `json:"contract_chain_ratio_p99_to_chain_p99"`
		// ContractChainLoaded is the contract chain timed while one-call
		// runs go on beside it, one at a time, as they do around a tool call
		// in the latency test: the cost of sharing the two CPUs with the
		// rest of a run, still without any service's work on the chain.
		ContractChainLoaded      Dist      `json:"contract_chain_3hop_beside_runs"`
		ContractChainsPerSec     float64   `json:"contract_chains_per_s"`
		ContractChainsPerSecRuns []float64 `json:"contract_chains_per_s_before_after"`
		ContractRatioPerSec      float64   `json:"contract_chains_per_s_ratio_to_chain"`
	} `json:"baseline"`

	ToolCall struct {
		Latency Dist `json:"latency"`
		// Misordered counts the calls of the measured runs that were not
		// timed: the observer saw their envelope before their turn (see
		// observer). Latency.N plus it is one per measured run.
		Misordered int     `json:"misordered_calls"`
		RatioP50   float64 `json:"ratio_p50_to_chain_p50"`
		RatioP99   float64 `json:"ratio_p99_to_chain_p99"`
		// The same against the contract chain: the services' own share.
		ContractRatioP50 float64 `json:"ratio_p50_to_contract_chain_p50"`
		ContractRatioP99 float64 `json:"ratio_p99_to_contract_chain_p99"`
		// And against the contract chain beside runs.
		LoadedContractRatioP50 float64 `json:"ratio_p50_to_contract_chain_beside_runs_p50"`
		LoadedContractRatioP99 float64 `json:"ratio_p99_to_contract_chain_beside_runs_p99"`
	} `json:"tool_call"`

	Run struct {
		Latency      Dist    `json:"latency"`
		Hops         int     `json:"hops"`
		RatioP50     float64 `json:"ratio_p50_to_chain_p50"`
		PerHopP50    float64 `json:"per_hop_p50_us"`
		RawPerHopP50 float64 `json:"raw_per_hop_p50_us"`
		PerHopRatio  float64 `json:"per_hop_ratio"`
		// ByHop times each hop of the same runs from the stored times of
		// their events.
		ByHop        []Hop              `json:"by_hop"`
		NoToolsP50   float64            `json:"no_tools_run_p50_us"`
		OverheadPerK map[string]float64 `json:"per_call_overhead_us"`
	} `json:"run"`

	// Throughput is measured twice: with runs of one call (each call then
	// also carries its run's two model turns, two iteration checks and
	// lifecycle events) and with runs of one turn of TurnCalls parallel
	// calls, where the tool-call path dominates.
	Throughput     Throughput `json:"throughput"`
	TurnThroughput Throughput `json:"throughput_parallel_turns"`
	TurnCalls      int        `json:"calls_per_turn"`

	FanOut struct {
		SingleMS float64 `json:"single_100ms_call_run_ms"`
		EightMS  float64 `json:"eight_100ms_calls_run_ms"`
		Ratio    float64 `json:"ratio"`
	} `json:"fan_out"`

	ScaleOut struct {
		CallsPerSec []float64 `json:"calls_per_s_by_replicas"`
		Ratio3To1   float64   `json:"ratio_3_to_1"`
	} `json:"scale_out"`

	// Stored is what runs store, counted at the server: batches of one-call
	// runs and of runs of one turn of TurnCalls calls.
	Stored struct {
		OneCall Stored `json:"one_call_runs"`
		Turn    Stored `json:"parallel_turns"`
	} `json:"stored"`

	// Scenarios are the agent-shaped workloads (scenarios.go).
	Scenarios []Scenario `json:"scenarios"`

	// Streaming is what agent.stream costs a one-call run (streaming.go).
	Streaming Streaming `json:"streaming"`

	// Targets are the figures the design sets a bound for, each checked.
	Targets []Target `json:"targets"`

	Memory struct {
		PeakRSSMB float64            `json:"peak_rss_mb"`
		IdleMB    map[string]float64 `json:"idle_service_rss_mb,omitempty"`
		IdleNote  string             `json:"idle_note,omitempty"`
	} `json:"memory"`
}

// Run measures everything in order and returns the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.withDefaults()
	r := &Report{Started: time.Now().UTC(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), Recorder: "postgres", TurnCalls: o.TurnCalls}
	say := func(format string, args ...any) { fmt.Fprintf(o.Progress, "bench: "+format+"\n", args...) }
	r.GCPercent, r.MemoryLimitMiB = gcSettings()

	dir, err := os.MkdirTemp("", "toolwire-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if o.DatabaseURL == "" {
		r.Recorder = "sqlite (embedded)"
		o.DatabaseURL = "sqlite:" + dir + "/recorder.db"
	} else {
		schema, url, drop, err := scratchSchema(ctx, o.DatabaseURL)
		if err != nil {
			return nil, err
		}
		r.RecorderSchema = schema
		defer func() {
			if err := drop(context.WithoutCancel(ctx)); err != nil {
				say("%v", err)
			}
		}()
		o.DatabaseURL = url
	}

	say("starting the pipeline (embedded NATS, file storage, recorder: %s)", r.Recorder)
	st, err := stack.Start(ctx, stack.Options{DataDir: dir + "/main", Recorder: recorder.ForStack(o.DatabaseURL), ExecutorOptions: benchTools()})
	if err != nil {
		return nil, err
	}
	defer st.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // best effort at the end of a benchmark

	// The raw baseline, on the same server with the same client. Its
	// samples are taken between the pipeline's, so that both see the same
	// machine: on a shared VM speed drifts by tens of percent within a run.
	ch, err := newChain(ctx, st.JS)
	if err != nil {
		return nil, err
	}
	defer ch.close(context.WithoutCancel(ctx))
	cch, err := newContractChain(ctx, st.JS, st.URL)
	if err != nil {
		return nil, err
	}
	defer cch.close(context.WithoutCancel(ctx))
	payload := make([]byte, 512)
	kv, err := kvRoundTrip(ctx, st.JS, o.Samples)
	if err != nil {
		return nil, err
	}
	r.Baseline.KVGetCAS = distOf(kv)

	obs, err := newObserver(st.Conn)
	if err != nil {
		return nil, err
	}
	defer obs.close()
	run := &runner{c: st.Client, js: st.JS, obs: obs, name: "bench"}

	say("latency: %d one-call runs, %d raw and %d contract-shaped three-hop chains, one at a time, in alternating blocks", o.Samples, o.Samples, o.Samples)
	if _, err := ch.latency(ctx, 20, payload); err != nil { // warm up
		return nil, err
	}
	if _, err := cch.latency(ctx, 20, cch.payload); err != nil {
		return nil, err
	}
	for range 20 {
		if _, err := run.run(ctx, run.request("echo", echoArgs(1))); err != nil {
			return nil, err
		}
	}
	if err := obs.recording(true, 0); err != nil {
		return nil, err
	}
	// The chains are measured in blocks between blocks of runs, so that both
	// span the same minutes: on a shared VM speed drifts by tens of percent
	// within a run. Each chain block starts once the pipeline has settled
	// (the recorder has written and acknowledged every event of the runs
	// before: settled) and after a few chains that are not counted: chains
	// run back to back, as the hops within a run do, and neither pays for
	// the other's leftovers.
	const block = 20
	var runLat, chainLat, contractLat []time.Duration
	var runIDs []string
	for len(runLat) < o.Samples {
		n := min(block, o.Samples-len(runLat))
		if err := settled(ctx, st.JS); err != nil {
			return nil, err
		}
		if _, err := ch.latency(ctx, 5, payload); err != nil {
			return nil, err
		}
		c, err := ch.latency(ctx, n, payload)
		if err != nil {
			return nil, err
		}
		chainLat = append(chainLat, c...)
		if _, err := cch.latency(ctx, 5, cch.payload); err != nil {
			return nil, err
		}
		if c, err = cch.latency(ctx, n, cch.payload); err != nil {
			return nil, err
		}
		contractLat = append(contractLat, c...)
		for range n {
			req := run.request("echo", echoArgs(1))
			d, err := run.run(ctx, req)
			if err != nil {
				return nil, err
			}
			runLat = append(runLat, d)
			runIDs = append(runIDs, req.RunID)
		}
	}
	if err := obs.recording(false, len(runLat)); err != nil {
		return nil, err
	}
	r.Baseline.Chain = distOf(chainLat)
	callLat, misordered := obs.calls()
	r.ToolCall.Latency, r.ToolCall.Misordered = distOf(callLat), misordered
	r.ToolCall.RatioP50 = ratio(r.ToolCall.Latency.P50, r.Baseline.Chain.P50)
	r.ToolCall.RatioP99 = ratio(r.ToolCall.Latency.P99, r.Baseline.Chain.P99)
	r.Baseline.ContractChain = distOf(contractLat)
	r.Baseline.ContractRatioP50 = ratio(r.Baseline.ContractChain.P50, r.Baseline.Chain.P50)
	r.Baseline.ContractRatioP99 = ratio(r.Baseline.ContractChain.P99, r.Baseline.Chain.P99)
	r.ToolCall.ContractRatioP50 = ratio(r.ToolCall.Latency.P50, r.Baseline.ContractChain.P50)
	r.ToolCall.ContractRatioP99 = ratio(r.ToolCall.Latency.P99, r.Baseline.ContractChain.P99)
	r.Run.Latency = distOf(runLat)
	// The run request (to the orchestrator), turn 1 (to the guard), the
	// approved call (to the executor) and its envelope (to the orchestrator):
	// four pulled hops; the end is the run's answer.
	r.Run.Hops = 4
	r.Run.RatioP50 = ratio(r.Run.Latency.P50, r.Baseline.Chain.P50)
	r.Run.PerHopP50 = r.Run.Latency.P50 / float64(r.Run.Hops)
	r.Run.RawPerHopP50 = r.Baseline.Chain.P50 / 3
	r.Run.PerHopRatio = ratio(r.Run.PerHopP50, r.Run.RawPerHopP50)
	if r.Run.ByHop, err = runHops(ctx, st.JS, runIDs); err != nil {
		return nil, err
	}

	say("latency: %d contract-shaped chains while one-call runs go on beside them", o.Samples)
	loaded, err := besideRuns(ctx, run, func() ([]time.Duration, error) {
		var out []time.Duration
		for len(out) < o.Samples {
			n := min(block, o.Samples-len(out))
			if _, err := cch.latency(ctx, 5, cch.payload); err != nil {
				return nil, err
			}
			c, err := cch.latency(ctx, n, cch.payload)
			if err != nil {
				return nil, err
			}
			out = append(out, c...)
		}
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	r.Baseline.ContractChainLoaded = distOf(loaded)
	r.ToolCall.LoadedContractRatioP50 = ratio(r.ToolCall.Latency.P50, r.Baseline.ContractChainLoaded.P50)
	r.ToolCall.LoadedContractRatioP99 = ratio(r.ToolCall.Latency.P99, r.Baseline.ContractChainLoaded.P99)

	say("latency: runs without tools and with turns of 1, 4 and 16 parallel calls")
	measure := func(k int) (float64, error) {
		var ds []time.Duration
		for range min(max(o.Samples/4, 20), 100) { // p50s: 100 runs are plenty
			d, err := run.run(ctx, run.request("echo", echoArgs(k)))
			if err != nil {
				return 0, err
			}
			ds = append(ds, d)
		}
		return distOf(ds).P50, nil
	}
	if r.Run.NoToolsP50, err = measure(0); err != nil {
		return nil, err
	}
	r.Run.OverheadPerK = map[string]float64{}
	for _, k := range []int{1, 4, 16} {
		p50, err := measure(k)
		if err != nil {
			return nil, err
		}
		r.Run.OverheadPerK[fmt.Sprint(k)] = (p50 - r.Run.NoToolsP50) / float64(k)
	}

	r.Baseline.InFlight = o.InFlight
	say("baseline: raw chains with %d in flight for %s", o.InFlight, o.Duration)
	before, err := ch.throughput(ctx, o.InFlight, o.Duration, payload)
	if err != nil {
		return nil, err
	}
	// The contract-shaped chain's windows sit inside the raw chain's, in
	// mirror order, so that the two means span the same minutes.
	say("baseline: contract-shaped chains with %d in flight for %s", o.InFlight, o.Duration)
	contractBefore, err := cch.throughput(ctx, o.InFlight, o.Duration, cch.payload)
	if err != nil {
		return nil, err
	}
	say("throughput: one-call runs with %d in flight for %s", o.InFlight, o.Duration)
	if r.Throughput, err = measureThroughput(ctx, st, run, o, 1); err != nil {
		return nil, err
	}
	say("throughput: runs of one turn of %d parallel calls, %d in flight for %s", o.TurnCalls, o.InFlight, o.Duration)
	if r.TurnThroughput, err = measureThroughput(ctx, st, run, o, o.TurnCalls); err != nil {
		return nil, err
	}
	say("baseline: contract-shaped chains with %d in flight for %s, again", o.InFlight, o.Duration)
	contractAfter, err := cch.throughput(ctx, o.InFlight, o.Duration, cch.payload)
	if err != nil {
		return nil, err
	}
	say("baseline: raw chains with %d in flight for %s, again", o.InFlight, o.Duration)
	after, err := ch.throughput(ctx, o.InFlight, o.Duration, payload)
	if err != nil {
		return nil, err
	}
	r.Baseline.ChainsPerSecRuns = []float64{before, after}
	r.Baseline.ChainsPerSec = (before + after) / 2
	r.Baseline.ContractChainsPerSecRuns = []float64{contractBefore, contractAfter}
	r.Baseline.ContractChainsPerSec = (contractBefore + contractAfter) / 2
	r.Baseline.ContractRatioPerSec = ratio(r.Baseline.ContractChainsPerSec, r.Baseline.ChainsPerSec)
	r.Throughput.RatioToChain = ratio(r.Throughput.CallsPerSec, r.Baseline.ChainsPerSec)
	r.TurnThroughput.RatioToChain = ratio(r.TurnThroughput.CallsPerSec, r.Baseline.ChainsPerSec)

	storedRuns := min(max(o.Samples/10, 10), 100)
	say("stored: %d one-call runs and %d runs of one turn of %d calls, counted at the server", storedRuns, storedRuns/2, o.TurnCalls)
	if r.Stored.OneCall, err = countStored(ctx, st.JS, run, storedRuns, 1, 8); err != nil {
		return nil, err
	}
	if r.Stored.Turn, err = countStored(ctx, st.JS, run, storedRuns/2, o.TurnCalls, 8); err != nil {
		return nil, err
	}

	for _, sc := range scenarios(o) {
		say("scenario %s: %s", sc.name, sc.shape)
		got, err := measureScenario(ctx, run, sc)
		if err != nil {
			return nil, err
		}
		r.Scenarios = append(r.Scenarios, got)
	}

	streamed := min(max(o.Samples/5, 10), 200)
	say("streaming: %d one-call runs with agent.stream beside %d without, in alternating blocks; time to the first delta", streamed, streamed)
	if r.Streaming, err = measureStreaming(ctx, run, st.Conn, streamed); err != nil {
		return nil, err
	}

	say("fan-out: one 100 ms sleep versus eight in one turn")
	var one, eight []time.Duration
	for range 10 {
		d, err := run.run(ctx, run.request("sleep", sleepArgs(1, 100)))
		if err != nil {
			return nil, err
		}
		one = append(one, d)
		d, err = run.run(ctx, run.request("sleep", sleepArgs(8, 100)))
		if err != nil {
			return nil, err
		}
		eight = append(eight, d)
	}
	r.FanOut.SingleMS = distOf(one).P50 / 1000
	r.FanOut.EightMS = distOf(eight).P50 / 1000
	r.FanOut.Ratio = ratio(r.FanOut.EightMS, r.FanOut.SingleMS)

	obs.close()
	if err := st.Stop(ctx); err != nil {
		return nil, err
	}
	for n := 1; n <= 3; n++ {
		say("scale-out: %d executor replica(s), 4 calls at once each, 20 ms I/O-bound tool, %s", n, o.Duration)
		cps, err := scaleOut(ctx, fmt.Sprintf("%s/scale%d", dir, n), n, o)
		if err != nil {
			return nil, err
		}
		r.ScaleOut.CallsPerSec = append(r.ScaleOut.CallsPerSec, cps)
	}
	r.ScaleOut.Ratio3To1 = ratio(r.ScaleOut.CallsPerSec[2], r.ScaleOut.CallsPerSec[0])

	if o.ProcessMemory {
		say("memory: each service binary idle, as its own process")
		r.Memory.IdleMB, err = idleServiceRSS(ctx, dir)
		if err != nil {
			r.Memory.IdleNote = err.Error()
		}
	}
	r.Memory.PeakRSSMB = peakRSSMB()
	r.Targets = r.targets()
	say("done")
	return r, nil
}

// Throughput is one throughput test's figures.
type Throughput struct {
	RunsPerSec   float64 `json:"runs_per_s"`
	CallsPerSec  float64 `json:"tool_calls_per_s"`
	RatioToChain float64 `json:"ratio_calls_to_chains"`
	// RecorderLag is how long after the last run ended the recorder served
	// it whole (settled: the run ended and every call's envelope recorded).
	RecorderLag  float64 `json:"recorder_lag_ms"`
	CPUPerCallUS float64 `json:"cpu_per_tool_call_us"`
}

// measureThroughput keeps o.InFlight runs of k echo calls going for
// o.Duration, then waits for the recorder to serve the last one.
func measureThroughput(ctx context.Context, st *stack.Stack, run *runner, o Options, k int) (Throughput, error) {
	var t Throughput
	runs, calls, lastRun, cpu, err := throughput(ctx, run, o.InFlight, o.Duration, "echo", k)
	if err != nil {
		return t, err
	}
	t.RunsPerSec, t.CallsPerSec = runs, calls
	if calls > 0 {
		t.CPUPerCallUS = cpu / (calls * o.Duration.Seconds()) * 1e6
	}
	if st.HTTPURL != "" {
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := apiclient.WaitSettled(wctx, st.HTTPURL, lastRun, 5*time.Millisecond)
		cancel()
		if err != nil {
			return t, fmt.Errorf("the recorder: %w", err)
		}
		t.RecorderLag = float64(time.Since(start)) / float64(time.Millisecond)
	}
	return t, nil
}

// benchTools gives the executors the sleep tool: a call of known length
// measures the pipeline's overhead and its parallelism. A production
// executor does not run it (package testtools); the bench is a harness.
func benchTools() []executor.Option {
	return []executor.Option{executor.WithTools(testtools.Sleep())}
}

func scaleOut(ctx context.Context, dir string, replicas int, o Options) (float64, error) {
	st, err := stack.Start(ctx, stack.Options{DataDir: dir, ExecutorReplicas: replicas, ExecutorConcurrency: 4, ExecutorOptions: benchTools()})
	if err != nil {
		return 0, err
	}
	defer st.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // best effort
	obs, err := newObserver(st.Conn)
	if err != nil {
		return 0, err
	}
	defer obs.close()
	run := &runner{c: st.Client, js: st.JS, obs: obs, name: fmt.Sprintf("scale%d", replicas)}
	_, calls, _, _, err := throughput(ctx, run, o.InFlight, o.Duration, "sleep", 4)
	return calls, err
}

// throughput keeps inFlight runs of k calls going for d; it returns runs/s,
// calls/s, the last run's id and the process CPU seconds spent.
func throughput(ctx context.Context, run *runner, inFlight int, d time.Duration, tool string, k int) (float64, float64, string, float64, error) {
	args := echoArgs(k)
	if tool == "sleep" {
		args = sleepArgs(k, 20)
	}
	var last atomic.Value
	cpu0 := cpuSeconds()
	n, elapsed, err := keepBusy(inFlight, d, func() error {
		req := run.request(tool, args)
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if _, err := run.run(cctx, req); err != nil {
			return err
		}
		last.Store(req.RunID)
		return nil
	})
	cpu := cpuSeconds() - cpu0
	if err != nil {
		return 0, 0, "", 0, err
	}
	lastRun, _ := last.Load().(string)
	runs := float64(n) / elapsed.Seconds()
	// CPU per call is reported over the window's length.
	return runs, runs * float64(k), lastRun, cpu * d.Seconds() / elapsed.Seconds(), nil
}

// keepBusy runs once on inFlight goroutines, each calling it again and again
// until d has passed or it fails; it returns how many calls succeeded, the
// time they took and every failure.
func keepBusy(inFlight int, d time.Duration, once func() error) (int64, time.Duration, error) {
	deadline := time.Now().Add(d)
	var (
		done atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := time.Now()
	for range inFlight {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := once(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load(), time.Since(start), errors.Join(errs...)
}

// besideRuns returns measure's result, taken while one-call runs go on, one
// at a time, in the background.
func besideRuns(ctx context.Context, run *runner, measure func() ([]time.Duration, error)) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if _, err := run.run(ctx, run.request("echo", echoArgs(1))); err != nil && ctx.Err() == nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	out, err := measure()
	cancel()
	return out, errors.Join(err, <-done)
}

// gcSettings reads GOGC and GOMEMLIMIT as the runtime holds them, without
// touching them.
func gcSettings() (percent int, limitMiB float64) {
	ms := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(ms)
	percent = -1 // off: the runtime reports -1 as a uint64
	if ms[0].Value.Kind() == metrics.KindUint64 {
		if v := ms[0].Value.Uint64(); v <= math.MaxInt32 {
			percent = int(v)
		}
	}
	if ms[1].Value.Kind() == metrics.KindUint64 {
		if l := ms[1].Value.Uint64(); l != math.MaxInt64 {
			limitMiB = float64(l) / (1 << 20)
		}
	}
	return percent, limitMiB
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func peakRSSMB() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Maxrss) / 1024 // KiB on Linux
}

// JSON renders the report for machines.
func (r *Report) JSON() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }

// settled waits until the recorder holds none of the events stored so far:
// its consumers have nothing waiting and nothing unacknowledged (it
// acknowledges an event once its transaction committed), and then 10 ms for
// the acks' own tail. It gives up after 5 s (a recorder that far behind
// shows in the lag figures), and the chain block then runs beside the
// recorder's writes.
func settled(ctx context.Context, js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		busy := false
		for _, c := range []struct{ stream, durable string }{
			{events.StreamRuns, recorder.DurableRuns}, {events.StreamCalls, recorder.DurableCalls},
		} {
			cons, err := js.Consumer(ctx, c.stream, c.durable)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("bench: the recorder's consumer %s: %w", c.durable, err)
			}
			info := cons.CachedInfo()
			if info.NumPending > 0 || info.NumAckPending > 0 {
				busy = true
			}
		}
		if !busy {
			time.Sleep(10 * time.Millisecond)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Millisecond):
		}
	}
}

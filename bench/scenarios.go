package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Scenario is one agent-shaped workload's figures, to set beside other agent
// runtimes': each run goes from its request to its outputs through a
// zero-latency scripted model.
type Scenario struct {
	Name        string  `json:"name"`
	Shape       string  `json:"shape"`
	Turns       int     `json:"turns"`
	CallsPerRun int     `json:"calls_per_run"`
	InFlight    int     `json:"in_flight"`
	Runs        int     `json:"runs"`
	P50MS       float64 `json:"p50_ms"`
	P99MS       float64 `json:"p99_ms"`
	RunsPerSec  float64 `json:"runs_per_s"`
	CallsPerSec float64 `json:"tool_calls_per_s"`
}

// scenario describes one workload: turns of calls of tool (args gives each
// call's arguments), runs kept inFlight at a time, for n runs or, when
// window is set, for that long.
type scenario struct {
	name, shape string
	tool        string
	turns       int
	calls       int
	args        func(k int) []json.RawMessage
	inFlight    int
	n           int
	window      time.Duration
}

// scenarios are the agent-shaped workloads: (a) one turn of one call, (a4)
// one turn of four parallel calls, (b) three turns of four calls, (c) 64 runs
// of shape a4 in flight for a fixed time, (d) eight 100 ms sleeps in one turn.
func scenarios(o Options) []scenario {
	n := min(max(o.Samples/5, 10), 200)
	return []scenario{
		{name: "a", shape: "1 turn x 1 call, one run at a time", tool: "echo", turns: 1, calls: 1, args: echoArgs, inFlight: 1, n: n},
		{name: "a4", shape: "1 turn x 4 parallel calls, one run at a time", tool: "echo", turns: 1, calls: 4, args: echoArgs, inFlight: 1, n: n},
		{name: "b", shape: "3 turns x 4 calls, one run at a time", tool: "echo", turns: 3, calls: 4, args: echoArgs, inFlight: 1, n: n},
		{name: "c", shape: fmt.Sprintf("shape a4, %d runs in flight for %s", o.InFlight, o.Duration), tool: "echo", turns: 1, calls: 4,
			args: echoArgs, inFlight: o.InFlight, window: o.Duration},
		{name: "d", shape: "1 turn x 8 sleeps of 100 ms, one run at a time", tool: "sleep", turns: 1, calls: 8,
			args: func(k int) []json.RawMessage { return sleepArgs(k, 100) }, inFlight: 1, n: min(n, 20)},
	}
}

// request builds one run of the scenario.
func (s scenario) request(r *runner) envelope.RunRequest {
	turns := make([][]json.RawMessage, s.turns)
	for i := range turns {
		turns[i] = s.args(s.calls)
	}
	return r.requestTurns(s.tool, turns...)
}

// measureScenario runs s and returns its figures.
func measureScenario(ctx context.Context, run *runner, s scenario) (Scenario, error) {
	out := Scenario{Name: s.name, Shape: s.shape, Turns: s.turns, CallsPerRun: s.turns * s.calls, InFlight: s.inFlight}
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan struct{})
	go func() { // hands out the runs: n of them, or as many as fit the window
		defer close(next)
		deadline := time.Now().Add(s.window)
		for i := 0; s.window > 0 && time.Now().Before(deadline) || s.window == 0 && i < s.n; i++ {
			select {
			case next <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	start := time.Now()
	for range s.inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				mu.Lock()
				failed := len(errs) > 0
				mu.Unlock()
				if failed {
					continue // drain the hand-out: the scenario has failed
				}
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				d, err := run.run(cctx, s.request(run))
				cancel()
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("scenario %s: %w", s.name, err)
	}
	if ctx.Err() != nil {
		return out, ctx.Err()
	}
	d := distOf(lat)
	out.Runs = d.N
	out.P50MS, out.P99MS = d.P50/1000, d.P99/1000
	out.RunsPerSec = float64(d.N) / elapsed
	out.CallsPerSec = out.RunsPerSec * float64(out.CallsPerRun)
	return out, nil
}

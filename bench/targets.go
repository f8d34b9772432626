package bench

import "fmt"

// Target is a figure with the bound the design sets for it.
type Target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	// Op is "<=" or ">=": how Value must stand to Bound.
	Op    string  `json:"op"`
	Bound float64 `json:"bound"`
	Met   bool    `json:"met"`
}

func atMost(name string, v, bound float64) Target {
	return Target{Name: name, Value: v, Op: "<=", Bound: bound, Met: v <= bound}
}

func atLeast(name string, v, bound float64) Target {
	return Target{Name: name, Value: v, Op: ">=", Bound: bound, Met: v >= bound}
}

// targets checks the report's figures against the hot path's budgets
// (contract v2: docs/architecture.md, A run's flow) and the performance
// targets (docs/performance.md, The method).
func (r *Report) targets() []Target {
	ts := []Target{
		atMost("stored events per tool call, turns of "+fmt.Sprint(r.TurnCalls)+" calls", r.Stored.Turn.PerCall, 2.2),
		atMost("stored events per one-call run", r.Stored.OneCall.PerRun, 8),
		atLeast(fmt.Sprintf("turns of %d calls: tool calls/s to raw chains/s", r.TurnCalls), r.TurnThroughput.RatioToChain, 0.50),
		atLeast("one-call runs: runs/s to raw chains/s", r.Throughput.RatioToChain, 0.20),
		atMost("one-call run p50 to the raw chain's p50", r.Run.RatioP50, 6),
		atMost("tool call p50 to the raw chain's p50", r.ToolCall.RatioP50, 2),
		atMost("tool call p99 to the raw chain's p99", r.ToolCall.RatioP99, 3),
		atMost("recorder lag after one-call runs (ms)", r.Throughput.RecorderLag, 1000),
		atMost(fmt.Sprintf("recorder lag after turns of %d calls (ms)", r.TurnCalls), r.TurnThroughput.RecorderLag, 1000),
		atMost("fan-out: 8 x 100 ms to 1 x 100 ms", r.FanOut.Ratio, 1.2),
		atMost("one-call run p50, agent.stream on to off", r.Streaming.Ratio, streamTarget),
	}
	if len(r.ScaleOut.CallsPerSec) == 3 {
		ts = append(ts, atLeast("scale-out: 3 executors to 1", r.ScaleOut.Ratio3To1, 2.5))
	}
	return ts
}

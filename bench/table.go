package bench

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
)

// Table writes the report as a readable table.
func (r *Report) Table(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format+"\n", args...) }
	d := func(x Dist) string {
		return fmt.Sprintf("p50 %.0f µs\tp90 %.0f µs\tp99 %.0f µs", x.P50, x.P90, x.P99)
	}
	gc := fmt.Sprintf("GOGC=%d", r.GCPercent)
	if r.GCPercent < 0 {
		gc = "GOGC=off"
	}
	if r.MemoryLimitMiB > 0 {
		gc += fmt.Sprintf(" GOMEMLIMIT=%.0fMiB", r.MemoryLimitMiB)
	}
	p("toolwire bench\t%s, %d CPUs, %s, recorder: %s", r.GoVersion, r.CPUs, gc, r.Recorder)
	p("")
	p("BASELINE (raw JetStream, same server and client)\t\t\t")
	p("  three-hop chain, one at a time (in blocks between the runs)\t%s", d(r.Baseline.Chain))
	if len(r.Baseline.ChainsPerSecRuns) == 2 {
		p("  chains/s, %d in flight (before / after the pipeline's)\t%.0f\t(%.0f / %.0f)\t", r.Baseline.InFlight, r.Baseline.ChainsPerSec,
			r.Baseline.ChainsPerSecRuns[0], r.Baseline.ChainsPerSecRuns[1])
	} else {
		p("  chains/s, %d in flight\t%.0f\t\t", r.Baseline.InFlight, r.Baseline.ChainsPerSec)
	}
	p("  KV get + CAS update\t%s", d(r.Baseline.KVGetCAS))
	p("  the chain shaped as toolwire's events (headers, data, a connection per hop)\t%s", d(r.Baseline.ContractChain))
	p("    ratio to the raw chain\tp50 %.2fx\tp99 %.2fx\t", r.Baseline.ContractRatioP50, r.Baseline.ContractRatioP99)
	p("    the same while one-call runs go on beside it\t%s", d(r.Baseline.ContractChainLoaded))
	if cr := r.Baseline.ContractChainsPerSecRuns; len(cr) == 2 {
		p("    chains/s, %d in flight (before / after the pipeline's)\t%.0f, %.2fx of raw\t(%.0f / %.0f)\t", r.Baseline.InFlight,
			r.Baseline.ContractChainsPerSec, r.Baseline.ContractRatioPerSec, cr[0], cr[1])
	}
	p("")
	p("PIPELINE\t\t\t")
	p("  tool call: turn -> envelope\t%s", d(r.ToolCall.Latency))
	p("    ratio to the chain\tp50 %.2fx (target <= 2x)\tp99 %.2fx (target <= 3x)\t", r.ToolCall.RatioP50, r.ToolCall.RatioP99)
	p("    ratio to the contract-shaped chain\tp50 %.2fx\tp99 %.2fx\t", r.ToolCall.ContractRatioP50, r.ToolCall.ContractRatioP99)
	p("    ratio to it beside one-call runs\tp50 %.2fx\tp99 %.2fx\t", r.ToolCall.LoadedContractRatioP50, r.ToolCall.LoadedContractRatioP99)
	if r.ToolCall.Misordered > 0 {
		p("    not timed: envelope seen before its turn\t%d of %d calls\t\t", r.ToolCall.Misordered, r.ToolCall.Misordered+r.ToolCall.Latency.N)
	}
	p("  one-call run: request -> outputs\t%s", d(r.Run.Latency))
	p("    ratio to the chain\tp50 %.2fx (target <= 6x)\t\t", r.Run.RatioP50)
	p("    %d hops: per hop p50\t%.0f µs (raw %.0f µs, %.2fx)\t\t", r.Run.Hops, r.Run.PerHopP50, r.Run.RawPerHopP50, r.Run.PerHopRatio)
	for _, h := range r.Run.ByHop {
		p("      %s (stored times)\t%s", h.Name, d(h.Latency))
	}
	p("  run without tools p50\t%.0f µs\t\t", r.Run.NoToolsP50)
	keys := make([]string, 0, len(r.Run.OverheadPerK))
	for k := range r.Run.OverheadPerK {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return len(keys[i]) < len(keys[j]) || len(keys[i]) == len(keys[j]) && keys[i] < keys[j]
	})
	for _, k := range keys {
		p("  per-call overhead, turn of %s\t%.0f µs\t\t", k, r.Run.OverheadPerK[k])
	}
	tp := func(name string, t Throughput, target string) {
		p("  throughput, %s\t%.0f runs/s\t%.0f tool calls/s\t%.2fx chains/s%s", name, t.RunsPerSec, t.CallsPerSec, t.RatioToChain, target)
		p("    recorder lag after the load\t%.0f ms (target < 1000)\t\t", t.RecorderLag)
		p("    CPU per tool call (whole process)\t%.0f µs\t\t", t.CPUPerCallUS)
	}
	tp("one-call runs", r.Throughput, " (target >= 0.20)")
	tp(fmt.Sprintf("turns of %d calls", r.TurnCalls), r.TurnThroughput, " (target >= 0.50)")
	st := func(name string, s Stored) {
		p("  stored, %s (%d runs)\t%.2f events/run\t%.2f events/tool call\t%.2f KV writes/tool call", name, s.Runs, s.PerRun, s.PerCall, s.KVPerCall)
	}
	st("one-call runs", r.Stored.OneCall)
	st(fmt.Sprintf("turns of %d calls", r.TurnCalls), r.Stored.Turn)
	p("  fan-out 8 x 100 ms\t%.1f ms vs %.1f ms single\t%.2fx (target <= 1.2x)\t", r.FanOut.EightMS, r.FanOut.SingleMS, r.FanOut.Ratio)
	if len(r.ScaleOut.CallsPerSec) == 3 {
		p("  scale-out, 1/2/3 executors\t%.0f / %.0f / %.0f calls/s\t%.2fx (target >= 2.5x)\t", r.ScaleOut.CallsPerSec[0], r.ScaleOut.CallsPerSec[1], r.ScaleOut.CallsPerSec[2], r.ScaleOut.Ratio3To1)
	}
	if r.Streaming.On.N > 0 {
		p("")
		p("STREAMING (agent.stream: the model's deltas on core NATS)\t\t\t")
		p("  one-call run, stream off\t%s\t", d(r.Streaming.Off))
		p("  one-call run, stream on\t%s\t%.2fx off", d(r.Streaming.On), r.Streaming.Ratio)
		p("  submit to the first delta\t%s\t%.1f deltas per run", d(r.Streaming.FirstDelta), r.Streaming.Deltas)
	}
	if len(r.Scenarios) > 0 {
		p("")
		p("AGENT-SHAPED SCENARIOS (scripted zero-latency model)\t\t\t")
		for _, sc := range r.Scenarios {
			p("  (%s) %s\tp50 %.2f ms  p99 %.2f ms\t%.0f runs/s\t%.0f tool calls/s", sc.Name, sc.Shape, sc.P50MS, sc.P99MS, sc.RunsPerSec, sc.CallsPerSec)
		}
	}
	p("")
	p("  peak RSS of this process\t%.0f MB\t\t", r.Memory.PeakRSSMB)
	for _, s := range serviceNames {
		if mb, ok := r.Memory.IdleMB[s]; ok {
			p("  idle %s process RSS\t%.1f MB\t\t", s, mb)
		}
	}
	if r.Memory.IdleNote != "" {
		p("  idle per-service RSS\t%s\t\t", r.Memory.IdleNote)
	}
	if len(r.Targets) > 0 {
		p("")
		p("TARGETS\t\t\t")
		for _, t := range r.Targets {
			mark := "met"
			if !t.Met {
				mark = "MISSED"
			}
			p("  %s\t%.2f %s %.2f\t%s\t", t.Name, t.Value, t.Op, t.Bound, mark)
		}
	}
	return tw.Flush()
}

package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/bench"
)

func newBenchCmd() *cobra.Command {
	var (
		o        bench.Options
		jsonPath string
		cpuProf  string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the pipeline against a raw JetStream baseline in one run",
		Long: `bench starts the pipeline in process (embedded nats-server with file storage, all
services, the recorder on Postgres when DATABASE_URL or --database-url is set,
in a schema of its own that is dropped at the end, else on its embedded SQLite
store) with a zero-latency scripted model, and measures, against a raw three-hop
JetStream chain taken in the same run: tool-call and run latency, per-call
overhead in parallel turns, throughput (one-call runs, and runs of one turn of
--turn-calls parallel calls) with the recorder's lag, the events and KV writes
runs store (counted at the server), agent-shaped scenarios (a: 1 turn x 1
call, a4: 1 turn x 4 calls, b: 3 turns x 4 calls, c: --in-flight runs of
shape a4 for --duration, d: 8 x 100 ms sleeps in one turn), fan-out,
scale-out over 1-3 executors, memory and CPU per tool call; then each target
of the design, met or missed.

Like dev, it runs with GOGC=400 and a 1 GiB soft memory limit unless GOGC or
GOMEMLIMIT is set; the report says which.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = cmd.ErrOrStderr()
			setOneProcessGC(os.Getenv)
			if cpuProf != "" {
				f, err := os.Create(cpuProf)
				if err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			r, err := bench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if err := r.Table(cmd.OutOrStdout()); err != nil {
				return err
			}
			if jsonPath != "" {
				b, err := r.JSON()
				if err != nil {
					return err
				}
				return os.WriteFile(jsonPath, append(b, '\n'), 0o600)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&o.Samples, "samples", 1000, "latency samples per measurement (p99 is then the tenth slowest)")
	fl.DurationVar(&o.Duration, "duration", 5*time.Second, "length of each throughput window")
	fl.IntVar(&o.InFlight, "in-flight", 64, "runs (and raw chains) in flight in throughput tests")
	fl.StringVar(&o.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "recorder Postgres (default $DATABASE_URL; none: the embedded SQLite store)")
	fl.IntVar(&o.TurnCalls, "turn-calls", 16, "parallel calls per turn in the second throughput test")
	fl.BoolVar(&o.ProcessMemory, "process-memory", true, "build the service binaries and measure each one's idle RSS")
	fl.StringVar(&jsonPath, "json", "", "also write every figure as JSON to this file")
	fl.StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of the whole bench to this file (go tool pprof)")
	return cmd
}

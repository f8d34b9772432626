package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/rerun"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// errDiverged is returned when a replay diverges: the command exits 1.
var errDiverged = errors.New("replay diverged")

func newReplayCmd() *cobra.Command {
	var (
		recorderURL string
		databaseURL string
		bundleFile  string
		live        bool
		jsonOut     bool
		stall       time.Duration
		timeout     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "replay RUN_ID",
		Short: "Re-run a recorded run against this build's orchestrator and report the first step that differs",
		Long: `replay fetches a run's replay bundle (from a recorder with --recorder, default
the dev server's http://127.0.0.1:8088, straight from its database with
--database-url, or from a file saved from the recorder's /replay with
--bundle) and re-runs the agent loop in this process, on a NATS of its own:
this build's orchestrator (and its loop rules), the model answering with the
recorded responses, every tool call the Policy Guard let through answered
with its recorded envelope. It checks each step in the recorded order - each
model turn (the loop rules' verdict, the tools offered, the previous turn's
results in the conversation), each tool call (its call_id: tool, version,
input and sequence number), the outcome (status, response, tool_order,
envelopes) - and exits 1 naming the first step that differs.

It reads bundles of version 2 and of version 1 (recorded before contract v2,
whose messages it ignores), and refuses a newer version by name. A bundle read
from the database lacks the outputs of a run whose completed event left them
in a blob (the outcome is then compared by status alone).

With --live, the calls of tools whose side_effects is none or reads are
executed again by this build's executor, and the outputs that changed are
listed; writes tools are never executed again: they return their recorded
envelopes. Live tools run without the tenant's secrets.`,
		Example: `  toolwire replay demo-20260301-120000-000000
  toolwire replay run-42 --recorder http://recorder:8080 --live
  toolwire replay run-42 --database-url sqlite:.toolwire/recorder.db --json
  toolwire replay run-42 --bundle run-42.replay.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runID := args[0]
			sources := 0
			for _, src := range []string{recorderURL, databaseURL, bundleFile} {
				if src != "" {
					sources++
				}
			}
			if sources > 1 {
				return errors.New("give one of --recorder, --database-url and --bundle")
			}
			ctx, cancel := contextWithTimeout(cmd.Context(), timeout)
			defer cancel()
			var (
				b   rerun.Bundle
				err error
			)
			switch {
			case databaseURL != "":
				b, err = bundleFromDatabase(ctx, databaseURL, runID, cmd.ErrOrStderr())
			case bundleFile != "":
				b, err = bundleFromFile(bundleFile, runID, cmd.InOrStdin())
			default:
				if recorderURL == "" {
					recorderURL = "http://127.0.0.1:8088"
				}
				b, err = rerun.FromRecorder(ctx, recorderURL, runID)
			}
			if err != nil {
				return err
			}
			calls := 0
			for _, t := range b.Turns {
				calls += len(t.Response.ToolCalls)
			}
			if !jsonOut {
				mode := "strict: every call answers its recorded envelope"
				if live {
					mode = "live: none and reads tools run again, writes keep their recorded envelopes"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "replaying run %s (%d model turns, %d tool calls, %s) - %s\n",
					runID, len(b.Turns), calls, b.Status, mode)
			}
			rep, err := rerun.Run(ctx, b, rerun.Options{Live: live, Stall: stall})
			if err != nil {
				return err
			}
			if jsonOut {
				if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				printReplay(cmd.OutOrStdout(), rep)
			}
			if d := rep.Divergence; d != nil {
				return fmt.Errorf("%w: run %s, first difference at step %d, %s: %s", errDiverged, runID, d.Step.N, d.Step.Title(), d.What)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&recorderURL, "recorder", "", `the recorder's URL (default "http://127.0.0.1:8088", the dev server's)`)
	fl.StringVar(&databaseURL, "database-url", "", "read the bundle from the recorder's database instead (a Postgres URL or sqlite:<path>)")
	fl.StringVar(&bundleFile, "bundle", "", `read the bundle from a file (JSON, as GET /v1/runs/{run_id}/replay serves it; "-" for standard input)`)
	fl.BoolVar(&live, "live", false, "execute none and reads tools again and report changed outputs (writes never run again)")
	fl.BoolVar(&jsonOut, "json", false, "print the report as JSON")
	fl.DurationVar(&stall, "stall", rerun.DefaultStall, "how long to wait for the orchestrator's next step")
	fl.DurationVar(&timeout, "timeout", 5*time.Minute, "bound on the whole replay")
	return cmd
}

// bundleFromDatabase builds a run's replay bundle from a recorder's database
// (a Postgres URL or sqlite:<path>), without a recorder running. It lives
// here, not in package rerun, so that rerun needs no database driver.
func bundleFromDatabase(ctx context.Context, databaseURL, runID string, warn io.Writer) (rerun.Bundle, error) {
	if err := events.ValidateRunID(runID); err != nil {
		return rerun.Bundle{}, err
	}
	st, closeStore, err := recorder.OpenStore(databaseURL) //nolint:contextcheck // OpenStore does no I/O: the first query connects, under ctx
	if err != nil {
		return rerun.Bundle{}, err
	}
	defer closeStore()
	// A run recorded as ended may still have envelopes on their way (a
	// recorder records its calls apart from the run): wait for them a while,
	// as the recorder's API does.
	run, settled, err := store.AwaitSettled(ctx, st, runID, store.SettleWait, 50*time.Millisecond)
	if err != nil && !errors.Is(err, store.ErrRunNotFound) {
		return rerun.Bundle{}, err
	}
	if err == nil && store.IsTerminal(run.Status) && !settled {
		fmt.Fprintf(warn, "warning: run %s ended, but not every call it made has its envelope in the database: the bundle lacks them\n", runID)
	}
	// No NATS here: outputs left in a blob stay out of the bundle.
	b, err := store.ReplayBundle(ctx, st, runID, nil)
	if errors.Is(err, store.ErrRunNotFound) {
		return rerun.Bundle{}, fmt.Errorf("run %q is not in the database: %w", runID, err)
	}
	return b, err
}

// bundleFromFile reads a saved bundle ("-": from stdin), which must be
// runID's.
func bundleFromFile(path, runID string, stdin io.Reader) (rerun.Bundle, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path) //nolint:gosec // G304: the user names the file to read
		if err != nil {
			return rerun.Bundle{}, err
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	b, err := rerun.ReadBundle(r)
	if err != nil {
		return rerun.Bundle{}, fmt.Errorf("%s: %w", path, err)
	}
	if b.RunID != runID {
		return rerun.Bundle{}, fmt.Errorf("%s holds the bundle of run %q, not %q", path, b.RunID, runID)
	}
	return b, nil
}

func printReplay(w io.Writer, rep *rerun.Report) {
	for _, s := range rep.Steps {
		mark := "✓"
		switch {
		case rep.Divergence != nil && s.N == rep.Divergence.Step.N:
			mark = "✗"
		case !s.Checked:
			mark = "·"
		case !s.OK:
			mark = "✗"
		}
		src := ""
		if s.Source != "" {
			src = "  [" + s.Source + "]"
		}
		fmt.Fprintf(w, "  %s step %-3d %s%s\n", mark, s.N, s.Title(), src)
		if d := rep.Divergence; d != nil && s.N == d.Step.N {
			printDivergence(w, d)
		}
	}
	if d := rep.Divergence; d != nil && (d.Step.N > len(rep.Steps) || rep.Steps[d.Step.N-1].Kind != d.Step.Kind) {
		fmt.Fprintf(w, "  ✗ step %-3d %s (not in the recording)\n", d.Step.N, d.Step.Title())
		printDivergence(w, d)
	}
	if len(rep.Changed) > 0 {
		fmt.Fprintln(w, "\noutputs that changed (executed again):")
		for _, c := range rep.Changed {
			fmt.Fprintf(w, "  #%d %s (call %s)\n    recorded: %s\n    replayed: %s\n", c.Seq, c.Tool, c.CallID, c.Recorded, c.Replayed)
		}
	}
	if len(rep.Kept) > 0 {
		fmt.Fprintln(w, "\nnot executed again (recorded envelope returned):")
		for _, s := range rep.Steps {
			if why, ok := rep.Kept[s.CallID]; ok && s.CallID != "" {
				fmt.Fprintf(w, "  #%d %s: %s\n", s.Seq, s.Tool, why)
			}
		}
	}
	fmt.Fprintln(w)
	switch {
	case rep.Divergence != nil:
		fmt.Fprintf(w, "DIVERGED at step %d (%s): %s\n", rep.Divergence.Step.N, rep.Divergence.Step.Title(), rep.Divergence.What)
	case rep.Live && len(rep.Changed) > 0:
		fmt.Fprintf(w, "clean: this build makes the same decisions; %d re-executed output(s) changed\n", len(rep.Changed))
	default:
		fmt.Fprintf(w, "clean: this build makes the same decisions (%d steps, run %s)\n", len(rep.Steps), rep.Status)
	}
}

func printDivergence(w io.Writer, d *rerun.Divergence) {
	fmt.Fprintf(w, "      %s\n      recorded: %s\n      replayed: %s\n", d.What, d.Recorded, d.Replayed)
}

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/service"
)

func newRunCmd() *cobra.Command {
	var (
		natsURL string
		file    string
		runID   string
		useDemo bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Submit a run request and follow it to its AgentOutputs",
		Long: `run publishes a run request (a JSON file, "-" for standard input, or --demo) to a
running toolwire (NATS_URL, default the dev server's nats://127.0.0.1:4223),
shows each step as it happens and prints the final AgentOutputs as JSON.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			var req envelope.RunRequest
			switch {
			case useDemo:
				if runID == "" {
					runID = fmt.Sprintf("demo-%d", time.Now().UnixNano())
				}
				req = demo.Request(runID)
			case file != "":
				var b []byte
				var err error
				if file == "-" {
					b, err = readAll(cmd.InOrStdin())
				} else {
					b, err = os.ReadFile(file)
				}
				if err != nil {
					return err
				}
				dec := json.NewDecoder(bytesReader(b))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&req); err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
				if runID != "" {
					req.RunID = runID
				}
			default:
				return fmt.Errorf("give a run request with --file, or --demo")
			}
			if err := req.Validate(); err != nil {
				return err
			}
			nc, js, err := service.Connect(ctx, natsURL, "cli", discardLogger())
			if err != nil {
				return err
			}
			defer nc.Close()
			c := client.New(js, "/toolwire/cli")
			ctx, cancel := contextWithTimeout(ctx, timeout)
			defer cancel()
			if err := c.Submit(ctx, req); err != nil {
				return err
			}
			final, err := c.Follow(ctx, req.RunID, progressPrinter(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			if final.Status != events.StatusCompleted {
				return fmt.Errorf("run %s %s: %s", req.RunID, final.Status, final.Reason)
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(final.Outputs)
		},
	}
	fl := cmd.Flags()
	def := os.Getenv("NATS_URL")
	if def == "" {
		def = "nats://127.0.0.1:4223"
	}
	fl.StringVar(&natsURL, "nats", def, "NATS URL (default $NATS_URL, else the dev server)")
	fl.StringVarP(&file, "file", "f", "", `run request JSON file ("-" for standard input)`)
	fl.StringVar(&runID, "run-id", "", "override the request's run_id")
	fl.BoolVar(&useDemo, "demo", false, "submit the demo run request")
	fl.DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the run")

	return cmd
}

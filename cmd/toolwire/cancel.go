package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/events"
)

// newCancelCmd is `toolwire cancel RUN_ID [--reason TEXT] [--wait]`.
func newCancelCmd() *cobra.Command {
	var (
		natsURL string
		reason  string
		by      string
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "cancel RUN_ID [--reason TEXT] [--wait]",
		Short: "Stop a run: no model call after it, its waiting approvals withdrawn, its running calls stopped",
		Long: `Stop a run (docs/agent-loop.md, Cancellation). The run calls its model no more,
the approvals it waits for are withdrawn, its running calls are stopped (each
answered TIMEOUT or POLICY_DENIED, saying it was cancelled), and it ends with
status cancelled and the outputs of what completed.

A run that has ended is left as it is: cancel prints how it ended. With --wait,
cancel follows the run to its end and prints its status JSON (exit status 3: the
run ended cancelled or failed; 0: it completed before the cancel took).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runID := args[0]
			if err := events.ValidateRunID(runID); err != nil {
				return usageError(err)
			}
			if by == "" {
				by = operatorName()
			}
			var res client.Cancelled
			cancel := func(ctx context.Context, js jetstream.JetStream) error {
				var err error
				res, err = client.New(js, "/toolwire/cli").Cancel(ctx, runID, reason, by)
				if errors.Is(err, client.ErrNoRun) {
					return withCode(exitNotFound, err)
				}
				if err != nil {
					return err
				}
				if res.Cancelled {
					fmt.Fprintf(cmd.ErrOrStderr(), "run %s: cancel requested\n", runID)
				} else {
					fmt.Fprintf(cmd.ErrOrStderr(), "run %s had ended: %s\n", runID, res.Status)
				}
				return nil
			}
			if wait {
				return followToEnd(cmd, natsURL, timeout, runID, cancel)
			}
			if err := withJetStream(cmd.Context(), natsURL, timeout, cancel); err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), res)
		},
	}
	natsFlag(cmd.Flags(), &natsURL)
	cmd.Flags().StringVar(&reason, "reason", "", "why (the run's end says it)")
	cmd.Flags().StringVar(&by, "by", "", "who asks (default: the OS user)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the run to its end and print its status")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "bound on the whole command")
	return cmd
}

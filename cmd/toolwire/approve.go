package main

import (
	"fmt"
	"os"
	"os/user"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
)

// Errors of the decision commands (package events decides for the CLI and
// the recorder's page alike).
var (
	errNoApproval     = approvals.ErrNoApproval
	errAlreadyDecided = approvals.ErrAlreadyDecided
)

// newDecisionCmd is `toolwire approve|deny|revise RUN_ID CALL_ID`.
func newDecisionCmd(kind events.DecisionKind) *cobra.Command {
	var (
		n    cliNATS
		note string
		by   string
	)
	short := map[events.DecisionKind]string{
		events.DecisionApprove: "Approve a tool call that awaits approval: it runs",
		events.DecisionDeny:    "Deny a tool call that awaits approval: the model gets POLICY_DENIED (approval denied)",
		events.DecisionRevise:  "Ask the model to revise a tool call that awaits approval: it gets POLICY_DENIED carrying --note",
	}[kind]
	cmd := &cobra.Command{
		Use:   string(kind) + " RUN_ID CALL_ID [--note TEXT] [--by NAME]",
		Short: short,
		Long: short + `.

The call must await approval (see toolwire approvals): a decision for an unknown
call, or for a call already decided or timed out, is refused. CALL_ID may be the
short id that toolwire approvals and the timeline page show (its first 12 hex
digits; at least 6) when no other call of the run starts with it. The decision is the
event toolwire.call.<run_id>.<call_id>.decided; the Policy Guard applies it.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d := events.Decision{RunID: args[0], CallID: strings.ToLower(args[1]), Decision: kind, Note: note, By: by}
			if d.By == "" {
				d.By = operatorName()
			}
			if err := d.Validate(); err != nil {
				return err
			}
			ctx, _, js, done, err := n.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if d.CallID, err = approvals.ResolveCallID(ctx, js, d.RunID, d.CallID); err != nil {
				return err
			}
			rec, err := approvals.PendingApproval(ctx, js, d.RunID, d.CallID)
			if err != nil {
				return err
			}
			if err := approvals.PublishDecision(ctx, js, "/toolwire/cli", d, rec); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: call %s of run %s (%s@%s, agent %s)\n", pastTense(kind), d.CallID, d.RunID,
				rec.Request.ToolName, rec.Request.ToolVersion, rec.Request.AgentName)
			return nil
		},
	}
	n.flags(cmd)
	noteHelp := "a note for the record"
	if kind == events.DecisionRevise {
		noteHelp = "what the model should change (required: the model is told it)"
	}
	cmd.Flags().StringVar(&note, "note", "", noteHelp)
	cmd.Flags().StringVar(&by, "by", "", "who decides (default: your user name)")
	return cmd
}

func pastTense(k events.DecisionKind) string {
	switch k {
	case events.DecisionApprove:
		return "approved"
	case events.DecisionDeny:
		return "denied"
	}
	return "revision requested"
}

func operatorName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return os.Getenv("USER")
}

// newApprovalsCmd is `toolwire approvals`: the calls that await a decision.
func newApprovalsCmd() *cobra.Command {
	var (
		n      cliNATS
		all    bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List the tool calls that await approval (--all: decided ones too)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, _, js, done, err := n.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			kv, err := js.KeyValue(ctx, events.BucketApprovals)
			if err != nil {
				return fmt.Errorf("open approvals: %w", err)
			}
			lister, err := kv.ListKeys(ctx)
			if err != nil {
				return err
			}
			var recs []events.ApprovalRecord
			for k := range lister.Keys() {
				e, err := kv.Get(ctx, k)
				if err != nil {
					continue // removed meanwhile
				}
				rec, err := events.DecodeApprovalRecord(e.Value())
				if err != nil || (!all && (!rec.Pending() || !time.Now().Before(rec.Deadline))) {
					continue
				}
				recs = append(recs, rec)
			}
			sort.Slice(recs, func(i, j int) bool { return recs[i].Deadline.Before(recs[j].Deadline) })
			if asJSON {
				if recs == nil {
					recs = []events.ApprovalRecord{}
				}
				return printJSON(cmd.OutOrStdout(), recs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tCALL\tTOOL\tAGENT\tSTATE\tDEADLINE\tARGUMENTS")
			for _, r := range recs {
				// The short call id: toolwire approve takes it.
				fmt.Fprintf(tw, "%s\t%s\t%s@%s\t%s\t%s\t%s\t%s\n", r.Call.RunID, approvals.ShortCallID(r.Call.CallID), r.Request.ToolName,
					r.Request.ToolVersion, r.Request.AgentName, r.State, r.Deadline.Format(time.RFC3339), clip(r.Request.ArgsSummary, 80))
			}
			return tw.Flush()
		},
	}
	n.flags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "list decided and expired calls too")
	jsonFlag(cmd, &asJSON) // runs.go
	return cmd
}

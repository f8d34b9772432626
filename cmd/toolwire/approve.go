package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/events"
)

// Errors of the decision commands.
var (
	errNoApproval     = errors.New("no such call awaits approval")
	errAlreadyDecided = errors.New("the call was already decided")
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
call, or for a call already decided or timed out, is refused. The decision is the
event toolwire.call.<run_id>.<call_id>.decided; the Policy Guard applies it.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d := events.Decision{RunID: args[0], CallID: args[1], Decision: kind, Note: note, By: by}
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
			rec, err := pendingApproval(ctx, js, d.RunID, d.CallID)
			if err != nil {
				return err
			}
			if err := publishDecision(ctx, js, d, rec); err != nil {
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

// pendingApproval reads the call's approval record and checks that it still
// awaits a decision.
func pendingApproval(ctx context.Context, js jetstream.JetStream, runID, callID string) (events.ApprovalRecord, error) {
	key, err := events.ApprovalKey(runID, callID)
	if err != nil {
		return events.ApprovalRecord{}, err
	}
	kv, err := js.KeyValue(ctx, events.BucketApprovals)
	if err != nil {
		return events.ApprovalRecord{}, fmt.Errorf("open approvals: %w (is toolwire provisioned on this NATS?)", err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return events.ApprovalRecord{}, fmt.Errorf("%w: call %s of run %s is unknown, or needed no approval", errNoApproval, callID, runID)
	}
	if err != nil {
		return events.ApprovalRecord{}, fmt.Errorf("read approval: %w", err)
	}
	rec, err := events.DecodeApprovalRecord(e.Value())
	if err != nil {
		return rec, err
	}
	if !rec.Pending() {
		return rec, fmt.Errorf("%w: call %s of run %s was %s", errAlreadyDecided, callID, runID, decidedAs(&rec))
	}
	if !time.Now().Before(rec.Deadline) {
		return rec, fmt.Errorf("%w: the approval of call %s of run %s timed out at %s (a denial)", errAlreadyDecided,
			callID, runID, rec.Deadline.Format(time.RFC3339))
	}
	return rec, nil
}

func decidedAs(rec *events.ApprovalRecord) string {
	if rec.State == events.ApprovalExpired {
		return "denied: its approval timed out"
	}
	s := string(rec.State)
	if rec.Decision != nil && rec.Decision.By != "" {
		s += " by " + rec.Decision.By
	}
	if rec.DecidedAt != nil {
		s += " at " + rec.DecidedAt.Format(time.RFC3339)
	}
	return s
}

// publishDecision publishes the decided event. Its id is one per call: a
// decision already published (by anyone) within the stream's duplicate
// window is reported, not published twice.
func publishDecision(ctx context.Context, js jetstream.JetStream, d events.Decision, rec events.ApprovalRecord) error {
	out, err := events.NewDecided("/toolwire/cli", d, rec.Call.Tenant, rec.Trace)
	if err != nil {
		return err
	}
	m, err := events.Encode(out.Subject, &out.Event)
	if err != nil {
		return err
	}
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return fmt.Errorf("publish the decision: %w", err)
	}
	if ack.Duplicate {
		return fmt.Errorf("%w: a decision for call %s of run %s was already published", errAlreadyDecided, d.CallID, d.RunID)
	}
	return nil
}

// newApprovalsCmd is `toolwire approvals`: the calls that await a decision.
func newApprovalsCmd() *cobra.Command {
	var (
		n   cliNATS
		all bool
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
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tCALL\tTOOL\tAGENT\tSTATE\tDEADLINE\tARGUMENTS")
			for _, r := range recs {
				fmt.Fprintf(tw, "%s\t%s\t%s@%s\t%s\t%s\t%s\t%s\n", r.Call.RunID, r.Call.CallID, r.Request.ToolName,
					r.Request.ToolVersion, r.Request.AgentName, r.State, r.Deadline.Format(time.RFC3339), clip(r.Request.ArgsSummary, 80))
			}
			return tw.Flush()
		},
	}
	n.flags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "list decided and expired calls too")
	return cmd
}

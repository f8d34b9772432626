package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// dlqFlags are the flags every dlq subcommand shares.
type dlqFlags struct {
	natsURL  string
	jsonOut  bool
	timeout  time.Duration
	stream   string
	consumer string
}

func newDLQCmd() *cobra.Command {
	var f dlqFlags
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect and replay dead letters (events that failed every delivery)",
		Long: `An event that still fails after its consumer's maximum deliveries (or that can
never be handled: undecodable, or refused as permanent) is moved to the
TOOLWIRE_DLQ stream with where it failed, how many deliveries it had and its
failure history. dlq lists them, shows one, and replays them once the cause
is fixed: replay publishes the event again on its original subject with its
original headers and body (and a new Nats-Msg-Id), then deletes the dead
letter. Every consumer of that subject sees the event again; handlers are
idempotent, so only the one that failed it has work left to do.`,
		Example: `  toolwire dlq list
  toolwire dlq list --stream TOOLWIRE_CALLS --consumer recorder-calls
  toolwire dlq show 12
  toolwire dlq replay 12 13 --reason "the registry entry is fixed"
  toolwire dlq replay --all --consumer recorder-runs --reason "postgres is back"
  toolwire dlq audit`,
	}
	pf := cmd.PersistentFlags()
	natsFlag(pf, &f.natsURL)
	pf.BoolVar(&f.jsonOut, "json", false, "print JSON")
	pf.DurationVar(&f.timeout, "timeout", 30*time.Second, "bound on the whole command")
	cmd.AddCommand(newDLQListCmd(&f), newDLQShowCmd(&f), newDLQReplayCmd(&f), newDLQAuditCmd(&f), newDLQServeCmd(&f))
	return cmd
}

func addDLQFilters(cmd *cobra.Command, f *dlqFlags) {
	cmd.Flags().StringVar(&f.stream, "stream", "", "only dead letters of this stream (e.g. TOOLWIRE_CALLS)")
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "only dead letters of this consumer (e.g. recorder-calls)")
}

// withJS runs fn with a JetStream connection bounded by the flags' timeout.
func dlqWithJS(cmd *cobra.Command, f *dlqFlags, fn func(ctx context.Context, js jetstream.JetStream) error) error {
	return withJetStream(cmd.Context(), f.natsURL, f.timeout, fn)
}

func newDLQListCmd(f *dlqFlags) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return dlqWithJS(cmd, f, func(ctx context.Context, js jetstream.JetStream) error {
				dls, err := consume.ListDeadLetters(ctx, js, consume.DeadLetterFilter{Stream: f.stream, Consumer: f.consumer, Limit: limit})
				if err != nil {
					return err
				}
				if f.jsonOut {
					return printJSON(cmd.OutOrStdout(), dls)
				}
				if len(dls) == 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), "no dead letters")
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SEQ\tDEAD AT\tCONSUMER\tDELIVERIES\tEVENT\tERROR")
				for _, d := range dls {
					fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%d\t%s\t%s\n", d.Seq, d.DeadAt.Format(time.RFC3339), d.Stream, d.Consumer,
						d.Deliveries, dlqOrDash(d.EventID), dlqOneLine(d.Error, 100))
				}
				return tw.Flush()
			})
		},
	}
	addDLQFilters(cmd, f)
	cmd.Flags().IntVar(&limit, "limit", 0, "list at most this many (0: all)")
	outputFlag(cmd, &f.jsonOut) // runs.go: -o json, as the dlq's --json
	return cmd
}

func newDLQShowCmd(f *dlqFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "show SEQ",
		Short: "Show one dead letter: where it failed, its failure history, its headers and body",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := dlqParseSeq(args[0])
			if err != nil {
				return err
			}
			return dlqWithJS(cmd, f, func(ctx context.Context, js jetstream.JetStream) error {
				d, err := consume.GetDeadLetter(ctx, js, seq)
				if err != nil {
					return err
				}
				// An oversized dead letter's message and body are in the
				// object store: show them.
				if d, err = consume.LoadDeadLetter(ctx, js, d); err != nil {
					return err
				}
				if f.jsonOut {
					return printJSON(cmd.OutOrStdout(), d)
				}
				return printDeadLetter(cmd.OutOrStdout(), d)
			})
		},
	}
}

func newDLQReplayCmd(f *dlqFlags) *cobra.Command {
	var (
		all        bool
		reason, by string
	)
	cmd := &cobra.Command{
		Use:   "replay SEQ... | --all",
		Short: "Publish dead letters again on their original subjects and delete them",
		Args: func(_ *cobra.Command, args []string) error {
			switch {
			case all && len(args) > 0:
				return errors.New("give sequence numbers or --all, not both")
			case !all && len(args) == 0:
				return errors.New("give the sequence numbers of the dead letters to replay (see toolwire dlq list), or --all")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var seqs []uint64
			for _, a := range args {
				seq, err := dlqParseSeq(a)
				if err != nil {
					return err
				}
				seqs = append(seqs, seq)
			}
			if !all && (f.stream != "" || f.consumer != "") {
				return errors.New("--stream and --consumer select dead letters for --all")
			}
			if strings.TrimSpace(reason) == "" {
				return errors.New("give --reason: why the dead letters may go again (the cause fixed); it is recorded with who replayed what, see toolwire dlq audit")
			}
			return dlqWithJS(cmd, f, func(ctx context.Context, js jetstream.JetStream) error {
				if all {
					dls, err := consume.ListDeadLetters(ctx, js, consume.DeadLetterFilter{Stream: f.stream, Consumer: f.consumer})
					if err != nil {
						return err
					}
					for _, d := range dls {
						seqs = append(seqs, d.Seq)
					}
					if len(seqs) == 0 {
						fmt.Fprintln(cmd.ErrOrStderr(), "no dead letters to replay")
						return nil
					}
				}
				var (
					done []consume.Replayed
					errs []error
				)
				for _, seq := range seqs {
					r, err := consume.ReplayDeadLetterAs(ctx, js, seq, reason, by)
					if err != nil {
						errs = append(errs, err)
						continue
					}
					done = append(done, r)
					if !f.jsonOut {
						note := ""
						if r.Duplicate {
							note = " (it had been replayed already)"
						}
						fmt.Fprintf(cmd.OutOrStdout(), "replayed %d: %s on %s as %s seq %d%s\n", seq, dlqOrDash(r.DeadLetter.EventID),
							r.DeadLetter.Subject, r.Stream, r.Seq, note)
					}
				}
				if f.jsonOut {
					if done == nil {
						done = []consume.Replayed{}
					}
					if err := printJSON(cmd.OutOrStdout(), done); err != nil {
						return err
					}
				}
				return errors.Join(errs...)
			})
		},
	}
	addDLQFilters(cmd, f)
	cmd.Flags().BoolVar(&all, "all", false, "replay every dead letter (of --stream / --consumer)")
	cmd.Flags().StringVar(&reason, "reason", "", "why they may go again (required; recorded, see toolwire dlq audit)")
	cmd.Flags().StringVar(&by, "by", cliActor(), "who replays them, as recorded")
	return cmd
}

func printDeadLetter(w io.Writer, d consume.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"seq", strconv.FormatUint(d.Seq, 10)},
		{"event", dlqOrDash(d.EventID)},
		{"type", dlqOrDash(d.EventType)},
		{"subject", d.Subject},
		{"failed in", fmt.Sprintf("%s (stream seq %d), consumer %s", d.Stream, d.StreamSeq, d.Consumer)},
		{"deliveries", strconv.FormatUint(d.Deliveries, 10)},
		{"dead at", d.DeadAt.Format(time.RFC3339Nano)},
		{"error", dlqOneLine(d.Error, 0)},
	}
	switch {
	case d.Truncated:
		rows = append(rows, [2]string{"stored", fmt.Sprintf("too large for a message and the object store failed: %d bytes of %d kept (sha256 %s); it cannot be replayed", len(d.Data), d.Bytes, d.SHA256)})
	case d.Object != "":
		rows = append(rows, [2]string{"stored", fmt.Sprintf("too large for a message: object %s in %s, %d bytes", d.Object, provision.ObjectDeadLetters, d.Bytes)})
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nfailure history:")
	for _, h := range d.History {
		fmt.Fprintf(w, "  attempt %d at %s: %s\n", h.Attempt, h.At.Format(time.RFC3339Nano), dlqOneLine(h.Error, 0))
	}
	fmt.Fprintln(w, "\nheaders:")
	keys := make([]string, 0, len(d.Header))
	for k := range d.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %s\n", k, strings.Join(d.Header[k], ", "))
	}
	fmt.Fprintln(w, "\nbody:")
	var pretty any
	if json.Unmarshal(d.Data, &pretty) == nil {
		b, err := json.MarshalIndent(pretty, "  ", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "  %s\n", b)
		return err
	}
	_, err := fmt.Fprintf(w, "  %q\n", d.Data)
	return err
}

func dlqParseSeq(s string) (uint64, error) {
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 {
		return 0, fmt.Errorf("%q is not a dead letter's sequence number (a whole number from 1; see toolwire dlq list)", s)
	}
	return seq, nil
}

func dlqOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine folds s onto one line, cut at n runes (0: no cut).
func dlqOneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); n > 0 && len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

func newDLQAuditCmd(f *dlqFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "audit",
		Short: "List every replay: which dead letter, why, who, when",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return dlqWithJS(cmd, f, func(ctx context.Context, js jetstream.JetStream) error {
				rs, err := consume.ListReplays(ctx, js)
				if err != nil {
					return err
				}
				if f.jsonOut {
					return printJSON(cmd.OutOrStdout(), rs)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "AT\tSEQ\tBY\tSUBJECT\tCONSUMER\tREASON")
				for _, r := range rs {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", r.At.Format(time.RFC3339), r.Seq, r.By, r.Subject, dlqOrDash(r.Consumer), r.Reason)
				}
				return tw.Flush()
			})
		},
	}
}

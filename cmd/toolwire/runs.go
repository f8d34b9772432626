package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// `toolwire runs`: the recorded runs, read from the recorder's HTTP API
// (services/recorder/api/api.go), and a run's events followed over NATS.

// devRecorderURL is where `toolwire dev` serves the recorder's API.
const devRecorderURL = "http://127.0.0.1:8088"

// maxAnswerBytes bounds an answer of the recorder read by the CLI.
const maxAnswerBytes = 64 << 20

// recorderFlags are how a command reaches the recorder's API.
type recorderFlags struct {
	url     string
	token   string
	timeout time.Duration
}

func (r *recorderFlags) bind(cmd *cobra.Command) {
	def := os.Getenv("TOOLWIRE_RECORDER_URL")
	if def == "" {
		def = devRecorderURL
	}
	fl := cmd.Flags()
	fl.StringVar(&r.url, "recorder", def, "the recorder's URL (default $TOOLWIRE_RECORDER_URL, else the dev server's)")
	// Not the flag's default: --help would print the secret.
	fl.StringVar(&r.token, "token", "", "bearer token for a recorder with authentication on (default $TOOLWIRE_TOKEN; see toolwire tokens create)")
	fl.DurationVar(&r.timeout, "timeout", 30*time.Second, "how long the command may take")
}

// apiError is an error answer of the recorder.
type apiError struct {
	status int
	body   apitypes.ErrorBody
}

func (e *apiError) Error() string {
	if e.body.Message == "" {
		return fmt.Sprintf("the recorder answered %d %s", e.status, http.StatusText(e.status))
	}
	return fmt.Sprintf("%s (%d %s)", e.body.Message, e.status, e.body.Code)
}

// get reads GET base+path?query into v ([]byte: the body as it is). Its
// errors carry their exit status: unreachable, not found (404), failed (a
// run that failed has no outputs), timeout.
func (r *recorderFlags) get(ctx context.Context, path string, query url.Values, v any) error {
	u, err := url.Parse(r.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError(fmt.Errorf("--recorder %q: want http(s)://host:port", r.url))
	}
	u = u.JoinPath(strings.Split(strings.TrimPrefix(path, "/"), "/")...)
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("recorder request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if tok := cmp.Or(r.token, os.Getenv("TOOLWIRE_TOKEN")); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() == nil || exitCode(err) == exitUnreachable {
			return withCode(exitUnreachable, fmt.Errorf("no recorder at %s: %w; start it with `toolwire dev`, "+
				"or point --recorder (or TOOLWIRE_RECORDER_URL) at it", r.url, err))
		}
		return fmt.Errorf("recorder at %s: %w", r.url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return fmt.Errorf("recorder at %s: read %s: %w", r.url, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &apiError{status: resp.StatusCode}
		var ej apitypes.ErrorJSON
		if json.Unmarshal(body, &ej) == nil {
			e.body = ej.Error
		} else {
			e.body.Message = strings.TrimSpace(string(body))
		}
		switch {
		case resp.StatusCode == http.StatusNotFound:
			return withCode(exitNotFound, e)
		case e.body.Code == apitypes.CodeRunFailed:
			return withCode(exitRunFailed, e)
		case resp.StatusCode == http.StatusBadRequest:
			return usageError(e)
		}
		return e
	}
	if raw, ok := v.(*[]byte); ok {
		*raw = body
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("recorder at %s: %s: %w", r.url, path, err)
	}
	return nil
}

// listFilter is `toolwire runs list`'s flags: the filters of GET /v1/runs.
type listFilter struct {
	status, agent, org, workspace, user, tenant, since, until string
	limit                                                     int
}

// query checks the filters and makes GET /v1/runs's query of them; since
// and until take an RFC 3339 time or a duration before now.
func (f listFilter) query(now time.Time) (url.Values, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("status", f.status)
	set("agent", f.agent)
	set("org_id", f.org)
	set("workspace_id", f.workspace)
	set("user_id", f.user)
	set("tenant", f.tenant)
	for _, p := range []struct{ name, v string }{{"since", f.since}, {"until", f.until}} {
		if p.v == "" {
			continue
		}
		if d, err := time.ParseDuration(p.v); err == nil {
			if d < 0 {
				return nil, fmt.Errorf("--%s %s: a duration before now must not be negative", p.name, p.v)
			}
			q.Set(p.name, now.Add(-d).UTC().Format(time.RFC3339Nano))
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, p.v)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: give an RFC 3339 time (2026-03-01T12:00:00Z) or a duration before now (90m)", p.name, p.v)
		}
		q.Set(p.name, t.UTC().Format(time.RFC3339Nano))
	}
	if f.limit < 0 {
		return nil, fmt.Errorf("--limit %d must be at least 1", f.limit)
	}
	if f.limit > 0 {
		q.Set("limit", strconv.Itoa(f.limit))
	}
	return q, nil
}

func newRunsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List recorded runs, show one, follow one, print its outputs",
		Long: `runs reads the recorder's HTTP API (--recorder, default $TOOLWIRE_RECORDER_URL,
else the dev server's http://127.0.0.1:8088; --token or $TOOLWIRE_TOKEN when
its authentication is on): list, get and outputs. follow reads the run's
events over NATS (--nats) as toolwire run does.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newRunsListCmd(), newRunsGetCmd(), newRunsOutputsCmd(), newRunsFollowCmd())
	return cmd
}

func newRunsListCmd() *cobra.Command {
	var (
		r      recorderFlags
		f      listFilter
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List recorded runs, newest first",
		Example: `  toolwire runs list --status failed --since 24h
  toolwire runs list --agent support-bot --tenant acme/eu --limit 10 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := f.query(time.Now())
			if err != nil {
				return usageError(err)
			}
			ctx, cancel := contextWithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			var list apitypes.RunListJSON
			if err := r.get(ctx, "/v1/runs", q, &list); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), list.Runs)
			}
			return printRuns(cmd.OutOrStdout(), list.Runs)
		},
	}
	r.bind(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.status, "status", "", "keep one status: "+strings.Join(store.RunStatuses(), ", "))
	fl.StringVar(&f.agent, "agent", "", "keep one agent")
	fl.StringVar(&f.org, "org", "", "keep one org")
	fl.StringVar(&f.workspace, "workspace", "", "keep one workspace")
	fl.StringVar(&f.user, "user", "", "keep one user")
	fl.StringVar(&f.tenant, "tenant", "", "keep one tenant: org, org/workspace or org/workspace/user")
	fl.StringVar(&f.since, "since", "", "keep runs created at or after this: an RFC 3339 time, or a duration before now (24h)")
	fl.StringVar(&f.until, "until", "", "keep runs created before this: an RFC 3339 time, or a duration before now")
	fl.IntVar(&f.limit, "limit", 0, "at most this many runs (default the recorder's)")
	jsonFlag(cmd, &asJSON)
	return cmd
}

// jsonFlag adds a listing's --json, and -o/--output json for the same.
func jsonFlag(cmd *cobra.Command, dst *bool) {
	cmd.Flags().BoolVar(dst, "json", false, "print JSON")
	outputFlag(cmd, dst)
}

// outputFlag adds -o/--output json|table to a listing whose --json is dst.
func outputFlag(cmd *cobra.Command, dst *bool) {
	var output string
	cmd.Flags().StringVarP(&output, "output", "o", "", `"json" prints JSON (as --json), "table" the table`)
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		switch output {
		case "":
		case "json":
			*dst = true
		case "table":
			*dst = false
		default:
			return usageError(fmt.Errorf("-o %q: want json or table", output))
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

func printRuns(w io.Writer, runs []apitypes.RunJSON) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATUS\tAGENT\tTENANT\tTURNS\tCALLS\tSPEND\tCREATED\tREASON")
	for _, r := range runs {
		spend := "-"
		if r.Spend != nil {
			spend = formatSpend(*r.Spend)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", r.RunID, r.Status, r.Agent, tenantText(r.Tenant), r.Counts.Iterations,
			r.Counts.ToolCalls, spend, r.CreatedAt.Format(time.RFC3339), clip(r.Reason, 60))
	}
	return tw.Flush()
}

// tenantText is a tenant as org[/workspace[/user]].
func tenantText(t envelope.Tenant) string {
	return strings.TrimRight(t.ID(), "/")
}

// runArg checks a command's RUN_ID.
func runArg(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	return events.ValidateRunID(args[0])
}

func newRunsGetCmd() *cobra.Command {
	var (
		r      recorderFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "get RUN_ID",
		Short: "Show a recorded run and its tool calls",
		Args:  runArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := contextWithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			var run apitypes.RunDetailJSON
			if err := r.get(ctx, "/v1/runs/"+args[0], nil, &run); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), run)
			}
			return printRun(cmd.OutOrStdout(), run)
		},
	}
	r.bind(cmd)
	jsonFlag(cmd, &asJSON)
	return cmd
}

func printRun(w io.Writer, r apitypes.RunDetailJSON) error {
	fmt.Fprintf(w, "run %s: %s", r.RunID, r.Status)
	if r.Reason != "" {
		fmt.Fprintf(w, " (%s)", r.Reason)
	}
	fmt.Fprintf(w, "\n  agent %s, tenant %s, trace %s\n", r.Agent, tenantText(r.Tenant), r.TraceID)
	fmt.Fprintf(w, "  created %s", r.CreatedAt.Format(time.RFC3339))
	if r.CompletedAt != nil {
		fmt.Fprintf(w, ", ended %s", r.CompletedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "\n  %d model turn(s), %d tool call(s)", r.Counts.Iterations, r.Counts.ToolCalls)
	if r.Spend != nil {
		fmt.Fprintf(w, ", spend %s", formatSpend(*r.Spend))
	}
	fmt.Fprintln(w)
	if len(r.ToolCalls) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  SEQ\tCALL\tTOOL\tSTATUS\tERROR\tLATENCY")
	for _, c := range r.ToolCalls {
		seq, errCode, latency := "-", "", "-"
		if c.Seq != nil {
			seq = strconv.Itoa(*c.Seq)
		}
		if c.ErrorCode != nil {
			errCode = *c.ErrorCode
		}
		if c.LatencyMS != nil {
			latency = strconv.FormatInt(*c.LatencyMS, 10) + "ms"
		}
		short := c.CallID
		if len(short) > 12 {
			short = short[:12] // as toolwire run and approvals show it
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s@%s\t%s\t%s\t%s\n", seq, short, c.Name, c.Version, c.Status, errCode, latency)
	}
	return tw.Flush()
}

func newRunsOutputsCmd() *cobra.Command {
	var r recorderFlags
	cmd := &cobra.Command{
		Use:   "outputs RUN_ID",
		Short: "Print a completed run's AgentOutputs as JSON",
		Long: `outputs prints a completed run's AgentOutputs as JSON. A failed run has none
(exit status 3, with its reason); a run still going answers that it has not
completed (exit status 1): toolwire runs follow waits for it.`,
		Args: runArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := contextWithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			var raw []byte
			if err := r.get(ctx, "/v1/runs/"+args[0]+"/outputs", nil, &raw); err != nil {
				return err
			}
			var out bytes.Buffer
			if err := json.Indent(&out, raw, "", "  "); err != nil {
				return fmt.Errorf("run %s: outputs: %w", args[0], err)
			}
			out.WriteByte('\n')
			_, err := out.WriteTo(cmd.OutOrStdout())
			return err
		},
	}
	r.bind(cmd)
	return cmd
}

func newRunsFollowCmd() *cobra.Command {
	var (
		natsURL string
		timeout time.Duration
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "follow RUN_ID",
		Short: "Reattach to a run: its steps from the first, as toolwire run shows them, to its end",
		Long: `follow reads a run's events over NATS (--nats, default $NATS_URL, else the dev
server's) from its first, prints each step as toolwire run does, and ends with
the run's end: a completed run's AgentOutputs as JSON, a failed run's status
as JSON (exit status 3). A run still going is followed until it ends or
--timeout passes (exit status 4; the run goes on). A run whose events NATS
does not hold exits 6.

When the run's agent streams (agent.stream), the text of each model call
shows as it grows, on a "thinking" line per turn, from the moment follow
listens (NATS keeps no delta: what streamed before is in the turn's line).
--json (-o json) prints the steps as JSON lines instead, on standard error
too: {"type":"event","event":<CloudEvent>} per event and
{"type":"delta",...} per delta (pkg/events/delta.go); standard output is
the same.`,
		Example: `  toolwire runs follow demo-1764650000000000000
  toolwire runs follow demo-1764650000000000000 -o json 2>progress.jsonl`,
		Args: runArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			runID := args[0]
			return followProgress(cmd, natsURL, timeout, runID, asJSON, func(ctx context.Context, js jetstream.JetStream) error {
				return runKnown(ctx, js, runID)
			})
		},
	}
	natsFlag(cmd.Flags(), &natsURL)
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the run's end")
	progressFlag(cmd, &asJSON)
	return cmd
}

// progressFlag adds --json, and -o/--output json|text, to a command that
// follows a run: JSON lines instead of the text lines of its progress.
func progressFlag(cmd *cobra.Command, dst *bool) {
	var output string
	fl := cmd.Flags()
	fl.BoolVar(dst, "json", false, "print the run's progress (its events, its model's deltas) as JSON lines")
	fl.StringVarP(&output, "output", "o", "", `"json" prints the progress as JSON lines (as --json), "text" as text`)
	cmd.PreRunE = func(*cobra.Command, []string) error {
		switch output {
		case "":
		case "json":
			*dst = true
		case "text":
			*dst = false
		default:
			return usageError(fmt.Errorf("-o %q: want json or text", output))
		}
		return nil
	}
}

// runKnown says whether NATS holds an event of the run (its request at
// least): a run id it does not know is an error of exit status not found,
// not a wait until --timeout.
func runKnown(ctx context.Context, js jetstream.JetStream, runID string) error {
	subj, err := events.RunEvents(runID)
	if err != nil {
		return usageError(err)
	}
	s, err := js.Stream(ctx, events.StreamRuns)
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.StreamRuns, err)
	}
	_, err = s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return withCode(exitNotFound, fmt.Errorf("run %s: NATS holds no event of it: it was never submitted, or its events "+
			"are past the stream's retention (toolwire runs get %s asks the recorder)", runID, runID))
	}
	if err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	return nil
}

// followToEnd is followProgress with the progress as text lines.
func followToEnd(cmd *cobra.Command, natsURL string, timeout time.Duration, runID string,
	before func(ctx context.Context, js jetstream.JetStream) error) error {
	return followProgress(cmd, natsURL, timeout, runID, false, before)
}

// followProgress connects to NATS, follows the run to its end with the
// progress on standard error (text lines, or asJSON JSON lines:
// followPrinter), its model's deltas included, and runs before (the submit
// of toolwire run, the check that the run exists of runs follow) once the
// follow listens, so that none of the run's deltas goes by unheard. It
// prints a completed run's outputs, or a failed run's status (exit status
// exitRunFailed), on standard output. Interrupted or past timeout once
// before has succeeded, it says that the run goes on and how to reattach.
func followProgress(cmd *cobra.Command, natsURL string, timeout time.Duration, runID string, asJSON bool,
	before func(ctx context.Context, js jetstream.JetStream) error) error {
	var (
		final    *events.RunStatus
		attached bool
	)
	p := newFollowPrinter(cmd.ErrOrStderr(), asJSON)
	err := withJetStream(cmd.Context(), natsURL, timeout, func(ctx context.Context, js jetstream.JetStream) (err error) {
		final, err = client.New(js, "/toolwire/cli").Follow(ctx, runID, p.print, client.WithDeltas(),
			client.WithSubscribed(func(ctx context.Context) error {
				if err := before(ctx, js); err != nil {
					return err
				}
				attached = true
				return nil
			}))
		return err
	})
	p.finish()
	if err != nil {
		return detached(cmd, err, attached, natsURL, timeout, runID)
	}
	if final.Spend > 0 && !asJSON {
		fmt.Fprintf(cmd.ErrOrStderr(), "spend: %s\n", formatSpend(final.Spend))
	}
	if final.Status != events.StatusCompleted {
		if err := printJSON(cmd.OutOrStdout(), final); err != nil {
			return err
		}
		return withCode(exitRunFailed, fmt.Errorf("run %s %s: %s", runID, final.Status, final.Reason))
	}
	return printJSON(cmd.OutOrStdout(), final.Outputs)
}

// detached is the error of a follow that ended before the run did: when it
// was interrupted or its timeout passed once the run was under way, the run
// goes on, and the error says how to reattach.
func detached(cmd *cobra.Command, err error, attached bool, natsURL string, timeout time.Duration, runID string) error {
	if !attached || exitCode(err) == exitUnreachable {
		return err
	}
	again := "toolwire runs follow " + runID
	if natsURL != devNATSURL && natsURL != os.Getenv("NATS_URL") {
		again += " --nats " + natsURL
	}
	switch {
	case cmd.Context().Err() != nil:
		return withCode(exitInterrupted, fmt.Errorf("interrupted; run %s goes on: reattach with `%s`", runID, again))
	case errors.Is(err, context.DeadlineExceeded):
		return withCode(exitTimeout, fmt.Errorf("run %s has not ended within --timeout %s; it goes on: reattach with `%s`",
			runID, timeout, again))
	}
	return err
}

// followPrinter shows a followed run's progress: progressPrinter's lines,
// and for a streaming model a "thinking" line per model call, its text as
// it grows, the tools it starts to call and a mark for each attempt
// discarded, ended by the call's turn; or, asJSON, a JSON line per event
// ({"type":"event"}) and per delta ({"type":"delta"}).
type followPrinter struct {
	w        io.Writer
	asJSON   bool
	progress func(client.Event) bool
	open     int // the model call whose thinking line is open; 0: none
}

func newFollowPrinter(w io.Writer, asJSON bool) *followPrinter {
	return &followPrinter{w: w, asJSON: asJSON, progress: progressPrinter(w)}
}

// print is client.Follow's callback.
func (p *followPrinter) print(e client.Event) bool {
	if p.asJSON {
		p.printJSON(e)
		return true
	}
	if e.Delta != nil {
		p.delta(*e.Delta)
		return true
	}
	p.finish()
	return p.progress(e)
}

// finish ends the open thinking line.
func (p *followPrinter) finish() {
	if p.open != 0 {
		fmt.Fprintln(p.w)
		p.open = 0
	}
}

// thinkingPrefix starts the thinking line of model call n.
func (p *followPrinter) thinkingPrefix(n int) {
	fmt.Fprintf(p.w, "  thinking (turn %d): ", n)
	p.open = n
}

// delta extends the thinking line of d's model call.
func (p *followPrinter) delta(d events.Delta) {
	if p.open != d.Iteration {
		p.finish()
		p.thinkingPrefix(d.Iteration)
	}
	switch {
	case d.Discarded:
		fmt.Fprintf(p.w, " [attempt %d discarded, retrying]\n", d.Attempt)
		p.thinkingPrefix(d.Iteration)
	case d.ToolCall != nil:
		if d.ToolCall.Name != "" {
			fmt.Fprintf(p.w, "[calls %s] ", oneLine(d.ToolCall.Name))
		}
	default:
		fmt.Fprint(p.w, oneLine(d.Text))
	}
}

// oneLine is s as a terminal shows it on one line: line breaks and tabs as
// spaces, no other control character (a model's text must not drive the
// terminal).
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			return ' '
		case unicode.IsControl(r):
			return -1
		}
		return r
	}, s)
}

// followLine is a JSON line of the progress: an event or a delta.
type followLine struct {
	Type  string         `json:"type"`
	Event map[string]any `json:"event,omitempty"`
	*events.Delta
}

// printJSON prints e as a JSON line.
func (p *followPrinter) printJSON(e client.Event) {
	line := followLine{Type: "delta", Delta: e.Delta}
	if e.Delta == nil {
		line = followLine{Type: "event", Event: cloudEventJSON(e.Event)}
	}
	b, err := json.Marshal(line)
	if err != nil {
		return // an extension that does not encode: not for this line
	}
	fmt.Fprintf(p.w, "%s\n", b)
}

// cloudEventJSON is e in the CloudEvents JSON format, its data inline (as
// the recorder's live stream has it), not base64 as the SDK writes the
// bytes it was decoded from.
func cloudEventJSON(e *event.Event) map[string]any {
	ce := map[string]any{}
	maps.Copy(ce, e.Extensions())
	ce["specversion"], ce["id"], ce["source"], ce["type"] = e.SpecVersion(), e.ID(), e.Source(), e.Type()
	if !e.Time().IsZero() {
		ce["time"] = e.Time().UTC().Format(time.RFC3339Nano)
	}
	for k, v := range map[string]string{"datacontenttype": e.DataContentType(), "dataschema": e.DataSchema(), "subject": e.Subject()} {
		if v != "" {
			ce[k] = v
		}
	}
	if d := e.Data(); json.Valid(d) {
		ce["data"] = json.RawMessage(d)
	} else if len(d) > 0 {
		ce["data_base64"] = d // encoding/json writes []byte in base64
	}
	return ce
}

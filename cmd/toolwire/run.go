package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/demo"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// runFlags are what `toolwire run` builds its request from.
type runFlags struct {
	file      string
	runID     string
	demo      bool
	provider  string
	model     string
	prompt    string
	maxBudget float64
	deadline  time.Duration
	stream    bool
}

func newRunCmd() *cobra.Command {
	var (
		natsURL string
		f       runFlags
		timeout time.Duration
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Submit a run request and follow it to its AgentOutputs",
		Long: `run publishes a run request (a JSON file, "-" for standard input, --demo, or
--prompt) to a running toolwire (NATS_URL, default the dev server's
nats://127.0.0.1:4223), shows each step as it happens and prints the final
AgentOutputs as JSON; a run that ends failed prints its status as JSON and
exits 3. Interrupted, or past --timeout, it says that the run goes on and
prints the toolwire runs follow command that reattaches to it.

--provider and --model run the request on a real model: openai (the
orchestrator needs OPENAI_API_KEY, and OPENAI_BASE_URL for any other
OpenAI-compatible server such as vLLM or Ollama) or anthropic (it needs
ANTHROPIC_API_KEY). --prompt asks the demo agent (tools echo, calculator,
get_current_time) your own question.

--stream has the model stream its answers (agent.stream): the text of each
model call shows as it grows, on a "thinking" line per turn, and an attempt
the provider failed mid-stream is marked "[attempt N discarded, retrying]".
--json (-o json) prints the steps as JSON lines instead, on standard error:
{"type":"event","event":<CloudEvent>} per event, {"type":"delta",...} per
delta (pkg/events/delta.go); standard output is the same.

  toolwire run --demo
  toolwire run --demo --provider openai --model gpt-4o-mini
  toolwire run --provider anthropic --model claude-haiku-4-5 --prompt "What is 17*23? Use a tool."
  toolwire run -f request.json --provider openai --model gpt-4.1-mini
  toolwire run --demo --stream -o json 2>progress.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := buildRunRequest(f, cmd.InOrStdin(), time.Now())
			if err != nil {
				return usageError(err)
			}
			// runs.go: the progress lines, the end, and what to do when
			// the wait ends before the run does.
			return followProgress(cmd, natsURL, timeout, req.RunID, asJSON, func(ctx context.Context, js jetstream.JetStream) error {
				return client.New(js, "/toolwire/cli").Submit(ctx, req)
			})
		},
	}
	fl := cmd.Flags()
	natsFlag(fl, &natsURL)
	fl.StringVarP(&f.file, "file", "f", "", `run request JSON file ("-" for standard input)`)
	fl.StringVar(&f.runID, "run-id", "", "override the request's run_id")
	fl.BoolVar(&f.demo, "demo", false, "submit the demo run request")
	fl.StringVar(&f.provider, "provider", "", "run on this model provider: openai or anthropic (with --model)")
	fl.StringVar(&f.model, "model", "", "the provider's model, e.g. gpt-4o-mini or claude-haiku-4-5")
	fl.StringVar(&f.prompt, "prompt", "", "ask the demo agent this instead (needs --provider and --model)")
	fl.Float64Var(&f.maxBudget, "max-budget", 0, "stop the run before a call that would make it cost more than this (USD at the orchestrator's prices)")
	fl.DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the run")
	fl.BoolVar(&f.stream, "stream", false, "have the model stream its answers (agent.stream) and show them as they grow")
	progressFlag(cmd, &asJSON)
	fl.DurationVar(&f.deadline, "deadline", 0, "the run's deadline (deadline_s, whole seconds up to 24h): past it the run ends failed with TIMEOUT; default the request's, else the orchestrator's TOOLWIRE_RUN_DEADLINE")
	return cmd
}

// buildRunRequest makes the request the flags describe and validates it.
func buildRunRequest(f runFlags, stdin io.Reader, now time.Time) (envelope.RunRequest, error) {
	var req envelope.RunRequest
	if f.demo && f.file != "" {
		return req, errors.New("give either --demo or --file, not both")
	}
	if (f.provider == "") != (f.model == "") {
		return req, errors.New("--provider and --model go together, e.g. --provider openai --model gpt-4o-mini")
	}
	if f.prompt != "" && f.provider == "" {
		return req, errors.New("--prompt needs a real model: add --provider openai|anthropic --model NAME")
	}
	if f.maxBudget < 0 {
		return req, errors.New("--max-budget must not be negative")
	}
	switch {
	case f.file != "":
		b, err := readInput(f.file, stdin)
		if err != nil {
			return req, err
		}
		if err := decodeStrict(b, &req); err != nil {
			return req, fmt.Errorf("run request %s: %w", f.file, err)
		}
	case f.demo || f.prompt != "":
		req = demo.Request(fmt.Sprintf("demo-%d", now.UnixNano()))
	default:
		return req, errors.New("give a run request with --file, --demo, or --prompt with --provider and --model")
	}
	if f.runID != "" {
		req.RunID = f.runID
	}
	if f.provider != "" {
		m := &req.Agent.Model
		if m.Provider != f.provider {
			m.Options = nil // another provider's options (the scripted model's script) mean nothing to it
		}
		m.Provider, m.Name = strings.TrimSpace(f.provider), strings.TrimSpace(f.model)
	}
	if f.prompt != "" {
		req.Messages = []envelope.Message{{Role: envelope.RoleUser, Content: f.prompt}}
	}
	if f.maxBudget > 0 {
		req.Agent.Policy.MaxBudget = f.maxBudget
	}
	if f.stream {
		req.Agent.Stream = true
	}
	if f.deadline < 0 {
		return req, errors.New("--deadline must not be negative")
	}
	if f.deadline > 0 {
		req.DeadlineS = int((f.deadline + time.Second - 1) / time.Second) // whole seconds, rounded up
	}
	return req, req.Validate()
}

func formatSpend(v float64) string {
	s := fmt.Sprintf("%.6f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// `toolwire call`: one tool call, as a run of its own.

// callAgent is the agent name of the calls `toolwire call` makes.
const callAgent = "toolwire-call"

// errCallFailed is returned with --fail-on-error when the envelope holds an
// error.
var errCallFailed = errors.New("tool call failed")

func newCallCmd() *cobra.Command {
	var (
		natsURL     string
		input       string
		inputFile   string
		tenant      envelope.Tenant
		runID       string
		timeout     time.Duration
		failOnError bool
	)
	cmd := &cobra.Command{
		Use:   "call NAME@VERSION --input JSON",
		Short: "Run one tool call as a run of its own and print its ToolEnvelope",
		Long: `call runs a single tool call (a "tool node") on a running toolwire (NATS_URL,
default the dev server's nats://127.0.0.1:4223) and prints the call's
ToolEnvelope as JSON. The call is a run of its own, of agent "toolwire-call",
whose scripted model makes that one call: the Policy Guard judges it as any
call of an agent (a blocked tool, a side-effect ceiling, an approval the
tool requires: "toolwire approve" decides it while call waits), the workers of
the tool's queue run it with the same validation, rate limits, cache,
timeouts, truncation and exactly-once writes, and the recorder keeps it as a
completed run.

The run is "call-<random hex>" (or --run-id); the call has sequence number 1;
the tenant is --org (default "default"), --workspace and --user.

A call that fails is still an answer: its envelope (with error.code) is printed
and the exit status is 0, unless --fail-on-error is given (then 3). An
unknown or blocked tool (the call's run is refused, with its reason) exits 3,
bad arguments 2, an unreachable NATS 5 and no answer within --timeout 4, all
without an envelope.`,
		Example: `  toolwire call calculator@1.0.0 --input '{"expression":"6*7"}'
  echo '{"text":"hi"}' | toolwire call echo@1.0.0 --input-file - --org acme --user u1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := buildCall(args[0], input, inputFile, cmd.InOrStdin(), tenant, runID)
			if err != nil {
				return usageError(err)
			}
			var env *envelope.ToolEnvelope
			if err := withJetStream(cmd.Context(), natsURL, timeout, func(ctx context.Context, js jetstream.JetStream) (err error) {
				env, err = c.run(ctx, client.New(js, "/toolwire/cli"), cmd.ErrOrStderr())
				return err
			}); err != nil {
				return err
			}
			if err := printJSON(cmd.OutOrStdout(), env); err != nil {
				return err
			}
			if failOnError && env.Error != nil {
				return withCode(exitRunFailed, fmt.Errorf("%w: %s: %s", errCallFailed, env.Error.Code, env.Error.Message))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	natsFlag(fl, &natsURL)
	fl.StringVar(&input, "input", "", "the tool's input as JSON")
	fl.StringVar(&inputFile, "input-file", "", `read the input from a file ("-" for standard input)`)
	fl.StringVar(&tenant.OrgID, "org", "default", "tenant organisation id")
	fl.StringVar(&tenant.WorkspaceID, "workspace", "", "tenant workspace id")
	fl.StringVar(&tenant.UserID, "user", "", "tenant user id")
	fl.StringVar(&runID, "run-id", "", `the call's run id (default "call-<random hex>")`)
	fl.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the envelope")
	fl.BoolVar(&failOnError, "fail-on-error", false, "exit 3 when the envelope holds an error")
	return cmd
}

// oneCall is a tool call made by `toolwire call`: the run that makes it.
type oneCall struct {
	ref    envelope.ToolRef
	callID string
	req    envelope.RunRequest
}

// buildCall checks the arguments and builds the run that makes the call.
func buildCall(tool, input, inputFile string, stdin io.Reader, tenant envelope.Tenant, runID string) (*oneCall, error) {
	ref, err := envelope.ParseToolRef(tool)
	if err != nil {
		return nil, err
	}
	var raw []byte
	switch {
	case input != "" && inputFile != "":
		return nil, errors.New("give the input with --input or --input-file, not both")
	case inputFile != "":
		raw, err = readInput(inputFile, stdin)
	case input != "":
		raw = []byte(input)
	default:
		return nil, errors.New("give the tool's input as JSON with --input (for example --input '{}')")
	}
	if err != nil {
		return nil, fmt.Errorf("read input: %w", err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, fmt.Errorf("input is not valid JSON: %w", err)
	}
	if strings.TrimSpace(tenant.OrgID) == "" {
		return nil, errors.New("--org must not be empty")
	}
	if runID == "" {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		runID = "call-" + hex.EncodeToString(b)
	}
	if err := events.ValidateRunID(runID); err != nil {
		return nil, err
	}
	in := json.RawMessage(compact.Bytes())
	callID, err := envelope.CallID(ref.Name, ref.Version, in, 1)
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	script, err := json.Marshal(map[string]any{"script": []any{
		map[string]any{"tool_calls": []any{map[string]any{"name": ref.Name, "arguments": in}}},
		map[string]any{"content": "toolwire call " + ref.String() + ": done"},
	}})
	if err != nil {
		return nil, err
	}
	req := envelope.RunRequest{
		RunID: runID, Tenant: tenant,
		Agent: envelope.Agent{Name: callAgent, Model: envelope.Model{Provider: "scripted", Name: callAgent, Options: script},
			EnabledTools: []string{ref.String()}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "toolwire call " + ref.String()}},
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return &oneCall{ref: ref, callID: callID, req: req}, nil
}

// run submits the call's run and waits for its end, telling w about the
// steps in between; it returns the call's envelope.
func (c *oneCall) run(ctx context.Context, cl *client.Client, w io.Writer) (*envelope.ToolEnvelope, error) {
	if err := cl.Submit(ctx, c.req); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "call %s %s (run %s) requested\n", c.ref, c.callID[:12], c.req.RunID)
	final, err := cl.Follow(ctx, c.req.RunID, func(e client.Event) bool {
		p := e.Subject
		if p.Kind != "call" {
			return true
		}
		switch p.Verb {
		case events.VerbApproved:
			fmt.Fprintf(w, "  approved to queue %s\n", p.Queue)
		case events.VerbApprovalRequired:
			fmt.Fprintf(w, "  waiting for an operator's decision: toolwire approve %s %s (or deny, revise)\n", c.req.RunID, p.CallID)
		case events.VerbCompleted:
		default:
			fmt.Fprintf(w, "  %s\n", p.Verb)
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("no envelope for call %s of run %s: %w", c.callID, c.req.RunID, err)
	}
	if final.Outputs != nil {
		if env, ok := final.Outputs.ToolsByID[c.callID]; ok {
			return &env, nil
		}
	}
	err = fmt.Errorf("run %s %s without the call's envelope: %s", c.req.RunID, final.Status, final.Reason)
	if final.Status != events.StatusCompleted {
		return nil, withCode(exitRunFailed, err) // exit.go: the call's run was refused
	}
	return nil, err
}

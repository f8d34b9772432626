package main

import (
	"context"
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
}

func newRunCmd() *cobra.Command {
	var (
		natsURL string
		f       runFlags
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Submit a run request and follow it to its AgentOutputs",
		Long: `run publishes a run request (a JSON file, "-" for standard input, --demo, or
--prompt) to a running toolwire (NATS_URL, default the dev server's
nats://127.0.0.1:4223), shows each step as it happens and prints the final
AgentOutputs as JSON.

--provider and --model run the request on a real model: openai (the
orchestrator needs OPENAI_API_KEY, and OPENAI_BASE_URL for any other
OpenAI-compatible server such as vLLM or Ollama) or anthropic (it needs
ANTHROPIC_API_KEY). --prompt asks the demo agent (tools echo, calculator,
get_current_time) your own question.

  toolwire run --demo
  toolwire run --demo --provider openai --model gpt-4o-mini
  toolwire run --provider anthropic --model claude-haiku-4-5 --prompt "What is 17*23? Use a tool."
  toolwire run -f request.json --provider openai --model gpt-4.1-mini`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := buildRunRequest(f, cmd.InOrStdin(), time.Now())
			if err != nil {
				return err
			}
			var final *events.RunStatus
			if err := withJetStream(cmd.Context(), natsURL, timeout, func(ctx context.Context, js jetstream.JetStream) (err error) {
				c := client.New(js, "/toolwire/cli")
				if err := c.Submit(ctx, req); err != nil {
					return err
				}
				final, err = c.Follow(ctx, req.RunID, progressPrinter(cmd.ErrOrStderr()))
				return err
			}); err != nil {
				return err
			}
			if final.Spend > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "spend: %s\n", formatSpend(final.Spend))
			}
			if final.Status != events.StatusCompleted {
				return fmt.Errorf("run %s %s: %s", req.RunID, final.Status, final.Reason)
			}
			return printJSON(cmd.OutOrStdout(), final.Outputs)
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
		dec := json.NewDecoder(bytesReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return req, fmt.Errorf("%s: %w", f.file, err)
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

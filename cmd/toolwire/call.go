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
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service"
)

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
		Short: "Run one tool call outside any agent loop and print its ToolEnvelope",
		Long: `call sends a single tool call (a "tool node") to the workers of its tool's
queue (the registry's entry names it; "default", the executor's, when it names
none or the registry does not hold the tool) on a running toolwire (NATS_URL,
default the dev server's nats://127.0.0.1:4223) and prints the call's
ToolEnvelope as JSON: the same validation, lifecycle check (a blocked tool is
refused), rate limits, cache, timeouts, truncation and exactly-once writes as a
call of an agent run. The Policy Guard judges the calls of model turns; a call
made here has no agent policy to judge.

The call belongs to a run of its own, "call-<random hex>" (or --run-id), with
sequence number 1, for the tenant given by --org (default "default"),
--workspace and --user.

A call that fails is still an answer: its envelope (with error.code) is printed
and the exit status is 0, unless --fail-on-error is given (then 1). Bad
arguments, an unreachable NATS and no answer within --timeout exit 1 without an
envelope.`,
		Example: `  toolwire call calculator@1.0.0 --input '{"expression":"6*7"}'
  echo '{"text":"hi"}' | toolwire call echo@1.0.0 --input-file - --org acme --user u1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := buildCallRequest(args[0], input, inputFile, cmd.InOrStdin(), tenant, runID)
			if err != nil {
				return err
			}
			ctx, cancel := contextWithTimeout(cmd.Context(), timeout)
			defer cancel()
			nc, js, err := service.Connect(ctx, natsURL, "cli", discardLogger())
			if err != nil {
				return err
			}
			defer nc.Close()
			env, err := callTool(ctx, js, req, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			if err := enc.Encode(env); err != nil {
				return err
			}
			if failOnError && env.Error != nil {
				return fmt.Errorf("%w: %s: %s", errCallFailed, env.Error.Code, env.Error.Message)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	def := os.Getenv("NATS_URL")
	if def == "" {
		def = "nats://127.0.0.1:4223"
	}
	fl.StringVar(&natsURL, "nats", def, "NATS URL (default $NATS_URL, else the dev server)")
	fl.StringVar(&input, "input", "", "the tool's input as JSON")
	fl.StringVar(&inputFile, "input-file", "", `read the input from a file ("-" for standard input)`)
	fl.StringVar(&tenant.OrgID, "org", "default", "tenant organisation id")
	fl.StringVar(&tenant.WorkspaceID, "workspace", "", "tenant workspace id")
	fl.StringVar(&tenant.UserID, "user", "", "tenant user id")
	fl.StringVar(&runID, "run-id", "", `the call's run id (default "call-<random hex>")`)
	fl.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the envelope")
	fl.BoolVar(&failOnError, "fail-on-error", false, "exit 1 when the envelope holds an error")
	return cmd
}

// buildCallRequest checks the arguments and builds the call request.
func buildCallRequest(tool, input, inputFile string, stdin io.Reader, tenant envelope.Tenant, runID string) (events.CallRequest, error) {
	ref, err := envelope.ParseToolRef(tool)
	if err != nil {
		return events.CallRequest{}, err
	}
	var raw []byte
	switch {
	case input != "" && inputFile != "":
		return events.CallRequest{}, errors.New("give the input with --input or --input-file, not both")
	case inputFile == "-":
		raw, err = readAll(stdin)
	case inputFile != "":
		raw, err = os.ReadFile(inputFile)
	case input != "":
		raw = []byte(input)
	default:
		return events.CallRequest{}, errors.New("give the tool's input as JSON with --input (for example --input '{}')")
	}
	if err != nil {
		return events.CallRequest{}, fmt.Errorf("read input: %w", err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return events.CallRequest{}, fmt.Errorf("input is not valid JSON: %w", err)
	}
	if strings.TrimSpace(tenant.OrgID) == "" {
		return events.CallRequest{}, errors.New("--org must not be empty")
	}
	if runID == "" {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return events.CallRequest{}, err
		}
		runID = "call-" + hex.EncodeToString(b)
	}
	if err := events.ValidateRunID(runID); err != nil {
		return events.CallRequest{}, err
	}
	in := json.RawMessage(compact.Bytes())
	callID, err := envelope.CallID(ref.Name, ref.Version, in, 1)
	if err != nil {
		return events.CallRequest{}, fmt.Errorf("input: %w", err)
	}
	req := events.CallRequest{
		RunID: runID, CallID: callID, Seq: 1, Iteration: 1,
		Name: ref.Name, Version: ref.Version, Input: in,
		Tenant: tenant, Agent: callAgent, Queue: envelope.DefaultQueue, // callTool routes it
	}
	schemas, err := events.NewSchemas()
	if err != nil {
		return req, err
	}
	if err := schemas.ValidateValue(events.SchemaCallRequest, req); err != nil {
		return req, err
	}
	return req, nil
}

// callTool publishes the call, approved to its tool's queue, and waits for its
// completed event, telling w about the steps in between.
func callTool(ctx context.Context, js jetstream.JetStream, req events.CallRequest, w io.Writer) (*envelope.ToolEnvelope, error) {
	reg, err := registry.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	switch e, err := reg.Get(ctx, req.Ref()); {
	case err == nil:
		req.Queue = e.Definition.QueueName()
	case errors.Is(err, registry.ErrNotFound):
		// The default queue's executor answers: unknown tool.
	default:
		return nil, err
	}
	filter, err := events.CallEvents(req.RunID)
	if err != nil {
		return nil, err
	}
	cons, err := js.OrderedConsumer(ctx, events.StreamCalls, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", filter, err)
	}
	msgs := make(chan jetstream.Msg, 16)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", filter, err)
	}
	defer cc.Stop()

	out, err := events.NewCallApproved("/toolwire/cli", req, events.RunTraceFrom(ctx))
	if err != nil {
		return nil, err
	}
	if err := events.NewPublisher(js).Publish(ctx, out); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "call %s %s (run %s) requested on queue %s\n", req.Ref(), req.CallID[:12], req.RunID, req.Queue)
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no envelope for call %s of run %s: %w", req.CallID, req.RunID, context.Cause(ctx))
		case m := <-msgs:
			ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
			if err != nil {
				continue // not ours to judge
			}
			switch ev.Type() {
			case events.TypeCallCompleted:
				var env envelope.ToolEnvelope
				if err := events.DecodeData(ev, &env); err != nil {
					return nil, err
				}
				return &env, nil
			case events.TypeCallApproved: // ours
			default:
				p, err := events.ParseSubject(m.Subject())
				if err == nil {
					fmt.Fprintf(w, "  %s\n", p.Verb)
				}
			}
		}
	}
}

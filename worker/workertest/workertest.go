// Package workertest runs your worker tools inside the whole toolwire
// pipeline for a Go test: an embedded NATS server with JetStream, the
// orchestrator, the Policy Guard, the executor with the built-in tools, the
// sandbox, and your tools served by a worker, all in the test's process and
// stopped when the test ends. A scripted model plays the turns the test
// gives, so a test says which calls the model makes and asserts on what the
// run returns (AgentOutputs: every call's envelope):
//
//	func TestUpper(t *testing.T) {
//		env := workertest.Start(t, worker.Config{Queue: "text"}, upper)
//		res := env.Run(workertest.Calls(workertest.Call("upper", In{Text: "hi"})), workertest.Answer("done"))
//		got := res.Envelopes("upper")[0] // the envelope: output, error, timings, cost
//		if got.Error != nil || string(got.Output) != `{"text":"HI"}` { t.Fatalf(...) }
//	}
//
// Each Start is a pipeline of its own (its own server and data folder), so
// tests may run in parallel.
package workertest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
	"github.com/toolwire/toolwire/stack"
	"github.com/toolwire/toolwire/worker"
)

// EnvLog, set to 1, sends the pipeline's and the worker's logs to stderr.
const EnvLog = "TOOLWIRE_TEST_LOG"

// DefaultTimeout bounds each run: a run still going after it fails the test.
const DefaultTimeout = 60 * time.Second

// Options adjust Start.
type Options struct {
	// Stack configures the embedded pipeline; DataDir defaults to a
	// temporary folder of the test, Getenv to an empty environment (the
	// test does not depend on the shell's TOOLWIRE_* variables).
	Stack stack.Options
	// Timeout bounds each run; default DefaultTimeout.
	Timeout time.Duration
	// Enabled are tool references (name@version) every run enables besides
	// the worker's tools, such as a built-in: "echo@1.0.0".
	Enabled []string
	// Policy is every run's policy (caps, budget, approvals); the zero
	// value is the default policy.
	Policy envelope.Policy
}

// Env is a running pipeline with a worker serving the test's tools.
type Env struct {
	// Stack is the pipeline: its client, its JetStream, its services.
	Stack  *stack.Stack
	Worker *worker.Worker

	t       testing.TB
	opts    Options
	enabled []string
	runs    atomic.Int64
	secrets *secrets.Store
}

// The tenant of the runs of Run and Call.
const (
	OrgID       = "test-org"
	WorkspaceID = "test-ws"
	UserID      = "test-user"
)

// Start starts the pipeline and a worker serving tools with cfg, and stops
// both when the test ends. A problem (a tool's declaration, a conflict in the
// registry, the pipeline) fails the test at once.
func Start(t testing.TB, cfg worker.Config, tools ...*worker.Tool) *Env {
	t.Helper()
	return StartWith(t, Options{}, cfg, tools...)
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options, cfg worker.Config, tools ...*worker.Tool) *Env {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	if os.Getenv(EnvLog) == "1" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if o.Stack.DataDir == "" && o.Stack.NATSURL == "" {
		o.Stack.DataDir = t.TempDir()
	}
	if o.Stack.Getenv == nil {
		o.Stack.Getenv = func(string) string { return "" }
	}
	if o.Stack.Logger == nil {
		o.Stack.Logger = log
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if cfg.Getenv == nil {
		cfg.Getenv = o.Stack.Getenv
	}
	if cfg.Logger == nil {
		cfg.Logger = log.With("service", worker.Name)
	}
	// A master key of the test's own, given to every executor (which hands
	// the worker its tools' secrets with each call), so that SetSecret
	// works as `toolwire secrets set` does.
	keys, err := secrets.GenerateKey("test")
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	keyring, err := secrets.ParseKeyring(keys, "")
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	o.Stack.ExecutorOptions = append([]executor.Option{executor.WithKeyring(keyring)}, o.Stack.ExecutorOptions...)
	w := worker.New(cfg, tools...)
	defs, err := w.Definitions()
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	st, err := stack.Start(ctx, o.Stack)
	if err != nil {
		t.Fatalf("workertest: start the pipeline: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Stop(context.Background()); err != nil {
			t.Errorf("workertest: stop the pipeline: %v", err)
		}
	})
	if err := w.Start(ctx, st.JS); err != nil {
		t.Fatalf("workertest: start the worker: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Stop(context.Background()); err != nil {
			t.Errorf("workertest: stop the worker: %v", err)
		}
	})
	store, err := secrets.Open(ctx, st.JS, keyring)
	if err != nil {
		t.Fatalf("workertest: secrets: %v", err)
	}
	env := &Env{Stack: st, Worker: w, t: t, opts: o, secrets: store}
	for _, d := range defs {
		env.enabled = append(env.enabled, d.Ref().String())
	}
	env.enabled = append(env.enabled, o.Enabled...)
	return env
}

// Turn is one answer of the scripted model: tool calls (Calls) or the final
// answer (Answer).
type Turn = scripted.Turn

// ToolCall is a call the scripted model makes.
type ToolCall = scripted.ToolCall

// Call is a call of the tool name with input: a struct of the tool's input
// type, a map, or raw JSON (json.RawMessage or a string of JSON).
func Call(name string, input any) ToolCall {
	var raw json.RawMessage
	switch v := input.(type) {
	case json.RawMessage:
		raw = v
	case string:
		raw = json.RawMessage(v)
	default:
		b, err := json.Marshal(v)
		if err != nil {
			// Surfaces as the call's invalid arguments, which the run reports.
			b = []byte(fmt.Sprintf("%q", err.Error()))
		}
		raw = b
	}
	return ToolCall{Name: name, Arguments: raw}
}

// Calls is a turn in which the model calls these tools at once.
func Calls(calls ...ToolCall) Turn { return Turn{ToolCalls: calls} }

// Answer is the model's final answer.
func Answer(content string) Turn { return Turn{Content: content} }

// Result is the end of a run.
type Result struct {
	// Status is "completed" or "failed"; Reason says why a run failed.
	Status string
	Reason string
	// Outputs are the run's AgentOutputs: the response and every call's
	// envelope (ToolsByID, in ToolOrder).
	Outputs *envelope.AgentOutputs
}

// Envelopes returns the envelopes of the calls to the tool name, in the
// order the run made them; every envelope when name is "".
func (r *Result) Envelopes(name string) []envelope.ToolEnvelope {
	if r.Outputs == nil {
		return nil
	}
	var out []envelope.ToolEnvelope
	for _, id := range r.Outputs.ToolOrder {
		if e := r.Outputs.ToolsByID[id]; name == "" || e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// Run runs one agent run whose scripted model answers with turns, and
// returns its end; the test fails when the run does not end within the
// timeout.
func (e *Env) Run(turns ...Turn) *Result {
	e.t.Helper()
	opts, err := json.Marshal(scripted.Script{Turns: turns})
	if err != nil {
		e.t.Fatalf("workertest: script: %v", err)
	}
	name := strings.NewReplacer("/", "-", " ", "-").Replace(e.t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	req := envelope.RunRequest{
		RunID:  fmt.Sprintf("%s-%d", safeToken(name), e.runs.Add(1)),
		Tenant: envelope.Tenant{OrgID: OrgID, WorkspaceID: WorkspaceID, UserID: UserID},
		Agent: envelope.Agent{
			Name:         "workertest",
			Model:        envelope.Model{Provider: scripted.Name, Name: "workertest", Options: opts},
			EnabledTools: e.enabled,
			Policy:       e.opts.Policy,
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Run the test's script."}},
	}
	return e.RunRequest(req)
}

// RunRequest runs a run request of the test's own making (another model,
// tenant or policy) and returns its end.
func (e *Env) RunRequest(req envelope.RunRequest) *Result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Timeout)
	defer cancel()
	st, err := e.Stack.Client.Run(ctx, req, 0)
	if st == nil {
		e.t.Fatalf("workertest: run %s: %v", req.RunID, err)
	}
	res := &Result{Status: st.Status, Reason: st.Reason, Outputs: st.Outputs}
	if st.Status == events.StatusCompleted && st.Outputs == nil {
		e.t.Fatalf("workertest: run %s completed without outputs", req.RunID)
	}
	return res
}

// SetSecret stores a secret for the runs' workspace, as `toolwire secrets
// set` would: a tool that declares it gets value in Call.Secrets, and the
// value is scrubbed from everything the call leaves.
func (e *Env) SetSecret(name, value string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Timeout)
	defer cancel()
	if err := e.secrets.Set(ctx, secrets.WorkspaceScope(OrgID, WorkspaceID), name, []byte(value)); err != nil {
		e.t.Fatalf("workertest: set secret %s: %v", name, err)
	}
}

// Call runs one call of the tool name with input, in a run of its own, and
// returns its envelope.
func (e *Env) Call(name string, input any) envelope.ToolEnvelope {
	e.t.Helper()
	res := e.Run(Calls(Call(name, input)), Answer("done"))
	envs := res.Envelopes(name)
	if len(envs) != 1 {
		e.t.Fatalf("workertest: the run (%s %s) made %d calls to %s, want 1", res.Status, res.Reason, len(envs), name)
	}
	return envs[0]
}

// safeToken keeps the letters, digits, '-' and '_' of s: a run id is one
// subject token.
func safeToken(s string) string {
	b := []byte(s)
	out := b[:0]
	for _, c := range b {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return "run"
	}
	return string(out)
}

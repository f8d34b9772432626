// Package rerun re-runs a recorded agent run against this build's
// orchestrator and checks that it makes the same decisions.
//
// A replay runs in process, on its own embedded NATS in a temporary folder:
// the orchestrator of this build (the component under test), with the model
// replaced by the recorded responses (provider/replay.Provider, wrapped to
// check every model request against the recorded one), and the rest of the
// pipeline replaced by the recording: an answerer reads each model turn the
// orchestrator publishes and answers every call it asks for with its recorded
// envelope, as the Policy Guard and the tools did. The tool registry is
// seeded with the definitions as they were called. The replay submits the
// recorded run request, follows the run, and compares each step with the
// recording, in the recording's order:
//
//   - model turn n: the loop rules (which run in the orchestrator) give
//     iteration n the recorded verdict; the orchestrator offers the model the
//     same tools as the recorded turn n, and the conversation it sends holds
//     the result of every call of turn n-1 (by the model's call id, as an
//     error when the recorded envelope is one);
//   - tool call #s: the turn asks for the call with the recorded call_id (the
//     id hashes the tool, its version, its canonical input and its sequence
//     number, so the same id means the same call at the same place);
//   - the outcome: same status; same response, tool_order and envelopes.
//
// The first step that differs is the divergence; the replay stops there.
//
// Bundles are of version 2 (envelope.ReplayBundleVersion: turns without
// messages) or 1 (no version: recorded before contract v2, with the messages
// of every turn, which a replay ignores); a newer version is refused with both
// versions named.
//
// With Live, the calls of tools whose side_effects is none or reads are
// executed again by a real executor of this build (the answerer routes them
// to its queue as the Policy Guard would) and the report lists the outputs
// that changed; calls of writes tools, calls the Policy Guard denied, calls
// of tools on another queue than the executor's, and calls of tools the
// bundle has no definition for are never executed: they get their recorded
// envelopes. A live tool runs without the tenant's secrets (the replay has
// none), so a tool that needs one answers AUTH_REQUIRED: a changed output.
package rerun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/replay"
)

// Bundle is what a replay needs: the run's replay bundle, with its outcome
// and verdicts, as the recorder serves it (GET /v1/runs/{run_id}/replay).
type Bundle = envelope.ReplayBundle

// Source is the CloudEvents source of the events the replay's answerer
// publishes.
const Source = "/toolwire/replay"

// Defaults of Options.
const (
	DefaultStall = 30 * time.Second
	settleGrace  = time.Second
)

// OrchestratorFactory builds the orchestrator a replay tests.
type OrchestratorFactory func(d service.Deps, cfg orchestrator.Config) (service.Component, error)

// Options configure a replay. The zero value replays strictly.
type Options struct {
	// Live re-executes the calls of none and reads tools (see the package
	// documentation).
	Live bool
	// Orchestrator builds the orchestrator under test; default
	// orchestrator.New, this build's. Tests change its behaviour here.
	Orchestrator OrchestratorFactory
	// ExecutorOptions are given to the live executor (for example tools
	// compiled into the program running the replay).
	ExecutorOptions []executor.Option
	// DataDir holds the replay's NATS store; default a temporary folder,
	// removed at the end.
	DataDir string
	// Stall is how long the replay waits for the orchestrator's next step
	// before it reports where it stopped; default 30s.
	Stall time.Duration
	// Logger receives the replayed services' logs; default: discard.
	Logger *slog.Logger
}

// Step kinds.
const (
	StepModelTurn = "model_turn"
	StepToolCall  = "tool_call"
	StepOutcome   = "outcome"
)

// Step is one step of the recorded run, as the replay checked it.
type Step struct {
	N         int    `json:"n"` // 1-based, in recorded order
	Kind      string `json:"kind"`
	Iteration int    `json:"iteration,omitempty"`
	Seq       int    `json:"seq,omitempty"`
	CallID    string `json:"call_id,omitempty"`
	Tool      string `json:"tool,omitempty"` // name@version
	// Checked is set once the replay saw this step; OK when it matched.
	Checked bool `json:"checked"`
	OK      bool `json:"ok"`
	// Source says where a call's envelope came from in the replay: recorded
	// or live (executed again).
	Source string `json:"source,omitempty"`
}

// Title names a step for people: "model turn 2", "tool call #3 (iteration
// 2, web_search@1.2.0)", "outcome".
func (s Step) Title() string {
	switch s.Kind {
	case StepModelTurn:
		return fmt.Sprintf("model turn %d", s.Iteration)
	case StepToolCall:
		t := fmt.Sprintf("tool call #%d (iteration %d", s.Seq, s.Iteration)
		if s.Tool != "" {
			t += ", " + s.Tool
		}
		return t + ")"
	}
	return "outcome"
}

// Divergence is the first step at which the replayed run differs from the
// recording.
type Divergence struct {
	Step     Step   `json:"step"`
	What     string `json:"what"`     // what differs
	Recorded string `json:"recorded"` // the recording's side
	Replayed string `json:"replayed"` // this build's side
}

// Error describes the divergence.
func (d *Divergence) Error() string {
	return fmt.Sprintf("step %d, %s: %s\n  recorded: %s\n  replayed: %s", d.Step.N, d.Step.Title(), d.What, d.Recorded, d.Replayed)
}

// ChangedOutput is a call executed again with Live whose result differs from
// the recorded one.
type ChangedOutput struct {
	Seq      int             `json:"seq"`
	CallID   string          `json:"call_id"`
	Tool     string          `json:"tool"`
	Recorded json.RawMessage `json:"recorded"` // {"output": ...} or {"error": ...}
	Replayed json.RawMessage `json:"replayed"`
}

// Report is the result of a replay.
type Report struct {
	RunID string `json:"run_id"`
	Live  bool   `json:"live"`
	// Clean is true when every step matched.
	Clean      bool        `json:"clean"`
	Divergence *Divergence `json:"divergence,omitempty"`
	Steps      []Step      `json:"steps"`
	// Status is how the replayed run ended ("" when the replay stopped first).
	Status string `json:"status"`
	// Reexecuted lists the calls executed again (Live), by call id; Kept the
	// calls that got their recorded envelope although Live, and why.
	Reexecuted []string          `json:"reexecuted,omitempty"`
	Kept       map[string]string `json:"kept,omitempty"`
	Changed    []ChangedOutput   `json:"changed,omitempty"`
}

// ErrBundle is wrapped when a bundle cannot be replayed.
var ErrBundle = errors.New("replay bundle unusable")

// Run replays the bundle. The error is for what kept the replay from running
// (a bad bundle, the embedded NATS); a divergence is in the report.
func Run(ctx context.Context, b Bundle, o Options) (rep *Report, err error) {
	if err := check(b); err != nil {
		return nil, err
	}
	if o.Orchestrator == nil {
		o.Orchestrator = func(d service.Deps, cfg orchestrator.Config) (service.Component, error) {
			return orchestrator.New(d, cfg)
		}
	}
	if o.Stall <= 0 {
		o.Stall = DefaultStall
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dir := o.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "toolwire-replay-"); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	}
	srv, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "nats")})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer embedded.Stop(srv)
	nc, js, err := service.Connect(ctx, srv.ClientURL(), "replay", log)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer nc.Close()
	if err := provision.Provision(ctx, js, provision.StoreConfig{}); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defs, err := seedRegistry(ctx, js, b)
	if err != nil {
		return nil, err
	}

	e := newEngine(b, defs, o.Live, js)
	deps := func(name string) service.Deps {
		return service.Deps{
			Common: service.Common{Name: name, NATSURL: srv.ClientURL(), Replicas: 1},
			Conn:   nc, JS: js, Log: log.With("service", name), Tracer: noop.NewTracerProvider(),
			Metrics: prometheus.NewRegistry(), Getenv: func(string) string { return "" },
		}
	}
	var comps []service.Component
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for i := len(comps) - 1; i >= 0; i-- {
			if serr := comps[i].Stop(sctx); serr != nil {
				log.Warn("replay: stop", "err", serr)
			}
		}
	}()
	start := func(name string, c service.Component, err error) error {
		if err != nil {
			return fmt.Errorf("replay: %s: %w", name, err)
		}
		if err := c.Start(ctx); err != nil {
			return fmt.Errorf("replay: %s: %w", name, err)
		}
		comps = append(comps, c)
		return nil
	}
	if o.Live {
		ex, err := executor.New(deps("executor"), executor.Config{ID: "replay-executor"}.With(standard.WithConfig(standard.Config{})).With(o.ExecutorOptions...))
		if err := start("executor", ex, err); err != nil {
			return nil, err
		}
	}
	if err := start("answerer", e, nil); err != nil {
		return nil, err
	}
	rp, err := replay.New(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBundle, err)
	}
	orch, err := o.Orchestrator(deps("orchestrator"), orchestrator.Config{
		Providers: orchestrator.Providers{b.Request.Agent.Model.Provider: &checkingProvider{inner: rp, e: e}},
	})
	if err := start("orchestrator", orch, err); err != nil {
		return nil, err
	}

	if err := client.New(js, Source).Submit(ctx, b.Request); err != nil {
		return nil, fmt.Errorf("replay: submit the recorded request: %w", err)
	}
	e.wait(ctx, o.Stall)
	e.awaitEnvelopes(ctx, o.Stall)
	return e.report(), nil
}

// awaitEnvelopes waits, at most within, until onEnvelope has seen the
// envelope of every call executed again: the run's end can reach the
// answerer before the last of them, and a changed output is only known
// from its envelope.
func (e *engine) awaitEnvelopes(ctx context.Context, within time.Duration) {
	t := time.NewTimer(within)
	defer t.Stop()
	for {
		e.mu.Lock()
		missing := 0
		for _, id := range e.reexecuted {
			if !e.enveloped[id] {
				missing++
			}
		}
		e.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-e.progress:
		case <-ctx.Done():
			return
		case <-t.C:
			return
		}
	}
}

// ErrBundleVersion is wrapped (with ErrBundle) when a bundle is of a version
// this build does not read.
var ErrBundleVersion = errors.New("replay bundle version unknown")

// CheckVersion refuses a bundle of a version this build cannot read: newer
// than envelope.ReplayBundleVersion (recorded by a newer toolwire, whose
// bundles may hold what this build does not know), or below 1.
func CheckVersion(b Bundle) error {
	v := b.Version
	if v == 0 {
		v = 1 // recorded before bundles had a version
	}
	switch {
	case v > envelope.ReplayBundleVersion:
		return fmt.Errorf("%w: %w: the bundle of run %s is of version %d, newer than this build reads (versions 1 to %d): replay it with a newer toolwire",
			ErrBundle, ErrBundleVersion, b.RunID, v, envelope.ReplayBundleVersion)
	case v < 1:
		return fmt.Errorf("%w: %w: the bundle of run %s is of version %d; versions start at 1 (this build reads 1 to %d)",
			ErrBundle, ErrBundleVersion, b.RunID, v, envelope.ReplayBundleVersion)
	}
	return nil
}

// check refuses a bundle that cannot be replayed.
func check(b Bundle) error {
	if err := CheckVersion(b); err != nil {
		return err // a version this build does not know: nothing else can be judged
	}
	var problems []string
	if b.RunID == "" || b.Request.RunID != b.RunID {
		problems = append(problems, fmt.Sprintf("run_id %q and request.run_id %q must be the same run", b.RunID, b.Request.RunID))
	}
	if err := b.Request.Validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if len(b.Turns) == 0 {
		problems = append(problems, "it holds no model turn: the run made no model call, there is nothing to replay")
	}
	for i, t := range b.Turns {
		if t.Iteration != i+1 {
			problems = append(problems, fmt.Sprintf("turns[%d] is iteration %d; want the turns of iterations 1, 2, ... in order", i, t.Iteration))
			break
		}
	}
	if b.Status == "" {
		problems = append(problems, "it does not say how the run ended (status)")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrBundle, strings.Join(problems, "; "))
	}
	return nil
}

// seedRegistry puts the tool definitions as called into the replay's
// registry, and a stand-in for every enabled tool the bundle has no definition
// of (a writes tool: never executed), so that the orchestrator accepts the
// request as it did. It returns the definitions by name@version.
func seedRegistry(ctx context.Context, js jetstream.JetStream, b Bundle) (map[string]envelope.ToolDefinition, error) {
	reg, err := registry.Open(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defs := map[string]envelope.ToolDefinition{}
	for _, d := range b.Tools {
		defs[d.Ref().String()] = d
	}
	refs, err := b.Request.Agent.EnabledRefs()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBundle, err)
	}
	for _, ref := range refs {
		if _, ok := defs[ref.String()]; ok {
			continue
		}
		defs[ref.String()] = standIn(ref, "the bundle has no definition of this tool")
	}
	names := make([]string, 0, len(defs))
	for n := range defs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		err := reg.Put(ctx, registry.Entry{Definition: defs[n], State: registry.StateActive})
		if errors.Is(err, envelope.ErrInvalidTool) {
			// Recorded by a build whose definitions this one no longer accepts:
			// the orchestrator still needs the tool to exist; it is never run.
			old := defs[n]
			d := standIn(old.Ref(), "the recorded definition is not valid for this build: "+err.Error())
			defs[n] = d
			err = reg.Put(ctx, registry.Entry{Definition: d, State: registry.StateActive})
		}
		if err != nil {
			return nil, fmt.Errorf("replay: seed registry with %s: %w", n, err)
		}
	}
	return defs, nil
}

// standIn is the registry entry of a tool the replay cannot run: a writes
// tool (never executed again), with why in its description.
func standIn(ref envelope.ToolRef, why string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: ref.Name, Version: ref.Version, Description: standInPrefix + why,
		InputSchema:    json.RawMessage(`{}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone},
		Implementation: toolapi.BuiltinImplementation("replay-stand-in"),
	}
}

const standInPrefix = "stand-in: "

// checkingProvider checks each model request against the recorded turn, then
// answers with the recorded response.
type checkingProvider struct {
	inner *replay.Provider
	e     *engine
}

func (p *checkingProvider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	p.e.onModelRequest(req)
	return p.inner.Complete(ctx, req)
}

// engine compares what the orchestrator does with the recording and plays
// the recorded answers.
type engine struct {
	b    Bundle
	defs map[string]envelope.ToolDefinition
	live bool
	js   jetstream.JetStream
	pub  *publish.Publisher

	recorded map[string]envelope.ToolEnvelope // by call id
	verdicts map[int]envelope.IterationVerdict
	// callsOf are the recorded calls each turn's response asked for, in
	// order: what the next turn's conversation must answer.
	callsOf map[int][]Step

	mu         sync.Mutex
	steps      []Step
	turnStep   map[int]int // iteration -> index of its model_turn step
	callStep   map[int]int // seq -> index of its tool_call step
	idStep     map[string]int
	firstSeq   map[int]int // iteration -> first seq of its calls
	divs       []*Divergence
	outcome    *events.RunStatus
	requested  map[string]requestedCall // the calls the answerer answered, by id
	answered   map[string]bool          // the calls of the replayed turns, answered or not
	reexecuted []string
	// enveloped are the calls executed again whose envelope onEnvelope has
	// seen (they arrive on the calls stream, the run's end on the runs
	// stream: either may come first).
	enveloped map[string]bool
	kept      map[string]string
	changed   []ChangedOutput
	progress  chan struct{}
	done      chan struct{}
	doneOnce  sync.Once
	runners   []*consume.Runner
}

func newEngine(b Bundle, defs map[string]envelope.ToolDefinition, live bool, js jetstream.JetStream) *engine {
	e := &engine{
		b: b, defs: defs, live: live, js: js, pub: publish.NewPublisher(js),
		recorded: map[string]envelope.ToolEnvelope{}, verdicts: map[int]envelope.IterationVerdict{},
		turnStep: map[int]int{}, callStep: map[int]int{}, idStep: map[string]int{}, firstSeq: map[int]int{},
		requested: map[string]requestedCall{}, answered: map[string]bool{}, kept: map[string]string{},
		callsOf:  map[int][]Step{},
		progress: make(chan struct{}, 1), done: make(chan struct{}),
	}
	for _, env := range b.Envelopes {
		e.recorded[env.CallID] = env
	}
	for _, v := range b.Verdicts {
		e.verdicts[v.Iteration] = v
	}
	e.steps = expectedSteps(b)
	for i, s := range e.steps {
		switch s.Kind {
		case StepModelTurn:
			e.turnStep[s.Iteration] = i
		case StepToolCall:
			e.callStep[s.Seq] = i
			e.callsOf[s.Iteration] = append(e.callsOf[s.Iteration], s)
			if s.CallID != "" {
				e.idStep[s.CallID] = i
			}
			if _, ok := e.firstSeq[s.Iteration]; !ok {
				e.firstSeq[s.Iteration] = s.Seq
			}
		}
	}
	return e
}

// recordedOrder is the recorded call ids in call order: the outputs'
// tool_order for a completed run, else the envelopes in the recorder's call
// order.
func recordedOrder(b Bundle) []string {
	if b.Outputs != nil && len(b.Outputs.ToolOrder) > 0 {
		return b.Outputs.ToolOrder
	}
	ids := make([]string, 0, len(b.Envelopes))
	for _, env := range b.Envelopes {
		ids = append(ids, env.CallID)
	}
	return ids
}

// expectedSteps lists the recorded run's steps: each model turn, then the
// calls its response asked for (numbered on through the run, as the
// orchestrator numbers them), then the outcome.
func expectedSteps(b Bundle) []Step {
	order := recordedOrder(b)
	byID := map[string]envelope.ToolEnvelope{}
	for _, env := range b.Envelopes {
		byID[env.CallID] = env
	}
	var steps []Step
	seq := 0
	for _, t := range b.Turns {
		steps = append(steps, Step{Kind: StepModelTurn, Iteration: t.Iteration})
		for _, tc := range t.Response.ToolCalls {
			seq++
			s := Step{Kind: StepToolCall, Iteration: t.Iteration, Seq: seq, Tool: tc.Name}
			if seq <= len(order) {
				s.CallID = order[seq-1]
				if env, ok := byID[s.CallID]; ok {
					s.Tool = env.Name
					if env.Version != "" {
						s.Tool += "@" + env.Version
					}
				}
			}
			steps = append(steps, s)
		}
	}
	steps = append(steps, Step{Kind: StepOutcome})
	for i := range steps {
		steps[i].N = i + 1
	}
	return steps
}

func (e *engine) touch() {
	select {
	case e.progress <- struct{}{}:
	default:
	}
}

func (e *engine) finish() { e.doneOnce.Do(func() { close(e.done) }) }

// diverge records a divergence at step index i (or a new step) and ends the
// replay once the turn it belongs to had a moment to show all its calls.
func (e *engine) diverge(i int, extra *Step, what, recorded, replayed string) {
	var st Step
	if extra != nil {
		st = *extra
	} else {
		e.steps[i].Checked, e.steps[i].OK = true, false
		st = e.steps[i]
	}
	e.divs = append(e.divs, &Divergence{Step: st, What: what, Recorded: recorded, Replayed: replayed})
	if len(e.divs) == 1 {
		time.AfterFunc(settleGrace, e.finish)
	}
	e.touch()
}

func (e *engine) ok(i int, source string) {
	e.steps[i].Checked, e.steps[i].OK = true, true
	if source != "" {
		e.steps[i].Source = source
	}
	e.touch()
}

// onModelRequest checks a model request against the recorded turn: the
// tools offered, and the results of the previous turn's calls.
func (e *engine) onModelRequest(req provider.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i, ok := e.turnStep[req.Iteration]
	if !ok {
		last := e.b.Turns[len(e.b.Turns)-1].Iteration
		extra := Step{N: len(e.steps), Kind: StepModelTurn, Iteration: req.Iteration}
		e.diverge(0, &extra, "the orchestrator calls the model once more",
			fmt.Sprintf("the run's last model call was at iteration %d", last),
			fmt.Sprintf("a model call at iteration %d", req.Iteration))
		return
	}
	turn := e.b.Turns[req.Iteration-1]
	offered := make([]string, 0, len(req.Tools))
	for _, d := range req.Tools {
		offered = append(offered, d.Ref().String())
	}
	if !slices.Equal(offered, turn.Tools) {
		e.diverge(i, nil, "the tools offered to the model differ", strings.Join(turn.Tools, ", "), strings.Join(offered, ", "))
		return
	}
	if req.Iteration > 1 {
		if what, rec, rep := e.missingResult(req.Iteration-1, req.Messages); what != "" {
			e.diverge(i, nil, what, rec, rep)
			return
		}
	}
	e.ok(i, "")
}

// missingResult checks that the conversation sent to the model answers every
// call of recorded turn n: a tool message with the model's id of the call,
// an error when the recorded envelope is one (with Live, whatever the tool
// answered again). It returns what is wrong, or "".
func (e *engine) missingResult(n int, sent []envelope.Message) (what, recorded, replayed string) {
	results := map[string]envelope.Message{}
	for _, m := range sent {
		if m.Role == envelope.RoleTool && m.ToolCallID != "" {
			results[m.ToolCallID] = m
		}
	}
	asked := e.b.Turns[n-1].Response.ToolCalls
	for k, s := range e.callsOf[n] {
		if k >= len(asked) || asked[k].ID == "" {
			continue // the model gave the call no id to answer it by
		}
		m, ok := results[asked[k].ID]
		env, haveEnv := e.recorded[s.CallID]
		rec := fmt.Sprintf("a tool message for %s (the model's call id %s)", s.Title(), asked[k].ID)
		switch {
		case !ok:
			return fmt.Sprintf("the conversation sent to the model lacks the result of %s", s.Title()), rec,
				fmt.Sprintf("%d messages, results of the model's calls %s", len(sent), strings.Join(slices.Sorted(maps.Keys(results)), ", "))
		case haveEnv && !e.live && m.IsError != (env.Error != nil):
			return fmt.Sprintf("the result of %s is sent to the model as %s", s.Title(), errorOrNot(m.IsError)),
				errorOrNot(env.Error != nil) + ": " + truncate(string(resultJSON(env)), 300), truncate(m.Content, 300)
		}
	}
	return "", "", ""
}

func errorOrNot(isError bool) string {
	if isError {
		return "an error"
	}
	return "a success"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// wait blocks until the run ends, the replay diverges, nothing happens for
// stall, or ctx ends.
func (e *engine) wait(ctx context.Context, stall time.Duration) {
	t := time.NewTimer(stall)
	defer t.Stop()
	for {
		select {
		case <-e.done:
			return
		case <-ctx.Done():
			e.mu.Lock()
			e.stopped("the replay was cancelled (" + ctx.Err().Error() + ")")
			e.mu.Unlock()
			return
		case <-e.progress:
			if !t.Stop() {
				<-t.C
			}
			t.Reset(stall)
		case <-t.C:
			e.mu.Lock()
			e.stopped(fmt.Sprintf("the orchestrator took no step for %s", stall))
			e.mu.Unlock()
			return
		}
	}
}

// stopped records, when nothing diverged yet, that the replay stopped before
// the step it was waiting for.
func (e *engine) stopped(why string) {
	if len(e.divs) > 0 || e.outcome != nil {
		return
	}
	for i, s := range e.steps {
		if !s.Checked {
			e.diverge(i, nil, "the replayed run stopped before this step: "+why, "this step", "nothing")
			return
		}
	}
}

func (e *engine) report() *Report {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := &Report{RunID: e.b.RunID, Live: e.live, Steps: slices.Clone(e.steps), Reexecuted: e.reexecuted,
		Changed: e.changed}
	if len(e.kept) > 0 {
		r.Kept = e.kept
	}
	if e.outcome != nil {
		r.Status = e.outcome.Status
	}
	if len(e.divs) > 0 {
		first := e.divs[0]
		for _, d := range e.divs[1:] {
			if d.Step.N < first.Step.N || (d.Step.N == first.Step.N && d.Step.Seq < first.Step.Seq) {
				first = d
			}
		}
		r.Divergence = first
	}
	r.Clean = r.Divergence == nil
	sort.Slice(r.Changed, func(i, j int) bool { return r.Changed[i].Seq < r.Changed[j].Seq })
	return r
}

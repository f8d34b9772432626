package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/events/service"
)

// Service is the orchestrator.
type Service struct {
	cfg     Config
	d       service.Deps
	log     *slog.Logger
	tracer  trace.Tracer
	pub     *events.Publisher
	schemas *envelope.Schemas
	states  stateStore
	catalog *registry.Catalog
	runners []*events.Runner
	metrics metrics
	stop    sync.Once
}

type metrics struct {
	runs       *prometheus.CounterVec
	modelCalls *prometheus.CounterVec
	modelDur   prometheus.Histogram
}

// New builds the orchestrator.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if cfg.TracesURLTemplate == "" {
		cfg.TracesURLTemplate = d.Common.TracesURLTemplate
	}
	schemas, err := events.NewSchemas()
	if err != nil {
		return nil, err
	}
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Service{cfg: cfg, d: d, log: log, pub: events.NewPublisher(d.JS), schemas: schemas}
	if d.Tracer != nil {
		s.tracer = d.Tracer.Tracer("toolwire/orchestrator")
	} else {
		s.tracer = trace.NewNoopTracerProvider().Tracer("toolwire/orchestrator")
	}
	s.metrics = metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolwire_orchestrator_runs_total", Help: "Runs by final status.",
		}, []string{"status"}),
		modelCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolwire_orchestrator_model_calls_total", Help: "Model calls by provider and outcome.",
		}, []string{"provider", "outcome"}),
		modelDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "toolwire_orchestrator_model_call_seconds", Help: "Model call latency.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}),
	}
	if d.Metrics != nil {
		for _, c := range []prometheus.Collector{s.metrics.runs, s.metrics.modelCalls, s.metrics.modelDur} {
			if err := d.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Start opens the state bucket and the registry and starts consuming.
func (s *Service) Start(ctx context.Context) error {
	kv, err := s.d.JS.KeyValue(ctx, events.BucketRunState)
	if err != nil {
		return fmt.Errorf("open run state: %w", err)
	}
	s.states = stateStore{kv: kv}
	reg, err := registry.Open(ctx, s.d.JS)
	if err != nil {
		return err
	}
	if s.catalog, err = reg.Watch(ctx); err != nil {
		return err
	}
	specs := []events.RunnerConfig{
		{Spec: events.ConsumerSpec{Stream: events.StreamRuns, Durable: "orchestrator-runs",
			Filters:       []string{"toolwire.run.*.requested", "toolwire.run.*.iteration.*.approved", "toolwire.run.*.iteration.*.denied"},
			MaxAckPending: 4096, AckWait: s.cfg.ModelTimeout + 30*time.Second}, Handler: s.handleRun},
		{Spec: events.ConsumerSpec{Stream: events.StreamCalls, Durable: "orchestrator-calls",
			Filters: []string{"toolwire.call.*.*.completed"}, MaxAckPending: 4096}, Handler: s.handleCallCompleted},
	}
	for _, rc := range specs {
		rc.Concurrency, rc.Logger = s.cfg.Concurrency, s.log
		r, err := events.NewRunner(s.d.JS, rc)
		if err != nil {
			return err
		}
		if err := r.Start(ctx); err != nil {
			_ = s.Stop(ctx)
			return err
		}
		s.runners = append(s.runners, r)
	}
	return nil
}

// Stop drains the consumers and stops the registry watch. It is idempotent.
func (s *Service) Stop(ctx context.Context) error {
	var err error
	s.stop.Do(func() {
		for _, r := range s.runners {
			err = errors.Join(err, r.Stop(ctx))
		}
		if s.catalog != nil {
			s.catalog.Stop()
		}
	})
	return err
}

func (s *Service) handleRun(ctx context.Context, d *events.Delivery) error {
	switch d.Event.Type() {
	case events.TypeRunRequested:
		return s.onRunRequested(ctx, d)
	case events.TypeIterationApproved, events.TypeIterationDenied:
		return s.onVerdict(ctx, d)
	}
	return events.Permanent(fmt.Errorf("orchestrator: unexpected event type %q on %s", d.Event.Type(), d.Subject))
}

// onRunRequested validates a run request and starts the run.
func (s *Service) onRunRequested(ctx context.Context, d *events.Delivery) error {
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return events.Permanent(err)
	}
	var req envelope.RunRequest
	reject := func(reason string) error {
		s.log.Warn("run request rejected", "run_id", subj.RunID, "reason", reason)
		return s.failUnstarted(ctx, subj.RunID, req, reason)
	}
	if err := s.schemas.Validate(envelope.SchemaRunRequest, d.Event.Data()); err != nil {
		return reject("invalid run request: " + err.Error())
	}
	if err := events.DecodeData(d.Event, &req); err != nil {
		return reject("invalid run request: " + err.Error())
	}
	if req.RunID != subj.RunID {
		return reject(fmt.Sprintf("invalid run request: run_id %q does not match the subject's %q", req.RunID, subj.RunID))
	}
	if err := req.Validate(); err != nil {
		return reject(err.Error())
	}
	if _, err := s.cfg.Providers.Get(req.Agent.Model.Provider); err != nil {
		return reject("invalid run request: agent.model.provider: " + err.Error())
	}
	if req.Agent.Model.Provider == ScriptedProviderName {
		if _, err := ParseScript(req.Agent.Model.Options); err != nil {
			return reject("invalid run request: " + err.Error())
		}
	}
	var warnings, problems []string
	for _, ref := range mustRefs(req.Agent) {
		e, ok := s.catalog.Lookup(ref)
		switch {
		case !ok:
			problems = append(problems, "unknown tool "+ref.String())
		case e.State == registry.StateBlocked:
			problems = append(problems, "tool "+ref.String()+" is blocked")
		case e.State == registry.StateDeprecated:
			warnings = append(warnings, "tool "+ref.String()+" is deprecated")
		}
	}
	if len(problems) > 0 {
		return reject("invalid run request: agent.enabled_tools: " + strings.Join(problems, "; "))
	}

	// The run's trace starts here: invoke_agent is the parent of every span of
	// the run, carried by its events in the distributed-tracing extension.
	ctx, span := s.tracer.Start(ctx, "invoke_agent "+req.Agent.Name, trace.WithAttributes(
		attribute.String("gen_ai.operation.name", "invoke_agent"),
		attribute.String("gen_ai.agent.name", req.Agent.Name),
		attribute.String("gen_ai.request.model", req.Agent.Model.Name),
		attribute.String("toolwire.run_id", req.RunID),
	))
	defer span.End()

	st := &RunState{
		RunID: req.RunID, Request: req, Phase: PhaseAwaitingVerdict, Iteration: 1,
		Trace: events.RunTraceFrom(ctx), Warnings: warnings, StartedAt: time.Now().UTC(),
	}
	if req.Agent.SystemPrompt != "" {
		st.Messages = append(st.Messages, envelope.Message{Role: envelope.RoleSystem, Content: req.Agent.SystemPrompt})
	}
	st.Messages = append(st.Messages, req.Messages...)
	if _, err := s.states.create(ctx, st); err != nil {
		if !errors.Is(err, errStateExists) {
			return err
		}
		// Redelivered: the run exists. Publish what its state implies.
		existing, _, err := s.states.get(ctx, req.RunID)
		if err != nil || existing == nil {
			return fmt.Errorf("reload run %s: %w", req.RunID, err)
		}
		st = existing
	}
	return s.publishEffects(ctx, st)
}

func mustRefs(a envelope.Agent) []envelope.ToolRef {
	refs, _ := a.EnabledRefs() // validated before
	return refs
}

// failUnstarted reports a rejected run request as a failed run when its run id
// is safe; an unsafe id cannot name a subject and goes to the dead letters.
func (s *Service) failUnstarted(ctx context.Context, runID string, req envelope.RunRequest, reason string) error {
	if events.ValidateRunID(runID) != nil {
		return events.Permanent(errors.New(reason))
	}
	if existing, _, err := s.states.get(ctx, runID); err != nil {
		return err
	} else if existing != nil {
		// Never let a bad request fail a run that already exists under its id.
		return events.Permanent(fmt.Errorf("run %s exists; ignoring a second, invalid request: %s", runID, reason))
	}
	out, err := events.NewRunStatus(s.cfg.Source, events.RunStatus{
		RunID: runID, Status: events.StatusFailed, Agent: req.Agent.Name, Tenant: req.Tenant, Reason: reason,
	}, "", events.RunTrace{})
	if err != nil {
		return events.Permanent(err)
	}
	s.metrics.runs.WithLabelValues("rejected").Inc()
	return s.pub.Publish(ctx, out)
}

// onVerdict handles the policy's answer for an iteration: on approval it calls
// the model and records its turn, then publishes the turn's effects.
func (s *Service) onVerdict(ctx context.Context, d *events.Delivery) error {
	var v events.Verdict
	if err := events.DecodeData(d.Event, &v); err != nil {
		return events.Permanent(err)
	}
	st, _, err := s.states.get(ctx, v.RunID)
	if err != nil {
		return err
	}
	if st == nil {
		return events.Permanent(fmt.Errorf("verdict for unknown run %s", v.RunID))
	}
	if st.Done() || st.Iteration != v.Iteration || st.Phase != PhaseAwaitingVerdict {
		// Already handled (a redelivery): make sure its effects are out.
		return s.publishEffects(ctx, st)
	}
	if !v.Allowed {
		st, err = s.states.update(ctx, v.RunID, func(st *RunState) (bool, error) {
			if st.Phase != PhaseAwaitingVerdict || st.Iteration != v.Iteration {
				return false, nil
			}
			st.Phase, st.Reason = PhaseFailed, "policy denied iteration "+strconv.Itoa(v.Iteration)+": "+v.Reason
			return true, nil
		})
		if err != nil {
			return err
		}
		return s.publishEffects(ctx, st)
	}

	turn, err := s.callModel(ctx, st)
	if err != nil {
		// A model failure ends the run with a clear reason; retries inside the
		// adapter already happened.
		st, uerr := s.states.update(ctx, v.RunID, func(st *RunState) (bool, error) {
			if st.Phase != PhaseAwaitingVerdict || st.Iteration != v.Iteration {
				return false, nil
			}
			st.Phase, st.Reason = PhaseFailed, "model call failed: "+err.Error()
			return true, nil
		})
		if uerr != nil {
			return uerr
		}
		return s.publishEffects(ctx, st)
	}
	st, err = s.states.update(ctx, v.RunID, func(st *RunState) (bool, error) {
		if st.Phase != PhaseAwaitingVerdict || st.Iteration != v.Iteration || st.turn(v.Iteration) != nil {
			return false, nil // another delivery recorded this turn first
		}
		return true, s.applyTurn(st, turn)
	})
	if err != nil {
		return err
	}
	return s.publishEffects(ctx, st)
}

func (s *Service) callModel(ctx context.Context, st *RunState) (envelope.ModelTurn, error) {
	req := st.Request
	prov, err := s.cfg.Providers.Get(req.Agent.Model.Provider)
	if err != nil {
		return envelope.ModelTurn{}, err
	}
	tools := make([]envelope.ToolDefinition, 0, len(req.Agent.EnabledTools))
	names := make([]string, 0, len(req.Agent.EnabledTools))
	for _, ref := range mustRefs(req.Agent) {
		if e, ok := s.catalog.Lookup(ref); ok && e.State != registry.StateBlocked {
			tools = append(tools, e.Definition)
			names = append(names, ref.String())
		}
	}
	ctx, span := s.tracer.Start(ctx, "chat "+req.Agent.Model.Name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			attribute.String("gen_ai.provider.name", req.Agent.Model.Provider),
			attribute.String("gen_ai.request.model", req.Agent.Model.Name),
			attribute.String("toolwire.run_id", st.RunID),
			attribute.Int("toolwire.iteration", st.Iteration),
		))
	defer span.End()
	mctx, cancel := context.WithTimeout(ctx, s.cfg.ModelTimeout)
	defer cancel()
	start := time.Now()
	resp, err := prov.Complete(mctx, ModelRequest{
		RunID: st.RunID, Iteration: st.Iteration, Model: req.Agent.Model, System: req.Agent.SystemPrompt,
		Messages: st.Messages, Tools: tools,
	})
	end := time.Now()
	s.metrics.modelDur.Observe(end.Sub(start).Seconds())
	if err != nil {
		s.metrics.modelCalls.WithLabelValues(req.Agent.Model.Provider, "error").Inc()
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.String("error.type", fmt.Sprintf("%T", err)))
		return envelope.ModelTurn{}, err
	}
	s.metrics.modelCalls.WithLabelValues(req.Agent.Model.Provider, "ok").Inc()
	span.SetAttributes(
		attribute.Int("gen_ai.usage.input_tokens", resp.Usage.InputTokens),
		attribute.Int("gen_ai.usage.output_tokens", resp.Usage.OutputTokens),
		attribute.StringSlice("gen_ai.response.finish_reasons", []string{resp.StopReason}),
	)
	return envelope.ModelTurn{
		Iteration: st.Iteration, Model: req.Agent.Model, Messages: append([]envelope.Message(nil), st.Messages...),
		Tools: names, Response: resp, TStart: start.UTC(), TEnd: end.UTC(),
	}, nil
}

// applyTurn records the model's turn in the state: its tool calls get their
// sequence numbers and deterministic call ids; a turn without tool calls ends
// the run.
func (s *Service) applyTurn(st *RunState, turn envelope.ModelTurn) error {
	st.Turns = append(st.Turns, turn)
	resp := turn.Response
	st.Messages = append(st.Messages, envelope.Message{Role: envelope.RoleAssistant, Content: resp.Content, ToolCalls: resp.ToolCalls})
	if len(resp.ToolCalls) == 0 {
		st.Response = resp.Content
		s.finish(st)
		return nil
	}
	versions := map[string]string{}
	for _, ref := range mustRefs(st.Request.Agent) {
		versions[ref.Name] = ref.Version
	}
	seq := len(st.Calls)
	for _, tc := range resp.ToolCalls {
		seq++
		input := tc.Arguments
		if len(input) == 0 {
			input = json.RawMessage(`{}`)
		}
		if !json.Valid(input) {
			// The model wrote broken JSON: keep it, as a JSON string, so that the
			// tool's schema rejects it and the model sees why.
			b, _ := json.Marshal(string(input))
			input = b
		}
		name, valid := toolName(tc.Name)
		version := versions[name]
		if !valid {
			version = ""
		}
		id, err := envelope.CallID(name, version, input, seq)
		if err != nil {
			return fmt.Errorf("call id: %w", err)
		}
		c := CallState{
			Seq: seq, Iteration: st.Iteration, CallID: id, Name: name, Version: version,
			ProviderCallID: tc.ID, Input: input,
		}
		if !valid {
			// No tool can have this name: answer the call here, as the guard
			// would, so that the model sees why and the receipt stays valid.
			now := time.Now().UTC()
			c.Local = true
			c.Envelope = &envelope.ToolEnvelope{
				CallID: id, Name: name, Input: input, TStart: now, TEnd: now,
				Error: envelope.NewToolError(envelope.CodePolicyDenied,
					"the model called %q, which is not a valid tool name (letters, digits, '_' or '-', at most 64)", truncateName(tc.Name)),
			}
		}
		st.Calls = append(st.Calls, c)
	}
	st.Phase = PhaseAwaitingTools
	advanceIfTurnDone(st)
	return nil
}

var validToolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// toolName returns the name to record for a model's tool call, and whether it
// is a valid tool name; an invalid one is made safe for the receipt.
func toolName(raw string) (string, bool) {
	if validToolName.MatchString(raw) {
		return raw, true
	}
	b := []byte(truncateName(raw))
	for i, c := range b {
		if !(c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "invalid_tool_name", false
	}
	return string(b), false
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// advanceIfTurnDone moves the run to its next iteration once every call of
// the current turn has its envelope: the results join the conversation in the
// order the model made the calls.
func advanceIfTurnDone(st *RunState) {
	if st.Phase != PhaseAwaitingTools {
		return
	}
	calls := st.callsOf(st.Iteration)
	for _, c := range calls {
		if c.Envelope == nil {
			return
		}
	}
	for _, c := range calls {
		st.Messages = append(st.Messages, envelope.Message{
			Role: envelope.RoleTool, ToolCallID: c.ProviderCallID, Name: c.Name, Content: ToolResultContent(c.Envelope),
		})
	}
	st.Iteration++
	st.Phase = PhaseAwaitingVerdict
}

// finish computes the run's outputs and pinned handles.
func (s *Service) finish(st *RunState) {
	out := envelope.NewAgentOutputs(st.Response, st.envelopes(), events.TracesURL(s.cfg.TracesURLTemplate, st.Trace.TraceID()))
	st.Outputs = &out
	pinned, err := envelope.ResolvePins(out, st.Request.Agent.PinnedHandles)
	st.Pinned = pinned
	if err != nil {
		st.Phase, st.Reason = PhaseFailed, err.Error()
		return
	}
	st.Phase = PhaseCompleted
}

// handleCallCompleted stores a call's envelope; when the turn's last envelope
// arrives, the results go into the conversation and the next iteration is
// requested.
func (s *Service) handleCallCompleted(ctx context.Context, d *events.Delivery) error {
	subj, err := events.ParseSubject(d.Subject)
	if err != nil {
		return events.Permanent(err)
	}
	var env envelope.ToolEnvelope
	if err := events.DecodeData(d.Event, &env); err != nil {
		return events.Permanent(err)
	}
	if env.CallID != subj.CallID {
		return events.Permanent(fmt.Errorf("envelope call_id %s does not match subject %s", env.CallID, d.Subject))
	}
	st, err := s.states.update(ctx, subj.RunID, func(st *RunState) (bool, error) {
		c := st.call(env.CallID)
		if c == nil {
			return false, events.Permanent(fmt.Errorf("run %s has no call %s", subj.RunID, env.CallID))
		}
		if c.Envelope != nil || st.Done() {
			return false, nil // a duplicate
		}
		e := env
		c.Envelope = &e
		if c.Iteration == st.Iteration {
			advanceIfTurnDone(st)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	return s.publishEffects(ctx, st)
}

// ToolResultContent is what the model sees of an envelope: the output JSON, or
// for a failure the error's code, message and retry hint (never its details
// when the code is UNKNOWN: internals stay in the logs).
func ToolResultContent(env *envelope.ToolEnvelope) string {
	if env.Error == nil {
		if len(env.Output) == 0 {
			return "null"
		}
		return string(env.Output)
	}
	e := map[string]any{"code": env.Error.Code, "message": env.Error.Message}
	if env.Error.RetryAfterS > 0 {
		e["retry_after_s"] = env.Error.RetryAfterS
	}
	if env.Error.Details != nil && env.Error.Code != envelope.CodeUnknown {
		e["details"] = env.Error.Details
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return string(b)
}

// publishEffects publishes every event the state implies. All ids are
// deterministic, so publishing again after a crash or a redelivery only
// produces duplicates that JetStream drops.
func (s *Service) publishEffects(ctx context.Context, st *RunState) error {
	tr := st.Trace
	ctx = events.ContextWithRunTrace(ctx, tr)
	req := st.Request
	var outs []events.Outgoing
	add := func(o events.Outgoing, err error) error {
		if err != nil {
			return err
		}
		outs = append(outs, o)
		return nil
	}
	status := events.RunStatus{RunID: st.RunID, Agent: req.Agent.Name, Tenant: req.Tenant, TraceID: tr.TraceID(),
		Iteration: st.Iteration, ToolCalls: len(st.Calls)}
	// Older effects were published when their state was written; only those of
	// the newest state change can be missing.
	if len(st.Turns) == 0 {
		started := status
		started.Status, started.Warnings = events.StatusStarted, st.Warnings
		if err := add(events.NewRunStatus(s.cfg.Source, started, "", tr)); err != nil {
			return err
		}
	}
	if n := len(st.Turns); n > 0 && st.Phase != PhaseAwaitingVerdict {
		if err := add(events.NewLLMCompleted(s.cfg.Source, events.LLMCompleted{RunID: st.RunID, Turn: st.Turns[n-1]}, req.Tenant, tr)); err != nil {
			return err
		}
	}
	if n := len(st.Turns); n > 0 {
		for _, c := range st.callsOf(st.Turns[n-1].Iteration) {
			if c.Local {
				if err := add(events.NewCallCompleted(s.cfg.Source, st.RunID, *c.Envelope, req.Tenant, tr)); err != nil {
					return err
				}
			}
		}
	}
	switch st.Phase {
	case PhaseAwaitingVerdict:
		err := add(events.NewIterationRequested(s.cfg.Source, events.IterationCheck{
			RunID: st.RunID, Iteration: st.Iteration, Tenant: req.Tenant, Agent: req.Agent.Name,
			Policy: req.Agent.Policy, ToolCalls: len(st.Calls),
		}, tr))
		if err != nil {
			return err
		}
	case PhaseAwaitingTools:
		for _, c := range st.callsOf(st.Iteration) {
			if c.Envelope != nil {
				continue
			}
			err := add(events.NewCallRequest(s.cfg.Source, "requested", events.CallRequest{
				RunID: st.RunID, CallID: c.CallID, Seq: c.Seq, Iteration: c.Iteration, Name: c.Name,
				Version: c.Version, Input: c.Input, ProviderCallID: c.ProviderCallID, Tenant: req.Tenant,
				Agent: req.Agent.Name, EnabledTools: req.Agent.EnabledTools, Policy: req.Agent.Policy,
			}, tr))
			if err != nil {
				return err
			}
		}
	case PhaseCompleted, PhaseFailed:
		end := status
		end.Status, end.Outputs, end.Pinned, end.Reason = events.StatusCompleted, st.Outputs, st.Pinned, st.Reason
		if st.Phase == PhaseFailed {
			end.Status = events.StatusFailed
		}
		if err := add(events.NewRunStatus(s.cfg.Source, end, "", tr)); err != nil {
			return err
		}
	}
	if err := s.pub.PublishAll(ctx, outs); err != nil {
		return err
	}
	if st.Phase == PhaseCompleted || st.Phase == PhaseFailed {
		s.metrics.runs.WithLabelValues(st.Phase).Inc()
	}
	return nil
}

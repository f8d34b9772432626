package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

// The orchestrator's durable consumers.
const (
	DurableRuns      = "orchestrator-runs"
	DurableCalls     = "orchestrator-calls"
	DurableApprovals = "orchestrator-approvals"
)

// Service is the orchestrator. It keeps no run state in memory: any number
// of replicas share its three durable consumers and the run state in KV.
type Service struct {
	service.Lifecycle

	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	tracer  trace.Tracer
	pub     *events.Publisher
	schemas *envelope.Schemas
	metrics *metrics

	// Set up by Start.
	states  *stateStore
	reg     *registry.Registry
	catalog *registry.Catalog
	runners events.Runners
}

// New returns an orchestrator on d's JetStream. It registers its metrics on
// d.Metrics (when set), reads no environment and does no I/O: Start connects
// it.
func New(d service.Deps, cfg Config) (*Service, error) {
	if d.JS == nil {
		return nil, errors.New("orchestrator: Deps.JS is required")
	}
	if cfg.TracesURLTemplate == "" {
		cfg.TracesURLTemplate = d.Common.TracesURLTemplate
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Providers = cfg.serving()
	d = d.WithDefaults()
	schemas, err := events.NewSchemas()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg:     cfg,
		js:      d.JS,
		log:     d.Log,
		tracer:  d.Tracer.Tracer("toolwire/orchestrator"),
		pub:     events.NewPublisher(d.JS),
		schemas: schemas,
		metrics: m,
	}, nil
}

// Option adjusts the configuration Build read from the environment.
type Option func(*Config)

// WithProviders adds model adapters (by provider name) to those the
// configuration sets up; an adapter given here replaces one of the same name.
func WithProviders(p Providers) Option {
	return func(c *Config) {
		c.Providers = maps.Clone(c.Providers)
		if c.Providers == nil {
			c.Providers = Providers{}
		}
		maps.Copy(c.Providers, p)
	}
}

// Build reads the configuration from d.Getenv, applies opts and calls New. It
// is what the orchestrator binary and `toolwire dev` run.
func Build(d service.Deps, opts ...Option) (*Service, error) {
	return service.BuildFrom("orchestrator", d, ConfigFromEnv, New, opts...)
}

// Config returns the configuration the service runs with (defaults applied,
// the model adapters it serves in Providers).
func (s *Service) Config() Config { return s.cfg }

// Start opens the run state and the registry, follows the approval records
// and starts consuming. ctx bounds the start; the watches and the consumers
// run until Stop.
func (s *Service) Start(ctx context.Context) (err error) {
	life, err := s.Starting(ctx)
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	defer func() { err = s.Started(ctx, err) }()
	kv, err := s.js.KeyValue(ctx, events.BucketRunState)
	if err != nil {
		return fmt.Errorf("orchestrator: open run state: %w", err)
	}
	s.states = newStateStore(kv)
	if s.reg, err = registry.Open(ctx, s.js); err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	if s.catalog, err = s.reg.Watch(ctx); err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	s.OnStopFunc(s.catalog.Stop)
	if err := s.watchApprovals(ctx, life); err != nil {
		return err
	}
	// The consumers stop first (Stop runs in reverse order): their handlers
	// read the catalog and may still be applying an approval.
	s.runners.Observer = s.metrics.consumers
	s.OnStop(s.runners.Stop)
	specs := []events.RunnerConfig{
		{Spec: events.ConsumerSpec{Stream: events.StreamRuns, Durable: DurableRuns,
			Filters:       events.Filters(events.FilterRunRequested, events.FilterIterationApproved, events.FilterIterationDenied),
			MaxAckPending: 4096, AckWait: s.cfg.AckWait}, Handler: s.handleRun},
		{Spec: events.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableCalls,
			Filters: events.Filters(events.FilterCallCompleted), MaxAckPending: 4096, AckWait: s.cfg.shortAckWait()},
			Handler: s.handleCallCompleted},
		{Spec: events.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableApprovals,
			Filters:       events.Filters(events.FilterCallApprovalRequired),
			MaxAckPending: 4096, AckWait: s.cfg.shortAckWait()}, Handler: s.handleApproval},
	}
	for _, rc := range specs {
		rc.Concurrency, rc.Logger = s.cfg.Concurrency, s.log
		if _, err := s.runners.Start(ctx, s.js, rc); err != nil {
			return fmt.Errorf("orchestrator: start %s: %w", rc.Spec.Durable, err)
		}
	}
	s.log.Info("orchestrator started", "instance", s.cfg.InstanceID, "providers", s.cfg.Providers.Names(),
		"model_timeout", s.cfg.ModelTimeout)
	return nil
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
		return reject("invalid run request: agent.model.provider: " + err.Error() + providerHint(req.Agent.Model.Provider))
	}
	if req.Agent.Model.Provider == scripted.Name {
		if _, err := scripted.Parse(req.Agent.Model.Options); err != nil {
			return reject("invalid run request: " + err.Error())
		}
	} else if strings.TrimSpace(req.Agent.Model.Name) == "" {
		return reject("invalid run request: agent.model.name is required for provider " + req.Agent.Model.Provider)
	}
	var warnings, problems []string
	for _, ref := range mustRefs(req.Agent) {
		e, ok, err := s.catalog.Resolve(ctx, s.reg, ref)
		if err != nil {
			return err
		}
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
	m := req.Agent.Model
	if _, priced := s.cfg.Prices.For(m.Provider, m.Name); !priced && req.Agent.Policy.MaxBudget > 0 {
		warnings = append(warnings, fmt.Sprintf("model %s/%s has no price in the price table (%s): its tokens add nothing to the spend that max_budget limits",
			m.Provider, m.Name, EnvPrices))
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
	return s.publishEffects(ctx, st, cause{created: true})
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

// onVerdict handles the policy's answer for an iteration: on approval it
// claims the iteration's model call, calls the model and records its turn,
// then publishes the turn's effects.
func (s *Service) onVerdict(ctx context.Context, d *events.Delivery) error {
	var v events.Verdict
	if err := events.DecodeData(d.Event, &v); err != nil {
		return events.Permanent(err)
	}
	n := v.Iteration
	if !v.Allowed {
		code := v.Code
		if code == "" {
			code = envelope.CodePolicyDenied
		}
		st, _, err := s.states.update(ctx, v.RunID, func(st *RunState) (bool, error) {
			if !st.awaiting(n) {
				return false, nil // already handled (a redelivery)
			}
			st.fail(code, "policy denied iteration "+strconv.Itoa(n)+": "+v.Reason)
			return true, nil
		})
		if errors.Is(err, errNoRunState) {
			return events.Permanent(fmt.Errorf("verdict for unknown run %s", v.RunID))
		}
		if err != nil {
			return err
		}
		return s.publishEffects(ctx, st, cause{iteration: n})
	}

	st, claimed, err := s.claimModel(ctx, v.RunID, n)
	if errors.Is(err, errNoRunState) {
		return events.Permanent(fmt.Errorf("verdict for unknown run %s", v.RunID))
	}
	if err != nil {
		return err
	}
	if !claimed {
		// Already handled (a redelivery), or the run ended: make sure its
		// effects are out.
		return s.publishEffects(ctx, st, cause{iteration: n})
	}
	if err := s.fault(ctx, FaultBeforeModel, v.RunID, n); err != nil {
		return err
	}
	turn, err := s.callModel(ctx, st)
	if err != nil {
		if ctx.Err() != nil {
			// Shutting down, not a model failure: the verdict is redelivered,
			// and the claim expires for whichever replica gets it.
			return fmt.Errorf("model call of run %s iteration %d interrupted: %w", v.RunID, n, ctx.Err())
		}
		// A model failure ends the run with a clear reason; the adapter's
		// retries already happened.
		st, _, uerr := s.states.update(ctx, v.RunID, func(st *RunState) (bool, error) {
			if !st.awaiting(n) || st.turn(n) != nil {
				return false, nil
			}
			st.fail(envelope.CodeProviderError, "model call failed: "+err.Error())
			return true, nil
		})
		if uerr != nil {
			return uerr
		}
		return s.publishEffects(ctx, st, cause{iteration: n})
	}
	if err := s.fault(ctx, FaultAfterModel, v.RunID, n); err != nil {
		return err
	}
	recorded := false
	st, _, err = s.states.update(ctx, v.RunID, func(st *RunState) (bool, error) {
		recorded = false
		if !st.awaiting(n) || st.turn(n) != nil {
			return false, nil // another delivery recorded this turn first
		}
		recorded = true
		return true, s.applyTurn(st, turn)
	})
	if err != nil {
		return err
	}
	if recorded {
		if u := st.turnUsage(n); u != nil {
			s.metrics.spend.Add(u.Cost)
		}
	}
	switch {
	case st.Done():
		err = s.fault(ctx, FaultBeforePublishOutputs, v.RunID, n)
	case st.Phase == PhaseAwaitingTools && st.Iteration == n:
		err = s.fault(ctx, FaultBeforePublishCalls, v.RunID, n)
	}
	if err != nil {
		return err
	}
	return s.publishEffects(ctx, st, cause{iteration: n})
}

// claimModel claims the model call of iteration n in the run state. It
// returns claimed false, with the state, when there is nothing to call (the
// turn is recorded or the run ended). While another delivery's claim is live
// it waits for that claim to end or expire: the model is not called twice for
// one turn unless the replica that called it died before recording the
// answer.
func (s *Service) claimModel(ctx context.Context, runID string, n int) (*RunState, bool, error) {
	for {
		var wait time.Duration
		claimed := false
		st, _, err := s.states.update(ctx, runID, func(st *RunState) (bool, error) {
			wait, claimed = 0, false
			if !st.awaiting(n) || st.turn(n) != nil {
				return false, nil
			}
			now := time.Now().UTC()
			attempts := 1
			if c := st.Claim; c != nil && c.Iteration == n {
				if now.Before(c.Until) {
					wait = c.Until.Sub(now)
					return false, nil
				}
				attempts = c.Attempts + 1
			}
			if attempts > MaxModelAttempts {
				st.fail("", fmt.Sprintf("the model call of iteration %d was interrupted %d times (its orchestrator stopped before recording the answer); giving up",
					n, attempts-1))
				return true, nil
			}
			st.Claim = &ModelClaim{Iteration: n, Attempts: attempts, Owner: s.cfg.InstanceID, Until: now.Add(s.cfg.claimLease())}
			claimed = true
			return true, nil
		})
		if err != nil || claimed || wait <= 0 {
			return st, claimed, err
		}
		s.log.Info("model call claimed by another delivery; waiting for it to end or expire",
			"run_id", runID, "iteration", n, "owner", st.Claim.Owner, "wait", wait)
		t := time.NewTimer(wait + 10*time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false, fmt.Errorf("wait for the model claim of run %s: %w", runID, ctx.Err())
		case <-t.C:
		}
	}
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
		e, ok, err := s.catalog.Resolve(ctx, s.reg, ref)
		if err != nil {
			return envelope.ModelTurn{}, err
		}
		if ok && e.State != registry.StateBlocked {
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
	resp, err := prov.Complete(mctx, provider.Request{
		RunID: st.RunID, Iteration: st.Iteration, Model: req.Agent.Model, System: req.Agent.SystemPrompt,
		Messages: st.Messages, Tools: tools,
	})
	end := time.Now()
	s.metrics.modelDur.Observe(end.Sub(start).Seconds())
	if err == nil && (resp.Usage.InputTokens < 0 || resp.Usage.OutputTokens < 0) {
		err = fmt.Errorf("%s model %s reported negative token counts", req.Agent.Model.Provider, req.Agent.Model.Name)
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %s (%s): %w", s.cfg.ModelTimeout, EnvModelTimeout, err)
		}
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

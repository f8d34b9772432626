package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service"
)

// The guard's two durable consumers.
const (
	DurableIterations = "policy-iterations"
	DurableCalls      = "policy-calls"
)

// Span names and attributes. GenAI semantic conventions name no policy
// operation, so the spans are named after the service and the check.
const (
	SpanCheckIteration = "policy check_iteration"
	SpanCheckToolCall  = "policy check_tool_call"

	AttrRunID         = "toolwire.run_id"
	AttrIteration     = "toolwire.iteration"
	AttrToolName      = "gen_ai.tool.name"
	AttrToolCallID    = "gen_ai.tool.call.id"
	AttrToolVersion   = "toolwire.tool.version"
	AttrCallSeq       = "toolwire.call.seq"
	AttrAllowed       = "toolwire.policy.allowed"
	AttrReason        = "toolwire.policy.reason"
	AttrRule          = "toolwire.policy.rule"
	instrumentationID = "toolwire/policy"
)

// Service is the Policy Guard service. It is stateless between events: each
// iteration check and call request carries the run's policy, and the tool
// registry is read from a watched in-memory catalog. Any number of replicas
// share its two durable consumers.
type Service struct {
	service.Lifecycle

	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	tracer  trace.Tracer
	guard   *Guard
	pub     *events.Publisher
	metrics *metrics

	catalog   *registry.Catalog
	approvals jetstream.KeyValue
	index     *pendingIndex
	runners   events.Runners
}

// New returns a service on d's JetStream. It registers its metrics on
// d.Metrics (when set), reads no environment and does no I/O: Start connects
// it.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.JS == nil {
		return nil, errors.New("policy: Deps.JS is required")
	}
	d = d.WithDefaults()
	m, err := newMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg:     cfg,
		js:      d.JS,
		log:     d.Log,
		tracer:  d.Tracer.Tracer(instrumentationID),
		guard:   NewGuard(),
		pub:     events.NewPublisher(d.JS),
		metrics: m,
	}, nil
}

// Option adjusts the configuration Build read from the environment.
type Option func(*Config)

// Build reads the configuration from d.Getenv, applies opts and calls New. It
// is what the policy binary and `toolwire dev` run.
func Build(d service.Deps, opts ...Option) (*Service, error) {
	return service.BuildFrom("policy", d, ConfigFromEnv, New, opts...)
}

// Config returns the configuration the service runs with.
func (s *Service) Config() Config { return s.cfg }

// Start loads the tool registry and the approval deadlines and starts
// consuming iteration checks, call requests and decisions. ctx bounds the
// start; the watches, the consumers and the sweep run until Stop.
func (s *Service) Start(ctx context.Context) (err error) {
	life, err := s.Starting(ctx)
	if err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	defer func() { err = s.Started(ctx, err) }()
	reg, err := registry.Open(ctx, s.js)
	if err != nil {
		return err
	}
	if s.catalog, err = reg.Watch(ctx); err != nil {
		return err
	}
	s.OnStopFunc(s.catalog.Stop)
	kv, err := s.js.KeyValue(ctx, events.BucketApprovals)
	if err != nil {
		return fmt.Errorf("policy: open approvals: %w", err)
	}
	if s.index, err = watchApprovals(ctx, kv); err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	s.approvals = kv
	s.OnStopFunc(s.index.stop)
	s.Go(life, s.sweepLoop) // ends after the consumers have drained
	s.runners.Observer = s.metrics.consumers
	s.OnStop(s.runners.Stop)
	specs := []events.RunnerConfig{
		{
			Spec:    events.ConsumerSpec{Stream: events.StreamRuns, Durable: DurableIterations, Filters: events.Filters(events.FilterIterationRequested)},
			Handler: s.handleIteration,
		},
		{
			Spec:    events.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableCalls, Filters: events.Filters(events.FilterCallRequested)},
			Handler: s.handleCall,
		},
		{
			Spec:    events.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableDecisions, Filters: events.Filters(events.FilterCallDecided)},
			Handler: s.handleDecision,
		},
	}
	for _, rc := range specs {
		rc.Concurrency, rc.Logger = s.cfg.Concurrency, s.log
		if _, err := s.runners.Start(ctx, s.js, rc); err != nil {
			return fmt.Errorf("policy: start %s: %w", rc.Spec.Durable, err)
		}
	}
	return nil
}

// handleIteration answers one iteration check with a verdict.
func (s *Service) handleIteration(ctx context.Context, d *events.Delivery) error {
	var c events.IterationCheck
	if err := events.DecodeData(d.Event, &c); err != nil {
		return events.Permanent(fmt.Errorf("iteration check: %w", err))
	}
	if err := matchSubject(d.Subject, c.RunID, "", c.Iteration); err != nil {
		return events.Permanent(fmt.Errorf("iteration check: %w", err))
	}
	rt := events.TraceOf(d.Event)
	ctx, span := s.startSpan(ctx, SpanCheckIteration, rt,
		attribute.String(AttrRunID, c.RunID), attribute.Int(AttrIteration, c.Iteration))
	defer span.End()

	dec := s.guard.CheckIteration(c)
	annotate(span, dec)
	v := events.Verdict{RunID: c.RunID, Iteration: c.Iteration, Allowed: dec.Allowed, Code: dec.Code, Reason: dec.Reason}
	out, err := events.NewVerdict(s.cfg.Source, v, c.Tenant, rt)
	if err != nil {
		return fail(span, events.Permanent(fmt.Errorf("iteration verdict: %w", err)))
	}
	if err := s.pub.Publish(ctx, out); err != nil {
		return fail(span, err)
	}
	s.metrics.observe(kindIteration, dec)
	s.logDecision(ctx, dec, "iteration checked", "run_id", c.RunID, "iteration", c.Iteration)
	return nil
}

// handleCall approves a tool call (re-publishing the request as approved) or
// denies it with a POLICY_DENIED envelope as the call's completion.
func (s *Service) handleCall(ctx context.Context, d *events.Delivery) error {
	var req events.CallRequest
	if err := events.DecodeData(d.Event, &req); err != nil {
		return events.Permanent(fmt.Errorf("call request: %w", err))
	}
	if err := matchSubject(d.Subject, req.RunID, req.CallID, 0); err != nil {
		return events.Permanent(fmt.Errorf("call request: %w", err))
	}
	rt := events.TraceOf(d.Event)
	ctx, span := s.startSpan(ctx, SpanCheckToolCall, rt,
		attribute.String(AttrRunID, req.RunID),
		attribute.String(AttrToolName, req.Name),
		attribute.String(AttrToolVersion, req.Version),
		attribute.String(AttrToolCallID, req.CallID),
		attribute.Int(AttrCallSeq, req.Seq),
		attribute.Int(AttrIteration, req.Iteration))
	defer span.End()

	dec := s.guard.CheckCall(req, s.catalog.Lookup)
	annotate(span, dec)
	if dec.Allowed && dec.ApprovalRequired != "" {
		entry, _ := s.catalog.Lookup(req.Ref())
		if err := s.requestApproval(ctx, span, &req, entry, dec.ApprovalRequired, rt); err != nil {
			return fail(span, err)
		}
		s.logDecision(ctx, dec, "tool call checked: awaits approval", "run_id", req.RunID, "call_id", req.CallID,
			"tool", calledTool(&req), "seq", req.Seq)
		return nil
	}
	var (
		out events.Outgoing
		err error
	)
	if dec.Allowed {
		out, err = events.NewCallRequest(s.cfg.Source, "approved", req, rt)
	} else {
		out, err = events.NewCallCompleted(s.cfg.Source, req.RunID, DeniedEnvelope(&req, dec, time.Now()), req.Tenant, rt)
	}
	if err != nil {
		return fail(span, events.Permanent(fmt.Errorf("call verdict: %w", err)))
	}
	if err := s.pub.Publish(ctx, out); err != nil {
		return fail(span, err)
	}
	s.metrics.observe(kindCall, dec)
	s.logDecision(ctx, dec, "tool call checked", "run_id", req.RunID, "call_id", req.CallID,
		"tool", calledTool(&req), "seq", req.Seq)
	return nil
}

// DeniedEnvelope is the receipt of a call the guard refused: the call as
// requested (the version is empty when none was resolved), no output, a
// POLICY_DENIED error with the decision's reason, and t_start = t_end = now.
func DeniedEnvelope(req *events.CallRequest, dec Decision, now time.Time) envelope.ToolEnvelope {
	now = now.UTC()
	code := dec.Code
	if code == "" {
		code = envelope.CodePolicyDenied
	}
	return envelope.ToolEnvelope{
		CallID:  req.CallID,
		Name:    req.Name,
		Version: req.Version,
		Input:   req.Input,
		Error:   &envelope.ToolError{Code: code, Message: dec.Reason},
		TStart:  now,
		TEnd:    now,
	}
}

// matchSubject checks that the event's data names the run (and call or
// iteration) of its subject: a verdict must go back to the run that asked.
func matchSubject(subject, runID, callID string, iteration int) error {
	p, err := events.ParseSubject(subject)
	if err != nil {
		return err
	}
	if p.RunID != runID || p.CallID != callID || p.Iteration != iteration {
		return fmt.Errorf("subject %s does not match the data (run_id %q, call_id %q, iteration %d)",
			subject, runID, callID, iteration)
	}
	return nil
}

// startSpan starts the check's span under the hop's span, or under the run's
// trace when the hop carried none.
func (s *Service) startSpan(ctx context.Context, name string, rt events.RunTrace, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = events.ContextWithRunTrace(ctx, rt)
	}
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

func annotate(span trace.Span, dec Decision) {
	span.SetAttributes(attribute.Bool(AttrAllowed, dec.Allowed))
	if !dec.Allowed {
		span.SetAttributes(attribute.String(AttrReason, dec.Reason), attribute.String(AttrRule, dec.Rule))
	}
	for _, w := range dec.Warnings {
		span.AddEvent("policy warning", trace.WithAttributes(attribute.String(AttrReason, w)))
	}
}

func fail(span trace.Span, err error) error {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	return err
}

func (s *Service) logDecision(ctx context.Context, dec Decision, msg string, args ...any) {
	for _, w := range dec.Warnings {
		s.log.WarnContext(ctx, "policy warning", slices.Concat(args, []any{"warning", w})...)
	}
	if dec.Allowed {
		s.log.DebugContext(ctx, msg, slices.Concat(args, []any{"outcome", dec.Outcome()})...)
		return
	}
	s.log.InfoContext(ctx, msg, slices.Concat(args, []any{"outcome", dec.Outcome(), "rule", dec.Rule, "reason", dec.Reason})...)
}

package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/events/service"
)

// The guard's two durable consumers.
const (
	DurableIterations = "policy-iterations"
	DurableCalls      = "policy-calls"

	// FilterIterations selects the iteration checks on StreamRuns.
	FilterIterations = events.Prefix + ".run.*.iteration.*.requested"
	// FilterCalls selects the tool call requests on StreamCalls.
	FilterCalls = events.Prefix + ".call.*.*.requested"
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

// ErrStopped is returned by Start after Stop: a stopped service cannot restart.
var ErrStopped = errors.New("policy: service stopped")

type lifecycle int

const (
	idle lifecycle = iota
	running
	stopped
)

// Service is the Policy Guard service. It is stateless between events: each
// iteration check and call request carries the run's policy, and the tool
// registry is read from a watched in-memory catalog. Any number of replicas
// share its two durable consumers.
type Service struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	tracer  trace.Tracer
	guard   *Guard
	pub     *events.Publisher
	metrics *metrics

	mu        sync.Mutex
	state     lifecycle
	catalog   *registry.Catalog
	runners   []*events.Runner
	approvals jetstream.KeyValue
	index     *pendingIndex
	stopSweep context.CancelFunc
	sweepDone chan struct{}
}

// New returns a service on d's JetStream. It registers its metrics on
// d.Metrics (when set) and does no I/O: Start connects it.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.JS == nil {
		return nil, errors.New("policy: Deps.JS is required")
	}
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	var tp trace.TracerProvider = noop.NewTracerProvider()
	if d.Tracer != nil {
		tp = d.Tracer
	}
	m, err := newMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg:     cfg,
		js:      d.JS,
		log:     log,
		tracer:  tp.Tracer(instrumentationID),
		guard:   NewGuard(),
		pub:     events.NewPublisher(d.JS),
		metrics: m,
	}, nil
}

// Build is the service.Build of the policy binary: configuration from the
// environment, then New.
func Build(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
	getenv := d.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	cfg, err := ConfigFromEnv(getenv)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration: %w", err)
	}
	s, err := New(d, cfg)
	if err != nil {
		return nil, nil, err
	}
	return s, nil, nil
}

// Start loads the tool registry and starts consuming iteration checks and call
// requests. Starting a running service does nothing.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case running:
		return nil
	case stopped:
		return ErrStopped
	}
	reg, err := registry.Open(ctx, s.js)
	if err != nil {
		return err
	}
	cat, err := reg.Watch(ctx)
	if err != nil {
		return err
	}
	s.catalog = cat // set before any handler runs
	if err := s.openApprovals(ctx); err != nil {
		cat.Stop()
		s.catalog = nil
		return err
	}
	runners, err := s.startRunners(ctx)
	if err != nil {
		s.index.stop()
		cat.Stop()
		s.catalog = nil
		return err
	}
	s.runners = runners
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stopSweep, s.sweepDone = cancel, make(chan struct{})
	go func() {
		defer close(s.sweepDone)
		s.sweepLoop(sctx)
	}()
	s.state = running
	return nil
}

// openApprovals opens the approvals bucket and watches its deadlines.
func (s *Service) openApprovals(ctx context.Context) error {
	kv, err := s.js.KeyValue(ctx, events.BucketApprovals)
	if err != nil {
		return fmt.Errorf("policy: open approvals: %w", err)
	}
	idx, err := watchApprovals(ctx, kv)
	if err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	s.approvals, s.index = kv, idx
	return nil
}

// startRunners starts the two consumers; if one fails, it stops those that
// started, so that Start can be retried.
func (s *Service) startRunners(ctx context.Context) ([]*events.Runner, error) {
	specs := []events.RunnerConfig{
		{
			Spec:    events.ConsumerSpec{Stream: events.StreamRuns, Durable: DurableIterations, Filters: []string{FilterIterations}},
			Handler: s.handleIteration,
		},
		{
			Spec:    events.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableCalls, Filters: []string{FilterCalls}},
			Handler: s.handleCall,
		},
		{
			Spec:    events.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableDecisions, Filters: []string{FilterDecisions}},
			Handler: s.handleDecision,
		},
	}
	runners := make([]*events.Runner, 0, len(specs))
	for _, rc := range specs {
		rc.Concurrency, rc.Logger = s.cfg.Concurrency, s.log
		r, err := events.NewRunner(s.js, rc)
		if err == nil {
			err = r.Start(ctx)
		}
		if err != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			serr := stopAll(sctx, runners)
			cancel()
			return nil, fmt.Errorf("policy: start %s: %w", rc.Spec.Durable, errors.Join(err, serr))
		}
		runners = append(runners, r)
	}
	return runners, nil
}

// Stop stops pulling, lets the checks in flight finish and publish their
// verdicts (bounded by ctx), then stops the registry watch. It is idempotent.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != running {
		s.state = stopped
		return nil
	}
	s.state = stopped
	err := stopAll(ctx, s.runners)
	s.stopSweep()
	<-s.sweepDone
	s.index.stop()
	s.catalog.Stop()
	return err
}

// stopAll drains the runners concurrently and joins their errors.
func stopAll(ctx context.Context, runners []*events.Runner) error {
	errs := make([]error, len(runners))
	var wg sync.WaitGroup
	for i, r := range runners {
		wg.Go(func() { errs[i] = r.Stop(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
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

package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/policy/pii"
)

// DurableTurns is the guard's durable consumer of model turns.
const DurableTurns = "policy-turns"

// Span names and attributes. GenAI semantic conventions name no policy
// operation, so the spans are named after the service and the check: one
// span per turn, with a child span per call it judged.
const (
	SpanCheckTurn     = "policy check_turn"
	SpanCheckToolCall = "policy check_tool_call"

	AttrRunID       = "toolwire.run_id"
	AttrIteration   = "toolwire.iteration"
	AttrTurnCalls   = "toolwire.turn.calls"
	AttrToolName    = "gen_ai.tool.name"
	AttrToolCallID  = "gen_ai.tool.call.id"
	AttrToolVersion = "toolwire.tool.version"
	AttrCallSeq     = "toolwire.call.seq"
	AttrQueue       = "toolwire.call.queue"
	AttrAllowed     = "toolwire.policy.allowed"
	AttrReason      = "toolwire.policy.reason"
	AttrRule        = "toolwire.policy.rule"
	AttrGate        = "toolwire.policy.gate"
	AttrGateCell    = "toolwire.policy.gate_cell"
)

// Service is the Policy Guard service. It is stateless between events: each
// model turn carries the run's policy, enabled tools and spend, and the tool
// registry is read from a watched in-memory catalog. Any number of replicas
// share its durable consumers.
type Service struct {
	service.Core

	cfg     Config
	guard   *rules.Guard
	metrics *metrics

	catalog   *registry.Catalog
	reg       *registry.Registry // what catalog watches; read when it has not caught up
	workers   *registry.Workers
	approvals jetstream.KeyValue
	index     *pendingIndex
	inputs    *inputSchemas
	pii       *pii.Scanner            // what approval summaries strip
	piiOrgs   map[string]*pii.Scanner // ... for the orgs configured apart
}

// piiFor is the scanner of org's approval summaries.
func (s *Service) piiFor(org string) *pii.Scanner {
	if sc, ok := s.piiOrgs[org]; ok {
		return sc
	}
	return s.pii
}

// New returns a service on d's JetStream. It registers its metrics on
// d.Metrics (when set), reads no environment and does no I/O: Start connects
// it.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	d, m, err := service.Prepare("policy", d, cfg, newMetrics)
	if err != nil {
		return nil, err
	}
	def, orgs := cfg.PII.scanners()
	return &Service{Core: d.Core("policy", m.consumers), cfg: cfg, guard: rules.NewGuard().WithGates(rules.Gates{Overrides: cfg.GateOverrides}),
		metrics: m, inputs: newInputSchemas(),
		pii: def, piiOrgs: orgs}, nil
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
// consuming model turns and decisions. ctx bounds the start; the watches,
// the consumers and the sweep run until Stop.
func (s *Service) Start(ctx context.Context) error {
	return s.StartWith(ctx, func(ctx, life context.Context) error {
		reg, err := registry.Open(ctx, s.JS)
		if err != nil {
			return err
		}
		s.reg = reg
		if s.catalog, err = reg.Watch(ctx); err != nil {
			return err
		}
		s.OnStopFunc(s.catalog.Stop)
		if s.workers, err = registry.WatchWorkers(ctx, s.JS, nil); err != nil {
			return fmt.Errorf("policy: %w", err)
		}
		s.OnStopFunc(s.workers.Stop)
		kv, err := s.JS.KeyValue(ctx, events.BucketApprovals)
		if err != nil {
			return fmt.Errorf("policy: open approvals: %w", err)
		}
		if s.index, err = watchApprovals(ctx, kv); err != nil {
			return fmt.Errorf("policy: %w", err)
		}
		s.approvals = kv
		s.OnStopFunc(s.index.stop)
		s.Go(life, s.sweepLoop) // ends after the consumers have drained
		return s.Consume(ctx, s.cfg.Concurrency,
			consume.RunnerConfig{
				Spec:    provision.ConsumerSpec{Stream: events.StreamRuns, Durable: DurableTurns, Filters: events.Filters(events.FilterTurnCompleted)},
				Handler: s.handleTurn,
			},
			consume.RunnerConfig{
				Spec:    provision.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableDecisions, Filters: events.Filters(events.FilterCallDecided)},
				Handler: s.handleDecision,
			},
			s.cancelSpec())
	})
}

// verdict is the guard's answer on one call of a turn.
type verdict struct {
	req events.CallRequest
	dec rules.Decision
	// def is the registry's definition of the called version, for an
	// approval request.
	def envelope.ToolDefinition
}

// handleTurn judges the calls of a model turn, in seq order, and publishes
// their outcomes together: each call approved to its queue, or completed
// with a POLICY_DENIED envelope. The calls that need an operator's approval
// are held after that, so that a slow preview never holds back the others.
//
// Every outcome has a deterministic event id, so a turn handled twice
// stores each outcome once. A redelivered turn (a crash or a failed publish
// after part of its outcomes were stored) is not judged again where it was
// judged already: a call whose outcome is in the stream, or that is held
// for approval, keeps it, even if the registry changed meanwhile, and only
// the missing outcomes are published.
func (s *Service) handleTurn(ctx context.Context, d *consume.Delivery) error {
	var t events.Turn
	if err := events.DecodeData(d.Event, &t); err != nil {
		return consume.Permanent(fmt.Errorf("turn: %w", err))
	}
	calls, err := callsToJudge(d.Subject, &t)
	if err != nil {
		return consume.Permanent(fmt.Errorf("turn: %w", err))
	}
	if len(calls) == 0 {
		return nil // a denied turn, or one without calls the guard must judge
	}
	if over, err := s.turnOver(ctx, d, &t); err != nil {
		return err
	} else if over != "" {
		s.metrics.runOver.WithLabelValues("turn", over).Inc()
		s.Log.WarnContext(ctx, "calls of a run that is over not judged", "run_id", t.RunID, "iteration", t.Iteration,
			"calls", len(calls), "reason", over, "attempt", d.Attempt)
		return nil
	}
	rt := events.TraceOf(d.Event)
	ctx, span := s.startSpan(ctx, SpanCheckTurn, rt,
		attribute.String(AttrRunID, t.RunID), attribute.Int(AttrIteration, t.Iteration),
		attribute.Int(AttrTurnCalls, len(calls)))
	defer span.End()

	var stored jetstream.Stream // the calls stream, read on a redelivery only
	if d.Attempt > 1 {
		if stored, err = s.JS.Stream(ctx, events.StreamCalls); err != nil {
			return fail(span, fmt.Errorf("turn: open %s: %w", events.StreamCalls, err))
		}
	}
	var (
		outs      []events.Outgoing
		routes    []route // the approved calls among outs
		published []verdict
		held      []verdict
		costs     float64 // the declared cost of the calls judged so far
	)
	for i := range calls {
		c := &calls[i]
		costBefore := costs
		costs += c.Cost
		req := approvedCall(&t, c)
		if stored != nil {
			done, err := s.judgedBefore(ctx, stored, &req)
			if err != nil {
				return fail(span, err)
			}
			if done {
				continue
			}
		}
		v, err := s.checkCall(ctx, &t, c, costBefore, req)
		if err != nil {
			return fail(span, err) // the registry cannot be read now: the turn comes back
		}
		switch {
		case v.dec.Allowed && v.dec.ApprovalRequired != "":
			held = append(held, v)
			continue
		case v.dec.Allowed:
			out, err := events.NewCallApproved(s.cfg.Source, v.req, rt) // v.req carries the gate
			if err != nil {
				return fail(span, consume.Permanent(fmt.Errorf("turn: call %s approved: %w", req.CallID, err)))
			}
			routes = append(routes, route{out: len(outs), req: v.req})
			outs = append(outs, out)
		default:
			out, err := events.NewCallCompleted(s.cfg.Source, req.RunID, DeniedEnvelope(&req, v.dec, time.Now()), req.Tenant, rt)
			if err != nil {
				return fail(span, consume.Permanent(fmt.Errorf("turn: call %s denied: %w", req.CallID, err)))
			}
			outs = append(outs, out)
		}
		published = append(published, v)
	}
	if err := s.toServedQueues(ctx, outs, routes, rt); err != nil {
		return fail(span, err)
	}
	if err := s.Pub.PublishAll(ctx, outs); err != nil {
		return fail(span, err)
	}
	for _, v := range published {
		s.metrics.observe(kindCall, v.dec)
		s.logDecision(ctx, v.dec, "tool call checked", callArgs(&v.req)...)
	}
	for _, v := range held {
		if err := s.requestApproval(ctx, &v.req, v.def, v.dec.ApprovalRequired, t.Policy.ApprovalTimeout(), rt); err != nil {
			return fail(span, err)
		}
		s.logDecision(ctx, v.dec, "tool call checked: awaits approval", callArgs(&v.req)...)
	}
	return nil
}

// checkCall runs the call rules on one call of t, under its own span.
func (s *Service) checkCall(ctx context.Context, t *events.Turn, c *events.TurnCall, costBefore float64, req events.CallRequest) (verdict, error) {
	_, span := s.Tracer.Start(ctx, SpanCheckToolCall, trace.WithAttributes(
		attribute.String(AttrRunID, req.RunID),
		attribute.String(AttrToolName, req.Name),
		attribute.String(AttrToolVersion, req.Version),
		attribute.String(AttrToolCallID, req.CallID),
		attribute.Int(AttrCallSeq, req.Seq),
		attribute.Int(AttrIteration, req.Iteration),
		attribute.String(AttrQueue, req.Queue)))
	defer span.End()
	call := rules.Call{
		Seq: c.Seq, Name: c.Name, Version: c.Version,
		Policy: t.Policy, EnabledTools: t.EnabledTools,
		Spend: t.Spend, Cost: c.Cost, CostBefore: costBefore,
		Input: c.Input, Org: t.Tenant.OrgID,
	}
	v := verdict{req: req}
	if c.Version != "" { // a tool that is not enabled has no version to look up
		// The watched catalog, else the registry itself: a tool registered
		// a moment ago (a worker's, just started) is not unknown because
		// the watch has not delivered it yet.
		e, ok, err := s.catalog.Resolve(ctx, s.reg, c.Ref())
		if err != nil {
			return v, err
		}
		if ok {
			v.def = e.Definition
			call.Tool, call.State = &v.def, e.State
		}
	}
	v.dec = s.guard.CheckCall(call)
	if v.dec.Allowed && v.dec.ApprovalRequired != "" {
		// Only a call that would run is put to an operator: its input is
		// checked now, not after the approval (the executor checks again).
		if in := s.inputs.checkInput(&v.def, req.Input); !in.Allowed {
			in.Warnings = v.dec.Warnings
			v.dec = in
		}
	}
	v.req.Gate = v.dec.Gate // on the approved call's event, and in its approval record
	if g := v.dec.Gate; g != nil {
		span.SetAttributes(attribute.String(AttrGate, string(g.Gate)), attribute.String(AttrGateCell, g.Cell()))
	}
	annotate(span, v.dec)
	if v.dec.Allowed && v.dec.ApprovalRequired != "" {
		span.SetAttributes(attribute.String(AttrApprovalRequired, v.dec.ApprovalRequired))
	}
	return v, nil
}

// judgedBefore reports whether an earlier delivery of the call's turn judged
// it: its outcome (approved, or completed: denied, or already run) is in the
// calls stream, or it is held for approval, in which case the record says
// what follows and this publishes it again.
func (s *Service) judgedBefore(ctx context.Context, stored jetstream.Stream, req *events.CallRequest) (bool, error) {
	approved, err := events.ApprovedSubject(req.RunID, req.CallID, req.Queue)
	if err != nil {
		return false, consume.Permanent(err)
	}
	completed, err := events.CallSubject(req.RunID, req.CallID, "completed")
	if err != nil {
		return false, consume.Permanent(err)
	}
	for _, subj := range []string{approved, completed} {
		_, err := stored.GetLastMsgForSubject(ctx, subj)
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return false, fmt.Errorf("turn: look up %s: %w", subj, err)
		}
	}
	return s.followApproval(ctx, req)
}

// callsToJudge checks a turn against its subject and returns the calls the
// guard must judge, in seq order: none for a denied turn, and none of the
// calls the orchestrator answered itself. A turn the guard cannot judge
// safely (ids that do not match, a call id or queue that is not a subject
// token, two calls with one id or one number, a negative cost) is refused
// whole, before anything of it is published.
func callsToJudge(subject string, t *events.Turn) ([]events.TurnCall, error) {
	if t.Iteration < 1 {
		return nil, fmt.Errorf("iteration %d: want at least 1", t.Iteration)
	}
	if err := matchSubject(subject, t.RunID, "", t.Iteration); err != nil {
		return nil, err
	}
	if t.Spend < 0 {
		return nil, fmt.Errorf("spend %g: want at least 0", t.Spend)
	}
	if !t.Verdict.Allowed {
		return nil, nil
	}
	calls := make([]events.TurnCall, 0, len(t.Calls))
	ids := make(map[string]bool, len(t.Calls))
	seqs := make(map[int]bool, len(t.Calls))
	for i := range t.Calls {
		c := &t.Calls[i]
		if err := events.ValidateCallID(c.CallID); err != nil {
			return nil, fmt.Errorf("call %d: %w", i+1, err)
		}
		switch {
		case ids[c.CallID]:
			return nil, fmt.Errorf("call %d: call_id %s is also an earlier call's", i+1, c.CallID)
		case c.Seq < 1:
			return nil, fmt.Errorf("call %d: seq %d: want at least 1", i+1, c.Seq)
		case seqs[c.Seq]:
			return nil, fmt.Errorf("call %d: seq %d is also an earlier call's", i+1, c.Seq)
		case c.Cost < 0:
			return nil, fmt.Errorf("call %d: cost %g: want at least 0", i+1, c.Cost)
		}
		if c.Queue != "" {
			if err := envelope.ValidateQueue(c.Queue); err != nil {
				return nil, fmt.Errorf("call %d: %w", i+1, err)
			}
		}
		ids[c.CallID], seqs[c.Seq] = true, true
		if !c.Answered {
			calls = append(calls, *c)
		}
	}
	slices.SortStableFunc(calls, func(a, b events.TurnCall) int { return a.Seq - b.Seq })
	return calls, nil
}

// approvedCall is call c of turn t as the workers of its queue receive it.
func approvedCall(t *events.Turn, c *events.TurnCall) events.CallRequest {
	return events.CallRequest{
		RunID: t.RunID, CallID: c.CallID, Seq: c.Seq, Iteration: t.Iteration,
		Name: c.Name, Version: c.Version, Input: c.Input, ProviderCallID: c.ProviderCallID,
		Tenant: t.Tenant, Agent: t.Agent, Queue: cmp.Or(c.Queue, envelope.DefaultQueue), RunDeadline: t.Deadline,
	}
}

// DeniedEnvelope is the receipt of a call the guard refused: the call as the
// model made it (the input byte for byte; the version is empty when none was
// resolved), no output, a POLICY_DENIED error with the decision's reason,
// t_start = t_end = now, and no cost: the call never ran.
func DeniedEnvelope(req *events.CallRequest, dec rules.Decision, now time.Time) envelope.ToolEnvelope {
	now = now.UTC()
	code := dec.Code
	if code == "" {
		code = envelope.CodePolicyDenied
	}
	te := &envelope.ToolError{Code: code, Message: dec.Reason}
	if len(dec.Details) > 0 {
		te.Details = dec.Details
	}
	return envelope.ToolEnvelope{
		CallID:  req.CallID,
		Name:    req.Name,
		Version: req.Version,
		Input:   req.Input,
		Error:   te,
		TStart:  now,
		TEnd:    now,
	}
}

// matchSubject checks that the event's data names the run (and call or
// turn) of its subject: a verdict must go back to the run that asked.
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

// startSpan starts a span under the hop's span, or under the run's trace
// when the hop carried none.
func (s *Service) startSpan(ctx context.Context, name string, rt events.RunTrace, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = events.ContextWithRunTrace(ctx, rt)
	}
	return s.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

func annotate(span trace.Span, dec rules.Decision) {
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

// callArgs are the log attributes of a call.
func callArgs(req *events.CallRequest) []any {
	return []any{"run_id", req.RunID, "call_id", req.CallID, "tool", calledTool(req), "seq", req.Seq, "queue", req.Queue}
}

// calledTool is name@version, or the bare name when no version was resolved.
func calledTool(req *events.CallRequest) string {
	if req.Version == "" {
		return req.Name
	}
	return req.Ref().String()
}

func (s *Service) logDecision(ctx context.Context, dec rules.Decision, msg string, args ...any) {
	for _, w := range dec.Warnings {
		s.Log.WarnContext(ctx, "policy warning", slices.Concat(args, []any{"warning", w})...)
	}
	if dec.Allowed {
		s.Log.DebugContext(ctx, msg, slices.Concat(args, []any{"outcome", dec.Outcome()})...)
		return
	}
	s.Log.InfoContext(ctx, msg, slices.Concat(args, []any{"outcome", dec.Outcome(), "rule", dec.Rule, "reason", dec.Reason})...)
}

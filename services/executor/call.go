package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
)

// Span attributes of toolwire beside the GenAI semantic conventions.
const (
	attrRunID       = attribute.Key("toolwire.run_id")
	attrToolVersion = attribute.Key("toolwire.tool.version")
	// toolType is gen_ai.tool.type: toolwire runs tools on the agent's side.
	toolType = "extension"
)

// errToolTimeout is the cause of a tool context that reached its deadline.
var errToolTimeout = errors.New("tool timeout")

// handle runs one approved call: call.started, the tool, call.completed. It
// returns an error (redelivery) only when an event cannot be published or a
// shutdown interrupts the call; a malformed event is dead-lettered at once.
func (s *Service) handle(ctx context.Context, d *events.Delivery) error {
	if typ := d.Event.Type(); typ != events.TypeCallApproved {
		return events.Permanent(fmt.Errorf("executor: event %s on %s has type %q, want %s", d.Event.ID(), d.Subject, typ, events.TypeCallApproved))
	}
	var req events.CallRequest
	if err := events.DecodeData(d.Event, &req); err != nil {
		return events.Permanent(err)
	}
	if err := errors.Join(events.ValidateRunID(req.RunID), events.ValidateCallID(req.CallID)); err != nil {
		return events.Permanent(fmt.Errorf("executor: event %s: %w", d.Event.ID(), err))
	}
	rt := events.TraceOf(d.Event)
	log := s.log.With("run_id", req.RunID, "call_id", req.CallID, "tool", req.Ref().String())

	if d.Attempt > 1 {
		done, err := s.completed(ctx, &req)
		if err != nil {
			return err
		}
		if done {
			log.Info("call already completed; redelivery acknowledged without running it again", "attempt", d.Attempt)
			return nil
		}
	}

	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()
	ctx, span := s.tracer.Start(ctx, "execute_tool "+req.Name,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			semconv.GenAIOperationNameExecuteTool,
			semconv.GenAIToolName(req.Name),
			semconv.GenAIToolCallID(req.CallID),
			semconv.GenAIToolType(toolType),
			attrRunID.String(req.RunID),
			attrToolVersion.String(req.Version),
		))
	defer span.End()

	tStart := s.now().UTC()
	started, err := events.NewCallStarted(s.cfg.Source, events.CallStarted{
		RunID: req.RunID, CallID: req.CallID, Name: req.Name, Version: req.Version,
		TStart: tStart, Executor: s.cfg.ID,
	}, req.Tenant, rt)
	if err != nil {
		return events.Permanent(err)
	}
	if err := s.pub.Publish(ctx, started); err != nil {
		span.SetStatus(codes.Error, "publish call.started")
		return err
	}

	env, toolLabel, err := s.execute(ctx, &req, tStart, log)
	if err != nil {
		span.SetStatus(codes.Error, "registry unavailable")
		return err
	}
	if err := ctx.Err(); err != nil {
		// Shutting down past the drain deadline: the outcome may be our own
		// cancellation, so leave the call to another replica.
		span.SetStatus(codes.Error, "interrupted")
		return fmt.Errorf("call %s interrupted: %w", req.CallID, err)
	}

	code := outcomeOK
	if env.Error != nil {
		code = string(env.Error.Code)
		span.SetAttributes(semconv.ErrorTypeKey.String(code))
		span.SetStatus(codes.Error, env.Error.Message)
	}
	s.metrics.calls.WithLabelValues(toolLabel, code).Inc()
	s.metrics.duration.WithLabelValues(toolLabel).Observe(env.Latency().Seconds())

	completed, err := events.NewCallCompleted(s.cfg.Source, req.RunID, env, req.Tenant, rt)
	if err != nil {
		return events.Permanent(err)
	}
	if err := s.pub.Publish(ctx, completed); err != nil {
		return err
	}
	log.Debug("call completed", "code", code, "latency", env.Latency())
	return nil
}

// completed reports whether the call's completed event is already stored.
func (s *Service) completed(ctx context.Context, req *events.CallRequest) (bool, error) {
	subj, err := events.CallSubject(req.RunID, req.CallID, "completed")
	if err != nil {
		return false, events.Permanent(err)
	}
	_, err = s.calls.GetLastMsgForSubject(ctx, subj)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	}
	return false, fmt.Errorf("look up %s: %w", subj, err)
}

// execute runs the call and returns its envelope and the tool's metric label.
// Every failure of the call is the envelope's error; err is only for a
// registry that cannot be read (the call is then redelivered rather than
// answered with an outcome that says nothing about the tool).
func (s *Service) execute(ctx context.Context, req *events.CallRequest, tStart time.Time, log *slog.Logger) (env envelope.ToolEnvelope, toolLabel string, err error) {
	env = envelope.ToolEnvelope{
		CallID:  req.CallID,
		Name:    req.Name,
		Version: req.Version,
		Input:   req.Input,
		TStart:  tStart,
	}
	defer func() {
		if env.TEnd.IsZero() {
			env.TEnd = s.now().UTC()
		}
		if env.Error != nil {
			env.Output = nil
		}
	}()
	fail := func(te *envelope.ToolError) (envelope.ToolEnvelope, string, error) {
		env.Error = te
		return env, toolLabel, nil
	}

	ref := req.Ref()
	toolLabel = unknownTool
	entry, found, err := s.lookup(ctx, ref)
	if err != nil {
		return env, toolLabel, err
	}
	if !found {
		return fail(envelope.NewToolError(envelope.CodeValidation, "unknown tool %s", ref))
	}
	toolLabel = req.Name
	def := &entry.Definition
	if entry.State == registry.StateBlocked {
		return fail(envelope.NewToolError(envelope.CodePolicyDenied, "tool %s is blocked", ref))
	}
	key, err := builtinKey(def)
	if err != nil {
		return fail(envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: %v", ref, err))
	}
	tool, ok := s.tools[key]
	if !ok {
		return fail(envelope.NewToolError(envelope.CodeUnknown, "tool %s: builtin %q is not available in this executor", ref, key))
	}
	schemas, err := s.schemas.get(def)
	if err != nil {
		log.Error("tool schemas do not compile", "err", err)
		return fail(envelope.NewToolError(envelope.CodeUnknown, "tool %s has an invalid JSON Schema in the registry", ref))
	}
	if err := envelope.ValidateAgainst(ref.String()+" input", schemas.input, req.Input); err != nil {
		return fail(schemaFailure(envelope.CodeValidation, err, "input for tool %s does not match its input schema", ref))
	}

	out, te := s.invoke(ctx, tool, def, req, log)
	env.TEnd = s.now().UTC()
	if te != nil {
		return fail(te)
	}
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	if !json.Valid(out) {
		return fail(envelope.NewToolError(envelope.CodeProviderError, "tool %s returned output that is not JSON", ref))
	}
	if schemas.output != nil {
		if err := envelope.ValidateAgainst(ref.String()+" output", schemas.output, out); err != nil {
			return fail(schemaFailure(envelope.CodeProviderError, err, "output of tool %s does not match its output schema", ref))
		}
	}
	env.Output = out
	return env, toolLabel, nil
}

// schemaFailure turns a validation failure into a ToolError listing the
// problems in its details.
func schemaFailure(code envelope.ErrorCode, err error, format string, args ...any) *envelope.ToolError {
	te := envelope.NewToolError(code, format, args...)
	var se *envelope.SchemaError
	if errors.As(err, &se) {
		return te.WithDetails(se.Problems)
	}
	return te.WithDetails([]string{err.Error()})
}

// lookup finds a tool version in the catalog, or in the registry itself when
// the catalog's watch has not delivered it yet.
func (s *Service) lookup(ctx context.Context, ref envelope.ToolRef) (registry.Entry, bool, error) {
	if ref.Validate() != nil {
		return registry.Entry{}, false, nil
	}
	if e, ok := s.catalog.Lookup(ref); ok {
		return e, true, nil
	}
	e, err := s.reg.Get(ctx, ref)
	switch {
	case err == nil:
		return e, true, nil
	case errors.Is(err, registry.ErrNotFound):
		return registry.Entry{}, false, nil
	}
	return registry.Entry{}, false, fmt.Errorf("look up tool %s: %w", ref, err)
}

// toolResult is what a tool's goroutine hands back.
type toolResult struct {
	out   json.RawMessage
	err   error
	panic any
	stack []byte
}

// invoke runs the tool under its timeout and classifies its failure.
func (s *Service) invoke(ctx context.Context, tool Tool, def *envelope.ToolDefinition, req *events.CallRequest, log *slog.Logger) (json.RawMessage, *envelope.ToolError) {
	ref := def.Ref()
	timeout := def.Timeout()
	tctx, cancel := context.WithTimeoutCause(ctx, timeout, errToolTimeout)
	defer cancel()
	tc := ToolContext{TenantID: req.Tenant.ID(), RunID: req.RunID, CallID: req.CallID, Auth: map[string]string{}}

	done := make(chan toolResult, 1)
	go func() {
		var r toolResult
		defer func() {
			if p := recover(); p != nil {
				r = toolResult{panic: p, stack: debug.Stack()}
			}
			done <- r
		}()
		r.out, r.err = tool.Execute(tctx, req.Input, tc)
	}()

	var r toolResult
	select {
	case r = <-done:
	case <-tctx.Done():
		grace := time.NewTimer(s.abandonAfter)
		select {
		case r = <-done:
			grace.Stop()
		case <-grace.C:
			s.metrics.abandoned.Inc()
			log.Error("tool did not return after its context ended; abandoned", "after", s.abandonAfter)
			r = toolResult{err: context.Cause(tctx)}
		}
	}

	switch {
	case r.panic != nil:
		log.Error("tool panicked", "panic", fmt.Sprint(r.panic), "stack", string(r.stack))
		return nil, envelope.NewToolError(envelope.CodeUnknown, "internal error in tool %s", ref)
	case r.err == nil:
		return r.out, nil
	case ctx.Err() != nil:
		// Shutdown: the caller leaves the call for redelivery.
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s was interrupted", ref)
	case errors.Is(context.Cause(tctx), errToolTimeout):
		return nil, envelope.NewToolError(envelope.CodeTimeout, "tool %s timed out after %s", ref, timeout)
	}
	var te *envelope.ToolError
	if errors.As(r.err, &te) && te.Code.Valid() {
		cp := *te
		return nil, &cp
	}
	log.Error("tool failed", "err", r.err)
	return nil, envelope.NewToolError(envelope.CodeUnknown, "internal error in tool %s", ref)
}

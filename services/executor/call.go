package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor/toolapi"
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

// errClaimLost is the cause of a writes tool's context cancelled because
// another replica declared its outcome unknown.
var errClaimLost = errors.New("claim of the call lost")

// publishGrace bounds the recording and publishing of a writes call's final
// outcome during a shutdown.
const publishGrace = 10 * time.Second

// outcomeGrace bounds the recording of a writes call's outcome, retried
// through the bucket's hiccups (a leader election, a node restarting).
const outcomeGrace = 30 * time.Second

// attrCached marks the span of a call served from the cache.
const attrCached = attribute.Key("toolwire.cached")

// handle runs one approved call: the tool, call.completed, and call.started
// when the call runs past Config.StartedAfter. It returns an error
// (redelivery) only when an event cannot be published or a shutdown
// interrupts the call; a malformed event is dead-lettered at once.
func (s *Service) handle(ctx context.Context, d *consume.Delivery) error {
	if typ := d.Event.Type(); typ != events.TypeCallApproved {
		return consume.Permanent(fmt.Errorf("executor: event %s on %s has type %q, want %s", d.Event.ID(), d.Subject, typ, events.TypeCallApproved))
	}
	var req events.CallRequest
	if err := events.DecodeData(d.Event, &req); err != nil {
		return consume.Permanent(err)
	}
	if err := errors.Join(events.ValidateRunID(req.RunID), events.ValidateCallID(req.CallID)); err != nil {
		return consume.Permanent(fmt.Errorf("executor: event %s: %w", d.Event.ID(), err))
	}
	rt := events.TraceOf(d.Event)
	log := s.Log.With("run_id", req.RunID, "call_id", req.CallID, "tool", req.Ref().String())
	over, cancelled, err := s.runOver(ctx, d, &req)
	if err != nil {
		return err
	} else if over != "" {
		// Nothing of a run follows its end (runover.go): no event, no
		// effect.
		s.metrics.runOver.WithLabelValues(req.Ref().String(), over).Inc()
		log.Warn("call of a run that is over dropped without being started", "reason", over, "attempt", d.Attempt)
		return nil
	}

	if d.Attempt > 1 {
		// A redelivery of a call whose completed event is stored (its ack
		// was lost) is acknowledged as it is: the envelope says all, t_start
		// included, so no call.started is owed either.
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
	ctx, span := s.Tracer.Start(ctx, "execute_tool "+req.Name,
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

	// The tool's secrets (secrets.go): their scopes go on the timeline, their
	// values only to the tool.
	// The registry is read once for the call: its secrets and its run.
	entry, found, err := s.lookup(ctx, req.Ref())
	if err != nil {
		span.SetStatus(codes.Error, "infrastructure")
		return err
	}
	var (
		known *registry.Entry // nil: no such tool
		def   *envelope.ToolDefinition
	)
	if found {
		known, def = &entry, &entry.Definition
	}
	// A call of a cancelled run does not start: it needs no secrets, and
	// has no call.started (execute answers it).
	sec := &callSecrets{}
	if cancelled == "" {
		if sec, err = s.resolveSecrets(ctx, &req, def, log); err != nil {
			span.SetStatus(codes.Error, "secrets unavailable")
			return err
		}
	}
	ctx, log = withCallSecrets(ctx, sec), sec.logger(log)

	tStart := s.now().UTC()
	// Built only when it goes out: most calls end before StartedAfter.
	started := func() (events.Outgoing, error) {
		return events.NewCallStarted(s.cfg.Source, events.CallStarted{
			RunID: req.RunID, CallID: req.CallID, Name: req.Name, Version: req.Version,
			TStart: tStart, Executor: s.cfg.ID, SecretScopes: sec.scopes, Warnings: sec.warnings,
		}, req.Tenant, rt)
	}
	// call.started goes out once the tool has run for StartedAfter, without
	// waiting for its PubAck, which is awaited with completed's below; a
	// quicker call publishes none, unless it has secret scopes to record
	// (see Config.StartedAfter).
	early := s.startStarted(ctx, started, len(sec.scopes) > 0 || len(sec.warnings) > 0)
	res, err := s.execute(ctx, &req, known, tStart, deliveryOf(d), cancelled, log)
	if err != nil {
		early.cancel()
		span.SetStatus(codes.Error, "infrastructure")
		return err
	}
	startedPub, err := early.take(ctx)
	if err != nil {
		span.SetStatus(codes.Error, "publish call.started")
		return err
	}
	pubCtx := ctx
	if err := ctx.Err(); err != nil {
		if !res.recorded {
			// Shutting down past the drain deadline: the outcome may be our
			// own cancellation, so leave the call to another replica.
			span.SetStatus(codes.Error, "interrupted")
			return fmt.Errorf("call %s interrupted: %w", req.CallID, err)
		}
		// A writes call's outcome is recorded and final: publish it even
		// while shutting down (a redelivery would publish the same).
		var cancel context.CancelFunc
		pubCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), publishGrace)
		defer cancel()
	}
	env := sec.scrubEnvelope(res.env)

	code := outcomeOK
	if env.Error != nil {
		code = string(env.Error.Code)
		span.SetAttributes(semconv.ErrorTypeKey.String(code))
		span.SetStatus(codes.Error, env.Error.Message)
	}
	if env.Cached {
		span.SetAttributes(attrCached.Bool(true))
	}
	s.metrics.calls.WithLabelValues(res.label, code).Inc()
	s.metrics.duration.WithLabelValues(res.label).Observe(env.Latency().Seconds())

	completed, err := events.NewCallCompleted(s.cfg.Source, req.RunID, env, req.Tenant, rt)
	if err != nil {
		return consume.Permanent(err)
	}
	completedPub, err := s.Pub.PublishAsync(pubCtx, completed)
	if err != nil {
		return err
	}
	if startedPub != nil {
		if serr := startedPub.Wait(pubCtx); serr != nil {
			// Not confirmed: publish it again (its id makes a stored copy a
			// duplicate).
			if err := startedPub.Retry(pubCtx); err != nil {
				span.SetStatus(codes.Error, "publish call.started")
				return errors.Join(serr, err)
			}
		}
	}
	if err := completedPub.Wait(pubCtx); err != nil {
		return err
	}
	log.Debug("call completed", "code", code, "latency", env.Latency(), "cached", env.Cached, "truncated", env.Truncated)
	return nil
}

// pendingStarted is a call.started on its way: published by a timer once the
// tool has run for StartedAfter, or by take when it must go out anyway.
type pendingStarted struct {
	s     *Service
	out   func() (events.Outgoing, error) // builds the started event
	must  bool                            // published even for a quick call (secret scopes to record)
	timer *time.Timer
	done  chan struct{} // closed once the timer's publish returned
	pub   *publish.Pending
	err   error
}

// startStarted arms the publish of started: at once when StartedAfter is
// negative, else after it. must: a quick call publishes it too.
func (s *Service) startStarted(ctx context.Context, started func() (events.Outgoing, error), must bool) *pendingStarted {
	p := &pendingStarted{s: s, out: started, must: must, done: make(chan struct{})}
	if s.cfg.StartedAfter < 0 {
		p.pub, p.err = p.publish(ctx)
		close(p.done)
		return p
	}
	p.timer = time.AfterFunc(s.cfg.StartedAfter, func() {
		p.pub, p.err = p.publish(ctx)
		close(p.done)
	})
	return p
}

// publish builds the started event and publishes it, without waiting for
// its PubAck.
func (p *pendingStarted) publish(ctx context.Context) (*publish.Pending, error) {
	o, err := p.out()
	if err != nil {
		return nil, consume.Permanent(err)
	}
	return p.s.Pub.PublishAsync(ctx, o)
}

// take returns the publish of started once the call has ended: the timer's,
// or, when the call ended before the timer fired, none (nil), or a publish
// made now when started must go out anyway. A publish made by take precedes
// completed's on the same connection, so the stream stores started first.
func (p *pendingStarted) take(ctx context.Context) (*publish.Pending, error) {
	if p.timer != nil && p.timer.Stop() {
		if !p.must {
			return nil, nil
		}
		return p.publish(ctx)
	}
	<-p.done
	return p.pub, p.err
}

// cancel stops a publish that has not started; one already made stands (a
// redelivery's is a duplicate).
func (p *pendingStarted) cancel() {
	if p.timer != nil {
		p.timer.Stop()
	}
}

// deliveryOf is the delivery number of d as the runner counts it against
// maxDeliver: the server's, without this replica's retries in place.
func deliveryOf(d *consume.Delivery) uint64 {
	if d.Meta != nil {
		return d.Meta.NumDelivered
	}
	return d.Attempt
}

// completed reports whether the call's completed event is already stored.
func (s *Service) completed(ctx context.Context, req *events.CallRequest) (bool, error) {
	subj, err := events.CallSubject(req.RunID, req.CallID, "completed")
	if err != nil {
		return false, consume.Permanent(err)
	}
	return publish.Stored(ctx, s.calls, subj)
}

// execResult is the outcome of execute.
type execResult struct {
	env envelope.ToolEnvelope
	// label is the tool label of the metrics: name@version, or unknownTool.
	label string
	// recorded: env is the final outcome of a writes call, recorded in the
	// outcomes bucket; it is published even during a shutdown.
	recorded bool
}

// execute runs the call through the executor's pipeline and returns its
// envelope: the registry entry (entry, as handle read it; nil for a tool the
// registry does not hold); for a writes tool, its outcome record (a
// redelivery never runs it twice, unless the tool declares idempotent
// retries and the run it finds was cut short: retry.go); input validation;
// the cache; the tool's circuit; its rate limit; the claim of a writes call;
// the tool under its timeout; output validation; truncation; the outcome
// record or the cache entry. Every failure of the call is the envelope's error; err is only for
// infrastructure that cannot be reached (the rate-limit or outcomes bucket):
// the call is then redelivered rather than answered with an outcome that
// says nothing about the tool.
func (s *Service) execute(ctx context.Context, req *events.CallRequest, entry *registry.Entry, tStart time.Time, delivery uint64, cancelled string, log *slog.Logger) (res execResult, err error) {
	res = execResult{label: unknownTool, env: envelope.ToolEnvelope{
		CallID:  req.CallID,
		Name:    req.Name,
		Version: req.Version,
		Input:   req.Input,
		TStart:  tStart,
	}}
	// stale is the claim of a writes call cut short that this delivery runs
	// again (retry.go); a failure before the run leaves it unknown.
	var stale *staleClaim
	fail := func(te *envelope.ToolError) (execResult, error) {
		if stale != nil {
			return s.refuseRetry(ctx, &res, outcomeKey(req.RunID, req.CallID), *stale, te, log)
		}
		res.env.Error, res.env.Output = te, nil
		if res.env.TEnd.IsZero() {
			res.env.TEnd = s.now().UTC()
		}
		return res, nil
	}

	ref := req.Ref()
	if entry == nil {
		return fail(envelope.NewToolError(envelope.CodeValidation, "unknown tool %s", ref))
	}
	res.label = service.ToolLabel(req.Name, req.Version)
	def := &entry.Definition
	// Whatever the outcome, the envelope carries what the call cost.
	defer func() { priceEnvelope(&res.env, def) }()
	writes := def.Metadata.SideEffects == envelope.SideEffectsWrites
	outKey := outcomeKey(req.RunID, req.CallID)
	if writes {
		// A redelivery of a writes call that was claimed before is answered
		// from its record, whatever the registry says now; or, when its
		// claimer stopped during the call and the tool declares idempotent
		// retries, run again.
		handled, st, err := s.replayWrite(ctx, &res, outKey, s.writeRetryRule(def, delivery), log)
		if handled || err != nil {
			return res, err
		}
		stale = st
	}
	if cancelled != "" {
		// Its run was cancelled before it started (a writes call that ran
		// before has been answered from its record, above).
		s.metrics.cancelled.WithLabelValues(res.label, cancelRefused).Inc()
		log.Info("call of a cancelled run refused without being started", "reason", cancelled)
		return fail(events.CancelledCallError(false, cancelled))
	}
	if !entry.State.Executable() {
		return fail(envelope.NewToolError(envelope.CodePolicyDenied, "tool %s is %s", ref, entry.State))
	}
	impl, te := s.toolFor(def)
	if te != nil {
		return fail(te)
	}
	schemas, err := s.schemas.get(def)
	if err != nil {
		log.Error("tool schemas do not compile", "err", err)
		return fail(envelope.NewToolError(envelope.CodeUnknown, "tool %s has an invalid JSON Schema in the registry", ref))
	}
	if err := envelope.ValidateAgainst(ref.String()+" input", schemas.Input, req.Input); err != nil {
		return fail(schemaFailure(envelope.CodeValidation, err, "input for tool %s does not match its input schema", ref))
	}
	if te := s.inputRoom(ref, &res.env); te != nil {
		return fail(te)
	}

	if te := secretsOf(ctx).err; te != nil {
		return fail(te) // a secret is missing: the tool does not run
	}

	// The cache: a hit is this call's envelope, served without running the
	// tool (and without taking a rate-limit token).
	cacheKey, ttl, cacheable := "", time.Duration(0), false
	if ttl, cacheable = cacheTTL(def); cacheable {
		cacheKey, err = envelope.CacheKey(req.Tenant.ID(), req.Name, req.Version, req.Input)
		if err != nil {
			cacheable = false
		} else {
			hit, err := s.cache.get(ctx, cacheKey)
			switch {
			case err != nil:
				log.Warn("cache unavailable; running the tool", "err", err)
			case hit != nil:
				s.metrics.cache.WithLabelValues(res.label, "hit").Inc()
				res.env = cacheHit(hit, &res.env, s.now().UTC())
				return res, nil
			default:
				s.metrics.cache.WithLabelValues(res.label, "miss").Inc()
			}
		}
	}

	// The tool's health: an open circuit answers at once.
	// Another replica found the tool down: fail fast here too.
	if refusal := s.peerRefusal(res.label); refusal != nil {
		s.metrics.circuitFast.WithLabelValues(res.label).Inc()
		return fail(refusal)
	}
	report, refusal := s.circuits.allow(res.label)
	if refusal != nil {
		return fail(refusal)
	}
	ran := false
	defer func() {
		var code envelope.ErrorCode
		if res.env.Error != nil {
			code = res.env.Error.Code
		}
		report(code, ran && err == nil)
	}()

	if def.RateLimit != nil {
		wait, err := s.limiter.take(ctx, req.Tenant.ID(), req.Name, def.RateLimit)
		if err != nil {
			return res, err
		}
		if wait > 0 {
			s.metrics.rateLimited.WithLabelValues(res.label).Inc()
			te := envelope.NewToolError(envelope.CodeRateLimit,
				"rate limit of tool %s reached for this tenant (%g calls/s, burst %d); retry in %s",
				req.Name, def.RateLimit.PerS, def.RateLimit.Burst, wait.Round(time.Millisecond))
			te.RetryAfterS = retryAfterSeconds(wait)
			return fail(te)
		}
	}

	// From here on the call runs: its run's cancellation cuts it
	// (cancel.go). A run cancelled since handle looked is refused here.
	runCtx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	untrack, said := s.cancels.Track(req.RunID, req.Tenant, cut)
	if untrack == nil {
		s.metrics.cancelled.WithLabelValues(res.label, cancelRefused).Inc()
		log.Info("call of a cancelled run refused without being started", "reason", said)
		return fail(events.CancelledCallError(false, said))
	}
	defer untrack()

	// A writes call is claimed before it runs: the claim decides which
	// delivery runs it, and a heartbeat keeps the claim alive meanwhile.
	var (
		claim   *heldClaim
		claimed outcomeRecord // the claim's record: which run this is
	)
	if writes {
		var rev uint64
		if stale != nil {
			rev, claimed, err = s.outcomes.retake(ctx, outKey, *stale, tStart)
		} else {
			rev, claimed, err = s.outcomes.claim(ctx, outKey, tStart)
		}
		stale = nil // from here on, the record says what happened
		if errors.Is(err, errClaimTaken) {
			handled, _, err := s.replayWrite(ctx, &res, outKey, nil, log)
			if err == nil && !handled {
				err = fmt.Errorf("claim %s: taken, then gone", outKey)
			}
			return res, err
		}
		if err != nil {
			return res, err
		}
		if run := claimed.run(); run > 1 {
			// A retry: the call started with its first run.
			res.env.Attempt, res.env.TStart = run, claimed.firstStart().UTC()
			s.metrics.writeReplays.WithLabelValues(res.label, "retried").Inc()
		}
		claim = s.outcomes.hold(outKey, rev, claimed)
		var cancel context.CancelCauseFunc
		runCtx, cancel = context.WithCancelCause(runCtx)
		defer cancel(nil)
		go func() {
			select {
			case <-claim.lost:
				cancel(errClaimLost)
			case <-runCtx.Done():
			}
		}()
	}

	ran = true
	rerun, runs := s.rerunFunc(s.writeRetryRule(def, delivery), claim, claimed, res.label, log)
	out, te := s.invoke(runCtx, impl, def, req, s.runTimeout(def, claimed), rerun, log)
	if said := cancels.CancelledBy(runCtx); said != "" && events.IsCancelledCall(te) {
		// Cut short by its run's cancellation (a tool that returned its
		// output first was not): not a sign of the tool's health either
		// way.
		ran = false
		s.metrics.cancelled.WithLabelValues(res.label, cancelCut).Inc()
		log.Info("call cut short: its run was cancelled", "reason", said)
	}
	if run := runs.run(); run > 1 {
		claimed.Started, claimed.Attempt = claimed.firstStart(), run
		res.env.Attempt, res.env.TStart = run, claimed.firstStart().UTC()
	}
	out, te = secretsOf(runCtx).scrubResult(out, te)
	res.env.TEnd = s.now().UTC()
	if te == nil {
		te = s.checkOutput(ref, schemas, &out)
	}
	if te == nil {
		if err := s.setOutput(ctx, req.RunID, req.CallID, &res.env, out); err != nil {
			log.Error("oversized output could not be stored as a blob", "bytes", len(out), "err", err)
			te = envelope.NewToolError(envelope.CodeUnknown, "the output of tool %s (%d bytes) is larger than the executor passes on and could not be stored", ref, len(out))
		} else if res.env.Truncated {
			s.metrics.truncated.WithLabelValues(res.label).Inc()
		}
	}
	if te != nil {
		res.env.Error, res.env.Output = te, nil
		res.env.Truncated, res.env.Attachments = false, nil
	}

	if writes {
		rev := claim.release()
		if te != nil && (ctx.Err() != nil || errors.Is(context.Cause(runCtx), errClaimLost)) {
			if ctx.Err() != nil && !errors.Is(context.Cause(runCtx), errClaimLost) && def.RetriesWrites() {
				// Stopped mid-call by a shutdown, the tool safe to run
				// again: the claim is left as it is, its heartbeat
				// stopped, and the delivery that finds it stale retries
				// the call (or declares it unknown past its bounds).
				log.Warn("writes call interrupted; its tool declares idempotent retries, so it is left for a retry", "run", claimed.run())
				return res, nil
			}
			// Stopped mid-call: whether the effect happened is unknown.
			res.env = unknownOutcome(res.env, claimed, res.env.TEnd)
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), outcomeGrace)
		defer cancel()
		priceEnvelope(&res.env, def) // the record is the envelope published
		final, err := s.outcomes.finish(fctx, outKey, rev, res.env)
		if err != nil {
			// Kept, so that a retry in this process records it: the
			// runner retries a transient failure in place.
			s.outcomes.keepUnrecorded(outKey, res.env)
			log.Error("outcome of a writes call could not be recorded yet; kept for a retry", "err", err)
			return res, err
		}
		res.env, res.recorded = final, true
		return res, nil
	}
	if te == nil && cacheable {
		if err := s.cache.put(ctx, cacheKey, &res.env, ttl); err != nil {
			log.Warn("cache store failed", "err", err)
		}
	}
	return res, nil
}

// priceEnvelope sets the envelope's cost: the tool's declared cost when the
// call is billable (the tool ran, or may have, and the result is not the
// cache's; envelope.Billable), else 0. Billing reads tool costs here only.
func priceEnvelope(env *envelope.ToolEnvelope, def *envelope.ToolDefinition) {
	env.Cost = 0
	if env.Billable() {
		env.Cost = def.Cost
	}
}

// checkOutput checks a tool's output: JSON, and valid against the tool's
// output schema. An empty output is null.
func (s *Service) checkOutput(ref envelope.ToolRef, schemas *toolapi.Schemas, out *json.RawMessage) *envelope.ToolError {
	if len(*out) == 0 {
		*out = json.RawMessage("null")
	}
	if !json.Valid(*out) {
		return envelope.NewToolError(envelope.CodeProviderError, "tool %s returned output that is not JSON", ref)
	}
	if schemas.Output != nil {
		if err := envelope.ValidateAgainst(ref.String()+" output", schemas.Output, *out); err != nil {
			return schemaFailure(envelope.CodeProviderError, err, "output of tool %s does not match its output schema", ref)
		}
	}
	return nil
}

// replayWrite answers a writes call whose outcome record exists: the
// recorded envelope, or, when its claimer stopped during the call, an UNKNOWN
// one, unless retry allows the call to run again: then stale is the claim
// to retake. handled false: there is no record, or stale is set; the call
// may run.
func (s *Service) replayWrite(ctx context.Context, res *execResult, key string, retry retryRule, log *slog.Logger) (handled bool, stale *staleClaim, err error) {
	base := res.env
	r, err := s.outcomes.settle(ctx, key, func(rec outcomeRecord, why string) envelope.ToolEnvelope {
		return unknownRetry(base, rec, s.now().UTC(), why)
	}, retry)
	if err != nil || !r.found {
		return false, nil, err
	}
	if r.stale != nil {
		log.Info("writes call cut short by its executor; its tool declares idempotent retries, so it runs again", "run", r.stale.rec.run()+1)
		return false, r.stale, nil
	}
	env, recorded := r.env, r.recorded
	outcome := "recorded"
	if !recorded {
		outcome = "unknown"
	}
	s.metrics.writeReplays.WithLabelValues(res.label, outcome).Inc()
	log.Info("writes call answered from its outcome record, not run again", "outcome", outcome)
	res.env, res.recorded = env, true
	return true, nil, nil
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
	return s.catalog.Resolve(ctx, s.reg, ref)
}

// toolResult is what a tool's goroutine hands back.
type toolResult struct {
	out   json.RawMessage
	err   error
	panic any
	stack []byte
	// at is when the tool returned (or was abandoned).
	at time.Time
}

// invoke runs the tool under timeout (its own, or what a retry has left of
// it) and classifies its failure. rerun is toolapi.Context.Rerun.
func (s *Service) invoke(ctx context.Context, impl toolapi.Tool, def *envelope.ToolDefinition, req *events.CallRequest, timeout time.Duration, rerun func() bool, log *slog.Logger) (json.RawMessage, *envelope.ToolError) {
	ref := def.Ref()
	// A run's deadline cuts its calls too: nothing of the run runs past it.
	byRun := false
	if req.RunDeadline != nil {
		if left := req.RunDeadline.Sub(s.now()); left < timeout {
			timeout, byRun = max(left, 0), true
		}
	}
	tctx, cancel := context.WithTimeoutCause(ctx, timeout, errToolTimeout)
	defer cancel()
	tc := toolapi.Context{TenantID: req.Tenant.ID(), RunID: req.RunID, CallID: req.CallID, Auth: secretsOf(ctx).authMap(), SecretDestinations: def.SecretDestinations, Log: log, Rerun: rerun}

	done := make(chan toolResult, 1)
	go func() {
		var r toolResult
		defer func() {
			if p := recover(); p != nil {
				r = toolResult{panic: p, stack: debug.Stack()}
			}
			r.at = time.Now()
			done <- r
		}()
		r.out, r.err = impl.Execute(tctx, req.Input, tc)
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
			r = toolResult{err: context.Cause(tctx), at: time.Now()}
		}
	}

	if r.panic != nil {
		log.Error("tool panicked", "panic", fmt.Sprint(r.panic), "stack", string(r.stack))
	}
	// A tool that failed once its time was up timed out, whatever it
	// failed with: its own ToolError, a plain error, a body read the
	// deadline cut (package web), a panic. Also when it failed at the
	// deadline before tctx's timer fired: a worker's tool, whose own
	// deadline is this one, sent with the call (workers.go). An output is
	// the outcome even when it came back after the limit (within
	// abandonAfter): the work was done, and a writes tool's effect
	// happened, which a TIMEOUT would hide.
	deadline, _ := tctx.Deadline()
	expired := errors.Is(context.Cause(tctx), errToolTimeout) || !r.at.Before(deadline)
	switch {
	case r.panic == nil && r.err == nil:
		return r.out, nil
	case cancels.CancelledBy(ctx) != "":
		// Its run was cancelled while it ran (cancel.go).
		return nil, events.CancelledCallError(true, cancels.CancelledBy(ctx))
	case ctx.Err() != nil:
		// Shutdown: the caller leaves the call for redelivery.
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s was interrupted", ref)
	case expired:
		if r.err != nil {
			log.Debug("tool failed after its time limit", "err", r.err)
		}
		if byRun {
			return nil, envelope.NewToolError(envelope.CodeTimeout, "tool %s was stopped at its run's deadline, %s after it started (its own limit is %s)",
				ref, timeout.Round(time.Millisecond), def.Timeout())
		}
		// The tool's timeout: a retry's counts from the call's first run.
		return nil, envelope.NewToolError(envelope.CodeTimeout, "tool %s timed out after %s", ref, def.Timeout())
	case r.panic != nil:
		return nil, envelope.NewToolError(envelope.CodeUnknown, "internal error in tool %s", ref)
	}
	var te *envelope.ToolError
	if errors.As(r.err, &te) && te.Code.Valid() {
		cp := *te
		return nil, &cp
	}
	log.Error("tool failed", "err", r.err)
	return nil, envelope.NewToolError(envelope.CodeUnknown, "internal error in tool %s", ref)
}

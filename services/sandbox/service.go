package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
)

// Consumer settings: one durable consumer shared by every replica.
const (
	// Durable is the name of the sandbox replicas' shared consumer.
	Durable = "sandbox"
)

// Service is the sandbox service: Start it once, Stop it to drain.
type Service struct {
	service.Core

	cfg     Config
	metrics *metrics

	engine atomic.Pointer[Engine] // set by Start
	stream jetstream.Stream
	// cancels are the runs cancelled lately and the jobs running here
	// (cancel.go).
	cancels *cancels.Runs
}

// New returns a sandbox service on d's JetStream. Zero fields of cfg take
// their defaults. It registers its metrics on d.Metrics (when set), reads no
// environment and does no I/O: Start finds the runtimes and connects it.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	d, m, err := service.Prepare("sandbox", d, cfg, newMetrics)
	if err != nil {
		return nil, err
	}
	return &Service{Core: d.Core("sandbox", m.consumers), cfg: cfg, metrics: m, cancels: cancels.New(0, 0, nil)}, nil
}

// Option adjusts the configuration Build read from the environment.
type Option func(*Config)

// Build reads the configuration from d.Getenv, applies opts and calls New. It
// is what the sandbox binary and `toolwire dev` run.
func Build(d service.Deps, opts ...Option) (*Service, error) {
	return service.BuildFrom("sandbox", d, ConfigFromEnv, New, opts...)
}

// Config returns the configuration the service runs with.
func (s *Service) Config() Config { return s.cfg }

// Engine returns the service's engine once started (nil before).
func (s *Service) Engine() *Engine { return s.engine.Load() }

// Start finds the runtimes that work here (a trial job in each), registers
// python_exec, and starts consuming jobs. ctx bounds the start (the trial
// jobs included); the consumer runs until Stop.
func (s *Service) Start(ctx context.Context) error {
	return s.StartWith(ctx, func(ctx, _ context.Context) error {
		engine, err := NewEngine(ctx, s.cfg, s.Log)
		if err != nil {
			return err
		}
		s.engine.Store(engine)
		// Registered first, so it runs last: after the consumer has drained.
		s.OnStopFunc(engine.Close)
		for _, n := range []string{RuntimeGVisor, RuntimeBwrap} {
			v := 0.0
			if engine.Problem(n) == nil {
				v = 1
			}
			s.metrics.available.WithLabelValues(n).Set(v)
		}
		reg, err := registry.Open(ctx, s.JS)
		if err != nil {
			return err
		}
		if err := reg.Ensure(ctx, PythonExecDefinition()); err != nil {
			return fmt.Errorf("register %s: %w", PythonExecRef, err)
		}
		s.stream, err = s.JS.Stream(ctx, events.StreamSandbox)
		if err != nil {
			return fmt.Errorf("stream %s: %w", events.StreamSandbox, err)
		}
		// The runs' cancel requests, before any job runs; unsubscribed at
		// Stop once the jobs in flight have drained.
		stopCancels, err := s.watchCancels()
		if err != nil {
			return err
		}
		s.OnStopFunc(stopCancels)
		if err := s.Consume(ctx, s.cfg.Concurrency, consume.RunnerConfig{
			Spec: provision.ConsumerSpec{
				Stream: events.StreamSandbox, Durable: Durable, Filters: events.Filters(events.FilterSandboxRequested),
				// A job is code that may crash its sandbox: a few tries,
				// then the dead letters.
				MaxDeliver: 4,
				// Short: a job of a replica that died is run again by
				// another while its call still waits for it. The runner
				// extends the jobs in hand every third of it, so a long
				// job of a live replica is not redelivered.
				AckWait: s.cfg.AckWait,
			},
			Handler: s.handle,
		}); err != nil {
			return err
		}
		s.Log.Info("sandbox started", "id", s.cfg.ID, "runtime", engine.Runtime(), "available", engine.Available(),
			"concurrency", s.cfg.Concurrency, "cgroups", engine.Cgroups(), "ack_wait", s.cfg.AckWait)
		return nil
	})
}

// handle runs one job and publishes its result. It returns an error
// (redelivery) only when the result cannot be published or a shutdown
// interrupts the job; a malformed event is dead-lettered at once.
func (s *Service) handle(ctx context.Context, d *consume.Delivery) error {
	if typ := d.Event.Type(); typ != events.TypeSandboxRequested {
		return consume.Permanent(fmt.Errorf("sandbox: event %s on %s has type %q, want %s", d.Event.ID(), d.Subject, typ, events.TypeSandboxRequested))
	}
	var job events.SandboxJob
	if err := events.DecodeData(d.Event, &job); err != nil {
		return consume.Permanent(err)
	}
	if err := errors.Join(events.ValidateRunID(job.RunID), events.ValidateCallID(job.CallID)); err != nil {
		return consume.Permanent(fmt.Errorf("sandbox: event %s: %w", d.Event.ID(), err))
	}
	rt := events.TraceOf(d.Event)
	tenantID := events.Ext(d.Event, events.ExtTenantID)
	log := s.Log.With("run_id", job.RunID, "call_id", job.CallID, "tool", job.Tool)
	// A job stored longer ago than the ack wait may have gone to another
	// replica meanwhile, also on its first delivery here: one that waited
	// in the client's pull buffer behind a job waiting for a slot is not
	// extended until the runner receives it (pkg/jetstream/consume,
	// Runner.dispatch). It runs only when no answer is stored.
	if d.Attempt > 1 || (d.Meta != nil && time.Since(d.Meta.Timestamp) > s.cfg.AckWait) {
		done, err := s.completed(ctx, &job)
		if err != nil {
			return err
		}
		if done {
			log.Info("job already answered; delivery acknowledged without running it again", "attempt", d.Attempt)
			return nil
		}
		if d.Attempt > 1 {
			// Its earlier attempt ended without an answer (its replica
			// died, or was stopped in the middle of it): it runs again in
			// the time its deadline leaves, or is answered TIMEOUT when
			// none is left (Engine.Run).
			log.Info("job redelivered without an answer; running it again", "attempt", d.Attempt,
				"time_left", time.Until(job.Deadline).Round(time.Millisecond))
		}
	}

	ctx, span := s.Tracer.Start(ctx, "sandbox "+job.Tool, trace.WithAttributes(
		attribute.String("toolwire.run_id", job.RunID),
		attribute.String("gen_ai.tool.call.id", job.CallID),
		attribute.String("toolwire.sandbox.language", job.Language),
	))
	defer span.End()
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()

	var res events.SandboxResult
	if err := job.Validate(); err != nil {
		// The caller waits for an answer: refuse the job with one.
		res = events.SandboxResult{RunID: job.RunID, CallID: job.CallID, Worker: s.cfg.ID,
			Error: envelope.NewToolError(envelope.CodeSandboxError, "the sandbox refused the job: %v", err)}
	} else if res, err = s.run(ctx, &job, tenantID, log); err != nil {
		span.SetStatus(codes.Error, "interrupted")
		return fmt.Errorf("job %s/%s: %w", job.RunID, job.CallID, err)
	}
	out, err := s.fitResult(&res, tenantID, rt, log)
	if err != nil {
		return consume.Permanent(err)
	}
	outcome := "ok"
	if res.Error != nil {
		outcome = string(res.Error.Code)
		if dd, ok := res.Error.Details.(ErrorDetails); ok && dd.Limit != "" {
			outcome += ":" + dd.Limit
		}
		span.SetStatus(codes.Error, res.Error.Message)
	}
	span.SetAttributes(attribute.String("toolwire.sandbox.runtime", res.Runtime), attribute.String("toolwire.sandbox.outcome", outcome))
	s.metrics.jobs.WithLabelValues(runtimeLabel(res.Runtime), outcome).Inc()
	s.metrics.duration.WithLabelValues(runtimeLabel(res.Runtime)).Observe(float64(res.DurationMS) / 1000)

	if err := s.Pub.Publish(ctx, out); err != nil {
		return err
	}
	log.Debug("job done", "runtime", res.Runtime, "outcome", outcome, "duration_ms", res.DurationMS)
	return nil
}

// run runs a valid job in the engine, unless its run was cancelled; a job
// whose run is cancelled while it runs is killed (cancel.go). The error is
// the engine's: a shutdown interrupted the job.
func (s *Service) run(ctx context.Context, job *events.SandboxJob, tenantID string, log *slog.Logger) (events.SandboxResult, error) {
	jctx, kill := context.WithCancelCause(ctx)
	defer kill(nil)
	untrack, said := s.cancels.Track(job.RunID, tenantOf(tenantID), kill)
	if untrack == nil {
		s.metrics.cancelled.WithLabelValues(cancelRefused).Inc()
		log.Info("job of a cancelled run not run", "reason", said)
		return events.SandboxResult{RunID: job.RunID, CallID: job.CallID, Worker: s.cfg.ID, Error: notRun(said)}, nil
	}
	defer untrack()
	res, err := s.engine.Load().Run(jctx, job)
	if said := cancels.CancelledBy(jctx); said != "" && ctx.Err() == nil && errors.Is(err, errInterrupted) {
		// Killed (every process of it) because its run was cancelled.
		s.metrics.cancelled.WithLabelValues(cancelKilled).Inc()
		log.Info("job killed: its run was cancelled", "reason", said, "runtime", res.Runtime)
		res.Output, res.Error, res.ExitCode = nil, events.CancelledCallError(true, said), -1
		return res, nil
	}
	return res, err
}

// hopHeadroom is room kept in a message for the headers the publisher adds
// (the hop's trace context).
const hopHeadroom = 1 << 10

// resultStderrBytes is how much of the program's stderr a result too large
// for one message keeps.
const resultStderrBytes = 2 << 10

// fitResult builds the result event, made to fit in one message: a result
// that cannot be published would be retried, its job run again and
// dead-lettered, and its caller would wait for nothing until its timeout.
// The program's stderr, a diagnostic, is cut first; if the output still does
// not fit, the result is SANDBOX_ERROR, limit output, saying what did not
// fit (the output's and stderr's sizes, the result's and the limit).
func (s *Service) fitResult(res *events.SandboxResult, tenantID string, rt events.RunTrace, log *slog.Logger) (events.Outgoing, error) {
	out, err := events.NewSandboxResult(s.cfg.Source, *res, tenantID, rt)
	if err != nil {
		return out, err
	}
	size, limit := s.messageSize(out)
	if size <= limit {
		return out, nil
	}
	outputBytes, stderrBytes := len(res.Output), len(res.Stderr)
	if stderrBytes > resultStderrBytes {
		res.Stderr, res.StderrTruncated = lastBytes([]byte(res.Stderr), resultStderrBytes), true
		if out, err = events.NewSandboxResult(s.cfg.Source, *res, tenantID, rt); err != nil {
			return out, err
		}
		if n, _ := s.messageSize(out); n <= limit {
			log.Warn("the job's stderr was cut to fit its result in one message", "stderr_bytes", stderrBytes, "limit", limit)
			return out, nil
		}
	}
	res.Output = nil
	res.Error = envelope.NewToolError(envelope.CodeSandboxError,
		"output limit hit: the program's output (%d bytes as JSON) and stderr (%d bytes) make a result of %d bytes, "+
			"more than the %d bytes one message may carry", outputBytes, stderrBytes, size, limit).
		WithDetails(ErrorDetails{Limit: LimitOutput, LimitValue: int64(limit), Runtime: res.Runtime})
	log.Warn("the job's result does not fit in one message; answered with an error", "err", res.Error.Message)
	return events.NewSandboxResult(s.cfg.Source, *res, tenantID, rt)
}

// messageSize returns the size of out as the server counts it against
// max_payload (its body and its headers; 0 when it cannot be encoded:
// Publish reports that), and the most a result may weigh.
func (s *Service) messageSize(out events.Outgoing) (size, limit int) {
	limit = s.maxMessageBytes() - hopHeadroom
	m, err := events.Encode(out.Subject, &out.Event)
	if err != nil {
		return 0, limit
	}
	size = len("NATS/1.0\r\n\r\n") + len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(v) + len(": \r\n")
		}
	}
	return size, limit
}

// maxMessageBytes is the server's max_payload, as the connection learnt it.
func (s *Service) maxMessageBytes() int {
	if nc := s.JS.Conn(); nc != nil {
		if mp := nc.MaxPayload(); mp > 0 {
			return int(mp)
		}
	}
	return 1 << 20 // the NATS default
}

// completed reports whether the job's result is already stored.
func (s *Service) completed(ctx context.Context, job *events.SandboxJob) (bool, error) {
	subj, err := events.SandboxSubject(job.RunID, job.CallID, "completed")
	if err != nil {
		return false, consume.Permanent(err)
	}
	return publish.Stored(ctx, s.stream, subj)
}

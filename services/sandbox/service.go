package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service"
)

// Consumer settings: one durable consumer shared by every replica.
const (
	// Durable is the name of the sandbox replicas' shared consumer.
	Durable = "sandbox"
	// FilterRequested selects the sandbox jobs.
	FilterRequested = events.Prefix + ".sandbox.*.*.requested"
)

// ErrStopped is returned by Start after Stop.
var ErrStopped = errors.New("sandbox: stopped")

// Service is the sandbox service: Start it once, Stop it to drain.
type Service struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	tracer  trace.Tracer
	metrics *metrics
	pub     *events.Publisher

	mu      sync.Mutex
	started bool
	stopped bool
	engine  *Engine
	stream  jetstream.Stream
	runner  *events.Runner

	stopOnce sync.Once
	stopErr  error
}

// New builds the sandbox service. Zero fields of cfg take their defaults.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sandbox config: %w", err)
	}
	if d.JS == nil {
		return nil, errors.New("sandbox: no JetStream connection")
	}
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp := d.Tracer
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	m, err := newMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg: cfg, js: d.JS, log: log, metrics: m,
		tracer: tp.Tracer("toolwire/sandbox"),
		pub:    events.NewPublisher(d.JS),
	}, nil
}

// Engine returns the service's engine once started (nil before).
func (s *Service) Engine() *Engine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.engine
}

// Start finds the runtimes that work here (a trial job in each), registers
// python_exec, and starts consuming jobs.
func (s *Service) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return ErrStopped
	case s.started:
		return errors.New("sandbox: already started")
	}
	defer func() {
		if err != nil {
			s.stopped = true
		}
	}()
	s.engine, err = NewEngine(ctx, s.cfg, s.log)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.engine.Close()
		}
	}()
	for _, n := range []string{RuntimeGVisor, RuntimeBwrap} {
		v := 0.0
		if s.engine.Problem(n) == nil {
			v = 1
		}
		s.metrics.available.WithLabelValues(n).Set(v)
	}
	reg, err := registry.Open(ctx, s.js)
	if err != nil {
		return err
	}
	if err := reg.Ensure(ctx, PythonExecDefinition()); err != nil {
		return fmt.Errorf("register %s: %w", PythonExecRef, err)
	}
	s.stream, err = s.js.Stream(ctx, events.StreamSandbox)
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.StreamSandbox, err)
	}
	s.runner, err = events.NewRunner(s.js, events.RunnerConfig{
		Spec: events.ConsumerSpec{
			Stream: events.StreamSandbox, Durable: Durable, Filters: []string{FilterRequested},
			// A job is code that may crash its sandbox: a few tries, then the
			// dead letters.
			MaxDeliver: 4,
		},
		Handler:     s.handle,
		Concurrency: s.cfg.Concurrency,
		Logger:      s.log,
	})
	if err != nil {
		return err
	}
	if err := s.runner.Start(ctx); err != nil {
		s.runner = nil
		return err
	}
	s.started = true
	s.log.Info("sandbox started", "id", s.cfg.ID, "runtime", s.engine.Runtime(), "available", s.engine.Available(),
		"concurrency", s.cfg.Concurrency, "cgroups", s.engine.Cgroups())
	return nil
}

// Stop stops pulling jobs and waits (bounded by ctx) for the jobs in flight.
// It is idempotent.
func (s *Service) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopped = true
		runner, started := s.runner, s.started
		s.mu.Unlock()
		if runner != nil {
			s.stopErr = runner.Stop(ctx)
		}
		s.mu.Lock()
		if s.engine != nil && s.stopErr == nil {
			// Jobs still running after a bounded drain keep their uids.
			s.engine.Close()
		}
		s.mu.Unlock()
		if started {
			s.log.Info("sandbox stopped", "err", s.stopErr)
		}
	})
	return s.stopErr
}

// handle runs one job and publishes its result. It returns an error
// (redelivery) only when the result cannot be published or a shutdown
// interrupts the job; a malformed event is dead-lettered at once.
func (s *Service) handle(ctx context.Context, d *events.Delivery) error {
	if typ := d.Event.Type(); typ != events.TypeSandboxRequested {
		return events.Permanent(fmt.Errorf("sandbox: event %s on %s has type %q, want %s", d.Event.ID(), d.Subject, typ, events.TypeSandboxRequested))
	}
	var job events.SandboxJob
	if err := events.DecodeData(d.Event, &job); err != nil {
		return events.Permanent(err)
	}
	if err := errors.Join(events.ValidateRunID(job.RunID), events.ValidateCallID(job.CallID)); err != nil {
		return events.Permanent(fmt.Errorf("sandbox: event %s: %w", d.Event.ID(), err))
	}
	rt := events.TraceOf(d.Event)
	tenantID := events.Ext(d.Event, events.ExtTenantID)
	log := s.log.With("run_id", job.RunID, "call_id", job.CallID, "tool", job.Tool)
	if d.Attempt > 1 {
		done, err := s.completed(ctx, &job)
		if err != nil {
			return err
		}
		if done {
			log.Info("job already answered; redelivery acknowledged without running it again", "attempt", d.Attempt)
			return nil
		}
	}

	ctx, span := s.tracer.Start(ctx, "sandbox "+job.Tool, trace.WithAttributes(
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
	} else {
		res, err = s.engine.Run(ctx, &job)
		if err != nil {
			span.SetStatus(codes.Error, "interrupted")
			return fmt.Errorf("job %s/%s: %w", job.RunID, job.CallID, err)
		}
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

	out, err := events.NewSandboxResult(s.cfg.Source, res, tenantID, rt)
	if err != nil {
		return events.Permanent(err)
	}
	if err := s.pub.Publish(ctx, out); err != nil {
		return err
	}
	log.Debug("job done", "runtime", res.Runtime, "outcome", outcome, "duration_ms", res.DurationMS)
	return nil
}

// completed reports whether the job's result is already stored.
func (s *Service) completed(ctx context.Context, job *events.SandboxJob) (bool, error) {
	subj, err := events.SandboxSubject(job.RunID, job.CallID, "completed")
	if err != nil {
		return false, events.Permanent(err)
	}
	return events.Stored(ctx, s.stream, subj)
}

func runtimeLabel(r string) string {
	if r == "" {
		return "none"
	}
	return r
}

type metrics struct {
	jobs      *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	inFlight  prometheus.Gauge
	available *prometheus.GaugeVec
}

// newMetrics registers the sandbox's metrics on reg; services sharing a
// registry share the collectors.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "toolwire", Subsystem: "sandbox", Name: "jobs_total",
			Help: "Sandbox jobs run, by runtime and outcome (ok, or the error code and the limit hit).",
		}, []string{"runtime", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "toolwire", Subsystem: "sandbox", Name: "job_duration_seconds",
			Help:    "Wall time of sandbox jobs, start of the runtime included, by runtime.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14), // 10ms to ~80s
		}, []string{"runtime"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "toolwire", Subsystem: "sandbox", Name: "jobs_in_flight",
			Help: "Sandbox jobs being run by this process.",
		}),
		available: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "toolwire", Subsystem: "sandbox", Name: "runtime_available",
			Help: "1 when the runtime passed its trial job at start, else 0.",
		}, []string{"runtime"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.jobs, m.duration, m.inFlight, m.available} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("sandbox metrics: %w", err)
			}
			switch existing := are.ExistingCollector.(type) {
			case *prometheus.CounterVec:
				if c == m.jobs {
					m.jobs = existing
				}
			case *prometheus.HistogramVec:
				m.duration = existing
			case prometheus.Gauge:
				m.inFlight = existing
			case *prometheus.GaugeVec:
				m.available = existing
			}
		}
	}
	return m, nil
}

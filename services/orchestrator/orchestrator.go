package orchestrator

import (
	"context"
	"fmt"
	"maps"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/pkg/service"
)

// The orchestrator's durable consumers.
const (
	DurableRuns      = "orchestrator-runs"
	DurableCalls     = "orchestrator-calls"
	DurableApprovals = "orchestrator-approvals"
)

// Service is the orchestrator. Any number of replicas share its durable
// consumers and the run state in KV; what one keeps in memory between events
// is a cache, or a request it holds (doc.go says what, and why that is safe).
type Service struct {
	service.Core

	cfg     Config
	schemas *envelope.Schemas
	metrics *metrics

	rules     *rules.Guard
	convs     *conversations
	deadlines *deadlines    // of the run requests this replica handles
	cancels   *cancels.Runs // the cancel requests heard (cancel.go)

	// Set up by Start.
	states  *stateStore
	history *history
	reg     *registry.Registry
	catalog *registry.Catalog
}

// New returns an orchestrator on d's JetStream. It registers its metrics on
// d.Metrics (when set), reads no environment and does no I/O: Start connects
// it.
func New(d service.Deps, cfg Config) (*Service, error) {
	if cfg.TracesURLTemplate == "" {
		cfg.TracesURLTemplate = d.Common.TracesURLTemplate
	}
	cfg = cfg.WithDefaults()
	d, m, err := service.Prepare("orchestrator", d, cfg, newMetrics)
	if err != nil {
		return nil, err
	}
	cfg.Providers = cfg.serving()
	schemas, err := events.NewSchemas()
	if err != nil {
		return nil, err
	}
	return &Service{
		Core:      d.Core("orchestrator", m.consumers),
		cfg:       cfg,
		schemas:   schemas,
		metrics:   m,
		rules:     rules.NewGuard(),
		convs:     newConversations(),
		deadlines: newDeadlines(),
		cancels:   cancels.New(0, 0, nil),
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
func (s *Service) Start(ctx context.Context) error {
	return s.StartWith(ctx, func(ctx, life context.Context) error {
		kv, err := s.JS.KeyValue(ctx, provision.BucketRunState)
		if err != nil {
			return fmt.Errorf("orchestrator: open run state: %w", err)
		}
		s.states = newStateStore(kv)
		if s.reg, err = registry.Open(ctx, s.JS); err != nil {
			return fmt.Errorf("orchestrator: %w", err)
		}
		if s.catalog, err = s.reg.Watch(ctx); err != nil {
			return fmt.Errorf("orchestrator: %w", err)
		}
		s.OnStopFunc(s.catalog.Stop)
		s.history = &history{js: s.JS}
		if s.history.runs, err = s.JS.Stream(ctx, events.StreamRuns); err != nil {
			return fmt.Errorf("orchestrator: stream %s: %w", events.StreamRuns, err)
		}
		if s.history.calls, err = s.JS.Stream(ctx, events.StreamCalls); err != nil {
			return fmt.Errorf("orchestrator: stream %s: %w", events.StreamCalls, err)
		}
		if err := s.watchApprovals(ctx, life); err != nil {
			return err
		}
		// Cancels are heard before any run is handled here.
		if err := s.listenCancels(); err != nil {
			return err
		}
		// Once the consumers have stopped, the requests still held get
		// their timers (Stop runs in reverse order).
		s.OnStop(s.stopDeadlines)
		// The consumers stop first (Stop runs in reverse order): their
		// handlers read the catalog and may still be applying an approval.
		if err := s.Consume(ctx, s.cfg.Concurrency,
			consume.RunnerConfig{Spec: provision.ConsumerSpec{Stream: events.StreamRuns, Durable: DurableRuns,
				Filters:       events.Filters(events.FilterRunRequested),
				MaxAckPending: 4096, AckWait: s.cfg.AckWait}, Handler: s.handleRun, Undecodable: s.undecodableRequest},
			// A completion may lead to the next model call: the same ack
			// wait as a request (a live handler keeps extending it).
			consume.RunnerConfig{Spec: provision.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableCalls,
				Filters: events.Filters(events.FilterCallCompleted), MaxAckPending: 4096, AckWait: s.cfg.AckWait},
				Handler: s.handleCallCompleted},
			consume.RunnerConfig{Spec: provision.ConsumerSpec{Stream: events.StreamCalls, Durable: DurableApprovals,
				Filters:       events.Filters(events.FilterCallApprovalRequired),
				MaxAckPending: 4096, AckWait: s.cfg.shortAckWait()}, Handler: s.handleApproval},
			s.intakeSpec(),
			s.cancelSpec(),
		); err != nil {
			return err
		}
		// The reaper of the runs past their deadline (reaper.go) stops first.
		if err := s.startReaper(ctx); err != nil {
			return err
		}
		if err := s.startCancelGrace(ctx); err != nil {
			return err
		}
		s.Log.Info("orchestrator started", "instance", s.cfg.InstanceID, "providers", s.cfg.Providers.Names(),
			"model_timeout", s.cfg.ModelTimeout, "run_deadline", s.cfg.RunDeadline)
		return nil
	})
}

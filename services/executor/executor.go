package executor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/events/secrets"
	"github.com/toolwire/toolwire/pkg/service"
)

// Consumer settings: one durable consumer shared by every replica.
const (
	// Durable is the name of the executors' shared consumer.
	Durable = "executor"
	// FilterApproved selects the approved tool calls.
	FilterApproved = events.Prefix + ".call.*.*.approved"
	// maxAckPending bounds calls in flight across all replicas: room for 64
	// replicas at the default concurrency.
	maxAckPending = 4096
	// defaultAbandonAfter is how long a tool may go on after its context ended
	// before the executor stops waiting for it and answers TIMEOUT.
	defaultAbandonAfter = 2 * time.Second
)

// ErrStopped is returned by Start after Stop.
var ErrStopped = errors.New("executor: stopped")

// Option adjusts a Service.
type Option func(*options)

type options struct {
	tools   []Tool
	real    realToolOptions
	keyring *secrets.Keyring // secrets.go
}

// WithTools adds in-process tools beside the built-ins (for example test
// tools). Each is keyed by its definition's builtin implementation key, and its
// definition is ensured in the registry at Start like the built-ins'.
func WithTools(tools ...Tool) Option {
	return func(o *options) { o.tools = append(o.tools, tools...) }
}

// Service is the executor: Start it once, Stop it to drain.
type Service struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	tracer  trace.Tracer
	metrics *metrics
	pub     *events.Publisher
	tools   map[string]Tool // by builtin key
	defs    []envelope.ToolDefinition
	schemas *schemaCache
	now     func() time.Time
	// abandonAfter is how long to wait for a tool that ignores its context.
	abandonAfter time.Duration
	circuits     *circuits
	cache        *toolCache
	limiter      *rateLimiter
	outcomes     *outcomes
	// real holds the web client and the MCP sessions (resolve.go).
	real *realTools
	// secrets opens the secrets of the tools that need some (secrets.go).
	secrets *secretResolver
	// previews answers the guard's dry-run requests (preview.go).
	previews *previewServer

	mu       sync.Mutex
	started  bool
	stopped  bool
	released bool
	reg      *registry.Registry
	catalog  *registry.Catalog
	calls    jetstream.Stream
	runner   *events.Runner
	unwatch  context.CancelFunc

	stopOnce sync.Once
	stopErr  error
}

// New builds the executor from the service's dependencies. Zero fields of cfg
// take their defaults.
func New(d service.Deps, cfg Config, opts ...Option) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("executor config: %w", err)
	}
	if d.JS == nil {
		return nil, errors.New("executor: no JetStream connection")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
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
	s := &Service{
		cfg:          cfg,
		js:           d.JS,
		log:          log,
		tracer:       tp.Tracer("toolwire/executor"),
		metrics:      m,
		pub:          events.NewPublisher(d.JS),
		tools:        map[string]Tool{},
		schemas:      newSchemaCache(),
		now:          time.Now,
		abandonAfter: defaultAbandonAfter,
	}
	s.circuits = newCircuits(cfg.CircuitFailures, cfg.CircuitOpen, func() time.Time { return s.now() }, m)
	if s.secrets, err = newSecretResolver(d, o.keyring); err != nil {
		return nil, err
	}
	rts, realTools, err := newRealTools(d, o.real, log)
	if err != nil {
		return nil, err
	}
	s.real = rts
	for _, t := range append(append(Builtins(), realTools...), o.tools...) {
		if err := s.addTool(t); err != nil {
			rts.close()
			return nil, err
		}
	}
	sort.Slice(s.defs, func(i, j int) bool { return s.defs[i].Ref().String() < s.defs[j].Ref().String() })
	return s, nil
}

// addTool checks a tool's definition (fields, builtin key, schemas) and keys
// it by its builtin key.
func (s *Service) addTool(t Tool) error {
	def := t.Definition()
	if err := def.Validate(); err != nil {
		return fmt.Errorf("executor: tool %s: %w", def.Ref(), err)
	}
	key, err := builtinKey(&def)
	if err != nil {
		return fmt.Errorf("executor: tool %s: %w", def.Ref(), err)
	}
	if _, dup := s.tools[key]; dup {
		return fmt.Errorf("executor: two tools have the builtin key %q", key)
	}
	if _, err := s.schemas.get(&def); err != nil {
		return fmt.Errorf("executor: tool %s: %w", def.Ref(), err)
	}
	s.tools[key] = t
	s.defs = append(s.defs, def)
	return nil
}

// Definitions returns the definitions of the tools this executor implements,
// sorted by name@version.
func (s *Service) Definitions() []envelope.ToolDefinition {
	return append([]envelope.ToolDefinition(nil), s.defs...)
}

// Start publishes the executor's tool definitions in the registry, starts
// watching the registry and starts consuming approved calls. ctx bounds the
// start; the watch and the consumer outlive it until Stop. A Start that fails
// releases what it started and leaves the service stopped.
func (s *Service) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return ErrStopped
	case s.started:
		return errors.New("executor: already started")
	}
	defer func() {
		if err != nil {
			// A failed start releases what it started; the service is spent.
			s.stopped = true
			s.release()
		}
	}()

	s.reg, err = registry.Open(ctx, s.js)
	if err != nil {
		return err
	}
	for i := range s.defs {
		if err := s.reg.Ensure(ctx, s.defs[i]); err != nil {
			return fmt.Errorf("register %s: %w", s.defs[i].Ref(), err)
		}
	}
	if err := s.watch(ctx); err != nil {
		return err
	}
	s.warmSchemas()

	if err := s.openState(ctx); err != nil {
		return err
	}
	if s.previews, err = s.servePreviews(ctx); err != nil {
		return err
	}
	s.calls, err = s.js.Stream(ctx, events.StreamCalls)
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.StreamCalls, err)
	}
	s.runner, err = events.NewRunner(s.js, events.RunnerConfig{
		Spec: events.ConsumerSpec{
			Stream:        events.StreamCalls,
			Durable:       Durable,
			Filters:       []string{FilterApproved},
			MaxAckPending: maxAckPending,
			AckWait:       s.cfg.AckWait,
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
	s.log.Info("executor started", "id", s.cfg.ID, "concurrency", s.cfg.Concurrency, "tools", len(s.defs))
	return nil
}

// openState opens the KV buckets of the cache, the rate limits and the
// outcomes of writes calls.
func (s *Service) openState(ctx context.Context) error {
	open := func(bucket string) (jetstream.KeyValue, error) {
		kv, err := s.js.KeyValue(ctx, bucket)
		if err != nil {
			return nil, fmt.Errorf("kv %s: %w", bucket, err)
		}
		return kv, nil
	}
	cache, err := open(events.BucketCache)
	if err != nil {
		return err
	}
	rate, err := open(events.BucketRate)
	if err != nil {
		return err
	}
	outs, err := open(events.BucketOutcomes)
	if err != nil {
		return err
	}
	nonce := make([]byte, 6)
	if _, err := rand.Read(nonce); err != nil {
		return fmt.Errorf("executor nonce: %w", err)
	}
	now := func() time.Time { return s.now() }
	s.cache = &toolCache{kv: cache, js: s.js}
	s.limiter = &rateLimiter{kv: rate, now: now}
	s.outcomes = &outcomes{kv: outs, owner: s.cfg.ID + "/" + hex.EncodeToString(nonce), lease: s.cfg.ClaimLease, now: now, log: s.log}
	return nil
}

// watch starts the registry catalog. It must follow the registry until Stop,
// not until ctx (a start deadline) ends: the watch gets a context of its own,
// cancelled by Stop, and ctx only bounds the wait for the initial contents.
// (A nats.go KV watcher unsubscribes when its context ends; registry.Watch
// guards against that too in newer versions, and this stays correct either
// way.)
func (s *Service) watch(ctx context.Context) error {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopBound := context.AfterFunc(ctx, cancel)
	cat, err := s.reg.Watch(wctx)
	if !stopBound() {
		// ctx ended: the watch is cancelled with it.
		if cat != nil {
			cat.Stop()
		}
		cancel()
		return fmt.Errorf("registry watch: %w", context.Cause(ctx))
	}
	if err != nil {
		cancel()
		return err
	}
	s.catalog, s.unwatch = cat, cancel
	return nil
}

// warmSchemas compiles the schemas of every registry entry this executor runs.
func (s *Service) warmSchemas() {
	for _, e := range s.catalog.Entries() {
		key, err := builtinKey(&e.Definition)
		if err != nil {
			continue
		}
		if _, ok := s.tools[key]; !ok {
			continue
		}
		if _, err := s.schemas.get(&e.Definition); err != nil {
			s.log.Warn("registry entry has schemas that do not compile; its calls will fail",
				"tool", e.Definition.Ref().String(), "err", err)
		}
	}
}

// Stop stops pulling calls, waits (bounded by ctx) for the calls in flight to
// finish and be acknowledged, then stops the registry watch. It is idempotent;
// after Stop the service cannot be started again.
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
		s.release()
		s.mu.Unlock()
		if started {
			s.log.Info("executor stopped", "err", s.stopErr)
		}
	})
	return s.stopErr
}

// release stops the registry watch, once; the caller holds s.mu. The catalog
// stays readable (frozen) for a call that outlived a bounded Stop.
func (s *Service) release() {
	if s.released {
		return
	}
	s.released = true
	s.previews.stop()
	s.real.close()
	if s.catalog != nil {
		s.catalog.Stop()
	}
	if s.unwatch != nil {
		s.unwatch()
	}
}

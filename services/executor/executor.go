package executor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Consumer settings: one durable consumer per queue, shared by every replica
// that serves the queue.
const (
	// Durable is the name of the consumer of the default queue, and the
	// prefix of the others' (DurableFor).
	Durable = "executor"
	// maxAckPending bounds the calls of one queue in flight across all
	// replicas: room for 64 replicas at the default concurrency.
	maxAckPending = 4096
	// maxDeliver bounds the deliveries of one call before a failing one is
	// dead-lettered (the runner's default, named here because the retries
	// of idempotent writes tools keep a delivery in reserve: retry.go).
	maxDeliver = 8
	// defaultAbandonAfter is how long a tool may go on after its context ended
	// before the executor stops waiting for it and answers TIMEOUT.
	defaultAbandonAfter = 2 * time.Second
)

// DurableFor names the durable consumer of a queue's approved calls, which
// every replica serving the queue shares: "executor-<queue>", and for the
// default queue "executor" itself. The default queue keeps the name the
// executor's one consumer had before queues existed, so that a deployment
// that upgrades finds its consumer (its position, its dead letters on
// toolwire.dlq.TOOLWIRE_CALLS.executor, the dashboards watching it) where it
// was, its filter narrowed to the default queue, rather than an abandoned
// consumer beside a new one. Queue names are subject tokens without dots, so
// no two queues share a name.
func DurableFor(queue string) string {
	if queue == envelope.DefaultQueue {
		return Durable
	}
	return Durable + "-" + queue
}

// Service is the executor: Start it once, Stop it to drain.
type Service struct {
	service.Core

	cfg     Config
	metrics *metrics
	tools   map[string]toolapi.Tool // by builtin key
	defs    []envelope.ToolDefinition
	schemas *schemaCache
	now     func() time.Time
	// abandonAfter is how long to wait for a tool that ignores its context.
	abandonAfter time.Duration
	circuits     *circuits
	// secrets opens the secrets of the tools that need some (secrets.go).
	secrets *secretResolver
	// opened are the opened Config.Families; kinds run the registry
	// entries that are not builtin (resolve.go).
	opened []Opened
	kinds  map[envelope.ImplementationKind]Kind

	// Set by Start, before the consumer and the preview server run.
	reg      *registry.Registry
	catalog  *registry.Catalog
	workers  *workerQueues // the worker queues it consumes (workers.go)
	calls    jetstream.Stream
	cache    *toolCache
	limiter  *rateLimiter
	outcomes *outcomes
	// cancels are the runs cancelled lately and the calls running here
	// (cancel.go).
	cancels *cancels.Runs
	// peers are the executors' heartbeats, with their circuits: a tool one
	// replica found down fails fast on every replica (health.go).
	peers *registry.Workers
	// instance is this process's heartbeat instance.
	instance string
}

// New builds the executor from the service's dependencies and cfg (zero
// fields take their defaults). It reads no environment and does no I/O:
// Start connects it.
func New(d service.Deps, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	d, m, err := service.Prepare("executor", d, cfg, newMetrics)
	if err != nil {
		return nil, err
	}
	s := &Service{
		Core:         d.Core("executor", m.consumers),
		cfg:          cfg,
		metrics:      m,
		tools:        map[string]toolapi.Tool{},
		schemas:      newSchemaCache(),
		now:          time.Now,
		abandonAfter: defaultAbandonAfter,
		secrets:      &secretResolver{js: d.JS, keys: cfg.Keyring},
		kinds:        map[envelope.ImplementationKind]Kind{},
	}
	s.cancels = cancels.New(0, 0, func() time.Time { return s.now() })
	s.circuits = newCircuits(cfg.CircuitFailures, cfg.CircuitOpen, func() time.Time { return s.now() }, m)
	var tools []toolapi.Tool
	host := Host{JS: s.JS, Pub: s.Pub, Source: cfg.Source, Log: s.Log,
		SandboxJobs: JobCounters{PublishFailures: m.sandboxJobFailures, Resends: m.sandboxJobResends}}
	for _, f := range cfg.Families {
		o, err := f.Open(host)
		if err != nil {
			return nil, fmt.Errorf("executor: %w", err)
		}
		s.opened = append(s.opened, o)
		tools = append(tools, o.Tools...)
		for k, kind := range o.Kinds {
			if _, dup := s.kinds[k]; dup {
				return nil, fmt.Errorf("executor: two families run the implementation kind %q", k)
			}
			s.kinds[k] = kind
		}
	}
	for _, t := range slices.Concat(tools, cfg.Tools) {
		if err := s.addTool(t); err != nil {
			return nil, err
		}
	}
	sort.Slice(s.defs, func(i, j int) bool { return s.defs[i].Ref().String() < s.defs[j].Ref().String() })
	return s, nil
}

// Build reads the configuration from d.Getenv, applies opts and calls New:
// an executor of the tools the options give it, and no others (what a
// worker runs). The executor binary and `toolwire dev` run standard.Build,
// which adds the standard families.
func Build(d service.Deps, opts ...Option) (*Service, error) {
	return service.BuildFrom("executor", d, ConfigFromEnv, New, opts...)
}

// Config returns the configuration the service runs with.
func (s *Service) Config() Config { return s.cfg }

// addTool checks a tool's definition (fields, builtin key, schemas) and keys
// it by its builtin key.
func (s *Service) addTool(t toolapi.Tool) error {
	def := t.Definition()
	if err := def.Validate(); err != nil {
		return fmt.Errorf("executor: tool %s: %w", def.Ref(), err)
	}
	key, err := toolapi.BuiltinKey(&def)
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
// watching the registry, answering previews and consuming approved calls.
// ctx bounds the start; the watch, the families (an MCP server's sessions), the preview server and
// the consumer run until Stop. A Start that fails releases what it started
// and leaves the service stopped.
func (s *Service) Start(ctx context.Context) error {
	return s.StartWith(ctx, func(ctx, life context.Context) error {
		// Released last: by then no call is in flight.
		s.OnStopFunc(func() { s.Log.Info("executor stopped", "id", s.cfg.ID) })
		for _, o := range s.opened {
			if o.Close != nil {
				s.OnStopFunc(o.Close)
			}
			if o.Start != nil {
				if err := o.Start(life); err != nil {
					return err
				}
			}
		}

		var err error
		if s.reg, err = registry.Open(ctx, s.JS); err != nil {
			return err
		}
		for i := range s.defs {
			if err := s.reg.Ensure(ctx, s.defs[i]); err != nil {
				return fmt.Errorf("register %s: %w", s.defs[i].Ref(), err)
			}
		}
		// The catalog stays readable (frozen) after Stop, for a call that
		// outlived a bounded Stop.
		if s.catalog, err = s.reg.Watch(ctx); err != nil {
			return err
		}
		s.OnStopFunc(s.catalog.Stop)
		s.warmSchemas()

		if err := s.openState(ctx, life); err != nil {
			return err
		}
		previews, err := s.servePreviews(life)
		if err != nil {
			return err
		}
		s.OnStopFunc(previews.stop)
		s.calls, err = s.JS.Stream(ctx, events.StreamCalls)
		if err != nil {
			return fmt.Errorf("stream %s: %w", events.StreamCalls, err)
		}
		specs := make([]consume.RunnerConfig, 0, len(s.cfg.Queues))
		for _, q := range s.cfg.Queues {
			filter, err := events.ApprovedFilter(q)
			if err != nil {
				return err
			}
			specs = append(specs, consume.RunnerConfig{
				Spec: provision.ConsumerSpec{
					Stream:        events.StreamCalls,
					Durable:       DurableFor(q),
					Filters:       []string{filter},
					MaxAckPending: maxAckPending,
					MaxDeliver:    maxDeliver,
					AckWait:       s.cfg.AckWait,
				},
				Handler: s.handle,
				Logger:  s.Log.With("queue", q),
			})
		}
		// The runs' cancel requests, before any call runs; unsubscribed at
		// Stop once the calls in flight have drained.
		stopCancels, err := s.watchCancels()
		if err != nil {
			return err
		}
		s.OnStopFunc(stopCancels)
		// The other executors' circuits, read by every call (peerRefusal):
		// watched before the first call can come, stopped after the last
		// has drained.
		if s.peers, err = registry.WatchWorkers(ctx, s.JS, s.now); err != nil {
			return fmt.Errorf("executor: %w", err)
		}
		s.OnStopFunc(s.peers.Stop)
		// First at Stop: drains the calls in flight.
		if err := s.Consume(ctx, s.cfg.Concurrency, specs...); err != nil {
			return err
		}
		// Announced last, once every queue's consumer runs; at Stop, withdrawn
		// first (before the consumers drain), so that no new call is routed here.
		beats, err := s.startHeartbeats(ctx, life)
		if err != nil {
			return err
		}
		s.OnStop(beats.end)
		s.circuits.onOpen(beats.kick) // a circuit that opens is announced at once
		// The workers' requests, and the queues of the workers alive now.
		stopWorkers, err := s.serveWorkers(ctx, life)
		if err != nil {
			return err
		}
		s.OnStopFunc(stopWorkers)
		s.Log.Info("executor started", "id", s.cfg.ID, "queues", s.cfg.Queues, "concurrency", s.cfg.Concurrency, "tools", len(s.defs))
		return nil
	})
}

// openState opens the KV buckets of the cache, the rate limits and the
// outcomes of writes calls. The heartbeats of writes calls' claims run on
// life.
func (s *Service) openState(ctx, life context.Context) error {
	open := func(bucket string) (jetstream.KeyValue, error) {
		kv, err := s.JS.KeyValue(ctx, bucket)
		if err != nil {
			return nil, fmt.Errorf("kv %s: %w", bucket, err)
		}
		return kv, nil
	}
	cache, err := open(provision.BucketCache)
	if err != nil {
		return err
	}
	rate, err := open(provision.BucketRate)
	if err != nil {
		return err
	}
	outs, err := open(provision.BucketOutcomes)
	if err != nil {
		return err
	}
	nonce := make([]byte, 6)
	if _, err := rand.Read(nonce); err != nil {
		return fmt.Errorf("executor nonce: %w", err)
	}
	now := func() time.Time { return s.now() }
	s.cache = &toolCache{kv: cache, js: s.JS}
	s.limiter = &rateLimiter{kv: rate, now: now}
	s.outcomes = &outcomes{kv: outs, owner: s.cfg.ID + "/" + hex.EncodeToString(nonce), lease: s.cfg.ClaimLease,
		now: now, log: s.Log, life: life}
	return nil
}

// warmSchemas compiles the schemas of every registry entry this executor runs.
func (s *Service) warmSchemas() {
	for _, e := range s.catalog.Entries() {
		key, err := toolapi.BuiltinKey(&e.Definition)
		if err != nil {
			continue
		}
		if _, ok := s.tools[key]; !ok {
			continue
		}
		if _, err := s.schemas.get(&e.Definition); err != nil {
			s.Log.Warn("registry entry has schemas that do not compile; its calls will fail",
				"tool", e.Definition.Ref().String(), "err", err)
		}
	}
}

package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/service"
)

// Name is the service name of a worker: its logs' "service", its spans'
// service.name (toolwire-worker unless OTEL_SERVICE_NAME says otherwise).
const Name = "worker"

// DefaultHTTPAddr is where Run serves /healthz, /readyz and /metrics when
// TOOLWIRE_HTTP_ADDR is unset: a free loopback port (logged at start), so
// that several workers on one machine do not collide.
const DefaultHTTPAddr = "127.0.0.1:0"

// Config configures a Worker. The zero value serves tools that each name
// their queue, configured by the environment.
type Config struct {
	// Queue is the queue of the tools that name none (Def.Queue).
	Queue string
	// Getenv is the environment Run reads (NATS_URL, TOOLWIRE_LOG_LEVEL,
	// TOOLWIRE_HTTP_ADDR, OTEL_*, the executor's TOOLWIRE_* settings such as
	// TOOLWIRE_MASTER_KEYS and TOOLWIRE_MAX_OUTPUT_BYTES), and Start the
	// executor's settings; default os.Getenv.
	Getenv func(string) string
	// Logger, Metrics and Tracer are used by Start (Run makes its own, as
	// every toolwire service does); default: discard, none, none.
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	Tracer  trace.TracerProvider
	// ID names the worker process in the executors' records (its
	// heartbeats, the outcome of a call it stopped during); default
	// TOOLWIRE_WORKER_ID, else <hostname>-<pid>.
	ID string
	// Concurrency bounds the calls the worker runs at once, over all its
	// queues; default DefaultConcurrency. The executor bounds what it hands
	// out too (TOOLWIRE_EXECUTOR_CONCURRENCY).
	Concurrency int
	// Heartbeat is how often the worker announces itself on each queue;
	// default DefaultHeartbeat.
	Heartbeat time.Duration
}

// Defaults of Config.
const (
	DefaultConcurrency = 16
	DefaultHeartbeat   = 5 * time.Second
)

// Worker serves a set of tools on their queues. Run it (its own process) or
// Start and Stop it (inside a process that has a JetStream connection).
type Worker struct {
	cfg   Config
	tools []*Tool

	mu  sync.Mutex
	srv *server // set by Start
}

// New returns a worker that serves tools. Problems with the tools or cfg are
// reported by Definitions, Run and Start.
func New(cfg Config, tools ...*Tool) *Worker {
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	return &Worker{cfg: cfg, tools: slices.Clone(tools)}
}

// Definitions returns the registry definitions of the worker's tools, each
// with its queue, or every problem of the tools and the configuration.
func (w *Worker) Definitions() ([]envelope.ToolDefinition, error) {
	var errs []error
	if w.cfg.Queue != "" {
		if err := envelope.ValidateQueue(w.cfg.Queue); err != nil {
			errs = append(errs, fmt.Errorf("worker: %w", err))
		} else if w.cfg.Queue == envelope.DefaultQueue {
			errs = append(errs, fmt.Errorf("worker: %w", errDefaultQueue))
		}
	}
	if len(w.tools) == 0 {
		errs = append(errs, errors.New("worker: no tools to serve"))
	}
	defs := make([]envelope.ToolDefinition, 0, len(w.tools))
	seen := map[string]bool{}
	for i, t := range w.tools {
		if t == nil {
			errs = append(errs, fmt.Errorf("worker: tool %d is nil", i))
			continue
		}
		def, err := t.Definition()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if def.Queue == "" {
			def.Queue = w.cfg.Queue
		}
		if def.Queue == "" {
			errs = append(errs, fmt.Errorf("worker: tool %s names no queue, and neither does the worker's Config", def.Ref()))
		}
		if seen[def.Ref().String()] {
			errs = append(errs, fmt.Errorf("worker: tool %s is given twice", def.Ref()))
		}
		seen[def.Ref().String()] = true
		defs = append(defs, def)
	}
	return defs, errors.Join(errs...)
}

// queues returns the queues of defs, sorted: those the worker serves.
func (w *Worker) queues(defs []envelope.ToolDefinition) []string {
	var qs []string
	for _, d := range defs {
		if !slices.Contains(qs, d.Queue) {
			qs = append(qs, d.Queue)
		}
	}
	slices.Sort(qs)
	return qs
}

// Run runs the worker as a toolwire service until ctx ends: connects to
// NATS_URL, provisions the streams and buckets if they are missing, serves
// /healthz, /readyz and /metrics on TOOLWIRE_HTTP_ADDR (default a free
// loopback port), registers the tools and serves their calls; then drains
// the calls in flight and returns. It returns at once, with every problem,
// when a tool's declaration or the configuration is wrong, or when the
// registry holds one of the tools' versions with another definition
// (ErrConflict).
func (w *Worker) Run(ctx context.Context) error {
	if _, err := w.Definitions(); err != nil {
		return err
	}
	return service.Run(ctx, Name, DefaultHTTPAddr, w.cfg.Getenv,
		func(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
			return &component{w: w, d: d}, nil, nil
		})
}

// Main runs the worker as a program's main function, as the service binaries
// run (package service's Main): Run until SIGINT or SIGTERM, then drain the
// calls in flight and return. When Run fails (a bad declaration, no NATS, a
// registry conflict), Main prints the error on standard error and exits
// with status 1.
func (w *Worker) Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := w.Run(ctx); err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, Name+": ") {
			msg = Name + ": " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}

// Start registers the tools and starts serving their calls on js's
// connection, to a NATS where a toolwire executor runs (a `toolwire dev`,
// package stack, a cluster). ctx bounds the start only. A worker starts
// once; Stop drains it.
func (w *Worker) Start(ctx context.Context, js jetstream.JetStream) error {
	if js == nil {
		return errors.New("worker: no JetStream connection")
	}
	c := &component{w: w, d: service.Deps{
		Common: service.Common{Name: Name},
		Conn:   js.Conn(), JS: js, Log: w.cfg.Logger, Tracer: w.cfg.Tracer, Metrics: w.cfg.Metrics, Getenv: w.cfg.Getenv,
	}}
	return c.Start(ctx)
}

// Stop stops taking calls, waits (within ctx) for the calls in flight and
// tells the executors it is gone. Stopping a worker that was not started
// does nothing.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	srv := w.srv
	w.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.stop(ctx)
}

// component is a worker as a service.Component.
type component struct {
	w *Worker
	d service.Deps
}

func (c *component) Start(ctx context.Context) error {
	w := c.w
	defs, err := w.Definitions()
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.srv != nil {
		return errors.New("worker: already started")
	}
	nc := c.d.Conn
	if nc == nil && c.d.JS != nil {
		nc = c.d.JS.Conn()
	}
	if nc == nil {
		return errors.New("worker: no NATS connection")
	}
	d := c.d.WithDefaults()
	metrics := w.cfg.Metrics
	if metrics == nil {
		metrics = c.d.Metrics // Run's registry, served on /metrics
	}
	srv, err := newServer(w, nc, defs, d.Log, metrics)
	if err != nil {
		return err
	}
	if err := srv.start(ctx); err != nil {
		return err
	}
	w.srv = srv
	return nil
}

func (c *component) Stop(ctx context.Context) error { return c.w.Stop(ctx) }

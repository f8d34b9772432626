// Package service is the skeleton every toolwire service shares: the Core
// each one embeds (its Lifecycle, JetStream, logger, tracer, publisher and
// consumers), the common configuration and the Env readers every
// ConfigFromEnv uses, the Metrics helper and its naming scheme, the NATS
// connection, provisioning, OpenTelemetry, the probe and metrics server, and
// Run: signal-aware start and ordered shutdown of a service binary.
//
// A service package offers the same constructors as every other: a Config
// with WithDefaults() Config (every zero field set to its default) and
// Validate() error (after defaults); ConfigFromEnv(getenv), which reads it
// from the environment, and EnvVars, which documents what that reads;
// New(Deps, Config) (*Service, error), which applies the defaults, reads no
// environment and does no I/O (Prepare is its common part); and an Option
// type, func(*Config), with Build(Deps, ...Option) (*Service, error), which
// reads its Config from Deps.Getenv, applies the options and calls New
// (BuildFrom). Its binary's main and `toolwire dev` (package stack) both use
// Build.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service/identity"
)

// Environment variables read by every service.
const (
	EnvNATSURL        = "NATS_URL"
	EnvNATSSeedFile   = "TOOLWIRE_NATS_NKEY_SEED_FILE"
	EnvNATSCreds      = "NATS_CREDS"
	EnvNATSInbox      = "TOOLWIRE_NATS_INBOX_PREFIX"
	EnvHTTPAddr       = "TOOLWIRE_HTTP_ADDR"
	EnvReplicas       = "TOOLWIRE_STREAM_REPLICAS"
	EnvStreamMaxAge   = "TOOLWIRE_STREAM_MAX_AGE"
	EnvStreamMaxBytes = "TOOLWIRE_STREAM_MAX_BYTES"
	EnvLogLevel       = "TOOLWIRE_LOG_LEVEL"
	EnvTracesTemplate = "TOOLWIRE_TRACES_URL_TEMPLATE"
	EnvOTLPEndpoint   = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvOTLPTraces     = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvOTelService    = "OTEL_SERVICE_NAME"
	EnvOTelExporter   = "OTEL_TRACES_EXPORTER"
)

// CommonEnvVars documents the variables of Common and of the telemetry every
// service reads.
func CommonEnvVars() []Var {
	return []Var{
		{EnvNATSURL, "NATS server URL(s), comma-separated", "nats://nats:4222"},
		{EnvNATSSeedFile, "file with the service's NATS nkey seed (a user seed, SU..., mode 0600): it connects as that user, whose permissions the server checks (docs/operations.md: Who may publish what)", "/run/secrets/toolwire-nats.nk"},
		{EnvNATSCreds, "a NATS .creds file (user JWT and seed, for an operator/account setup) to connect with, instead of a seed file", "/run/secrets/toolwire.creds"},
		{EnvNATSInbox, "prefix of the service's NATS reply subjects; default with credentials `_INBOX_<role>` (what the role may subscribe to; `_INBOX_worker` for a worker), else `_INBOX`", "_INBOX_producer"},
		{EnvHTTPAddr, "host:port of the service's HTTP server (probes, /metrics, the recorder's API)", "127.0.0.1:9999"},
		{EnvReplicas, "replicas of the streams and buckets the service provisions (1 to 5); never lowered on what exists (see toolwire provision)", "3"},
		{EnvStreamMaxAge, "how long the event streams keep events (default 168h): long enough for the recorder to catch up after an outage; never shortened on what exists", "720h"},
		{EnvStreamMaxBytes, "bound of each event stream's size in MiB, oldest events first out past it (default: none but the age)", "10240"},
		{EnvLogLevel, "debug, info, warn or error", "debug"},
		{EnvTracesTemplate, "URL of a trace in your tracing UI, with {trace_id}; fills AgentOutputs.traces_url", "http://jaeger:16686/trace/{trace_id}"},
		{EnvOTLPEndpoint, "OTLP endpoint that receives the spans (unset, with OTEL_TRACES_EXPORTER unset: spans are not exported); every standard OTEL_EXPORTER_OTLP_* variable (protocol, headers, timeout, certificates) applies", "http://otel-collector:4318"},
		{EnvOTLPTraces, "OTLP endpoint for traces only", "http://otel-collector:4318/v1/traces"},
		{EnvOTelService, "service.name of the spans (OTEL_RESOURCE_ATTRIBUTES adds attributes); default toolwire-<service>", "my-orchestrator"},
		{EnvOTelExporter, "otlp, console or none (OpenTelemetry's autoexport)", "none"},
	}
}

// Common is the configuration every service shares.
type Common struct {
	Name    string // service name: orchestrator, policy, ...
	NATSURL string
	// NATSSeedFile or NATSCredsFile, when set, is the service's NATS
	// identity; NATSInboxPrefix is where its replies go ("" derives it).
	NATSSeedFile    string
	NATSCredsFile   string
	NATSInboxPrefix string
	HTTPAddr        string
	Replicas        int
	// Store is what the service provisions: Replicas, and the event
	// streams' retention.
	StreamMaxAge      time.Duration
	StreamMaxBytes    int64
	LogLevel          slog.Level
	TracesURLTemplate string
}

// StoreConfig is what the service provisions.
func (c Common) StoreConfig() provision.StoreConfig {
	return provision.StoreConfig{Replicas: c.Replicas, MaxAge: c.StreamMaxAge, MaxBytes: c.StreamMaxBytes}
}

// CommonFromEnv reads Common from the environment, with defaults.
func CommonFromEnv(name, defaultHTTPAddr string, getenv func(string) string) (Common, error) {
	c := Common{Name: name, NATSURL: nats.DefaultURL, HTTPAddr: defaultHTTPAddr, Replicas: 1}
	e := NewEnv(getenv)
	e.String(EnvNATSURL, &c.NATSURL)
	e.String(EnvNATSSeedFile, &c.NATSSeedFile)
	e.String(EnvNATSCreds, &c.NATSCredsFile)
	e.Text(EnvNATSInbox, 64, &c.NATSInboxPrefix)
	if c.NATSSeedFile != "" && c.NATSCredsFile != "" {
		e.Fail(EnvNATSCreds, c.NATSCredsFile, "set either "+EnvNATSSeedFile+" or "+EnvNATSCreds+", not both")
	}
	if c.NATSInboxPrefix != "" && strings.ContainsAny(c.NATSInboxPrefix, ".*> ") {
		e.Fail(EnvNATSInbox, c.NATSInboxPrefix, "want one subject token, without '.', '*', '>' or spaces")
	}
	e.String(EnvHTTPAddr, &c.HTTPAddr)
	e.Int(EnvReplicas, 1, 5, &c.Replicas)
	e.Duration(EnvStreamMaxAge, time.Minute, 10*365*24*time.Hour, &c.StreamMaxAge)
	e.Scaled(EnvStreamMaxBytes, 1, 1<<30, 1<<20, &c.StreamMaxBytes)
	if v, ok := e.Lookup(EnvLogLevel); ok {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			e.Fail(EnvLogLevel, v, "want debug, info, warn or error")
		}
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		e.Fail(EnvHTTPAddr, c.HTTPAddr, "want host:port")
	}
	if v, ok := e.Lookup(EnvTracesTemplate); ok {
		if !strings.Contains(v, "{trace_id}") {
			e.Fail(EnvTracesTemplate, v, "must contain {trace_id}")
		}
		c.TracesURLTemplate = v
	}
	return c, e.Err()
}

// NATSOptions sign the service's connection in with its identity, when it
// has one, its replies under its role's inbox prefix. A seed file that is
// not a user seed, or that others may read, is refused.
func (c Common) NATSOptions() ([]nats.Option, error) {
	prefix := c.NATSInboxPrefix
	if prefix == "" && (c.NATSSeedFile != "" || c.NATSCredsFile != "") {
		if r, ok := identity.ForService(c.Name); ok {
			prefix = r.InboxPrefix()
		} else if c.Name == "worker" {
			prefix = identity.WorkerInboxPrefix
		}
	}
	var opts []nats.Option
	if prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	switch {
	case c.NATSSeedFile != "":
		if _, err := identity.PublicKey(c.NATSSeedFile); err != nil {
			return nil, fmt.Errorf("%s: %w", EnvNATSSeedFile, err)
		}
		o, err := nats.NkeyOptionFromSeed(c.NATSSeedFile)
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", EnvNATSSeedFile, c.NATSSeedFile, err)
		}
		opts = append(opts, o)
	case c.NATSCredsFile != "":
		if _, err := os.Stat(c.NATSCredsFile); err != nil {
			return nil, fmt.Errorf("%s: %w", EnvNATSCreds, err)
		}
		opts = append(opts, nats.UserCredentials(c.NATSCredsFile))
	}
	return opts, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// NewLogger returns a JSON logger at level, tagged with the service name.
func NewLogger(name string, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("service", name)
}

// Connect connects to NATS, retrying the first connection until ctx ends and
// reconnecting forever afterwards; extra options (an identity: see
// Common.NATSOptions) apply after the defaults. The server's asynchronous
// errors, a permissions violation among them, are logged.
func Connect(ctx context.Context, url, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Warn("nats error", "subject", sub.Subject, "err", err)
				return
			}
			log.Warn("nats error", "err", err)
		}),
		nats.Name("toolwire-" + name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }),
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	for !nc.IsConnected() {
		// A server that refuses the credentials will not change its mind
		// while we wait: say so at once.
		if last := nc.LastError(); errors.Is(last, nats.ErrAuthorization) || errors.Is(last, nats.ErrNkeysNotSupported) {
			nc.Close()
			return nil, nil, fmt.Errorf("connect to NATS at %s as %s: %w", url, name, last)
		}
		select {
		case <-ctx.Done():
			last := nc.LastError()
			nc.Close()
			if last != nil {
				// An authorization violation, most often: say so, not only
				// that the wait ended.
				return nil, nil, fmt.Errorf("connect to NATS at %s: %w (last error: %w)", url, ctx.Err(), last)
			}
			return nil, nil, fmt.Errorf("connect to NATS at %s: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	// A producer's account has no JetStream of its own: its reads go
	// through the prefix its account imports them under.
	js, err := direct.JetStream(ctx, nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// TracerProvider builds the service's tracer provider from the standard OTEL_
// variables, read by OpenTelemetry itself (autoexport, the OTLP exporters,
// the resource and sampler settings) from the process environment. getenv
// only tells whether export is asked for (OTEL_TRACES_EXPORTER or an OTLP
// endpoint set): without that, spans still get trace ids (so traces_url
// works) and nothing is sampled or sent.
func TracerProvider(ctx context.Context, name string, getenv func(string) string) (*sdktrace.TracerProvider, error) {
	// OpenTelemetry's own environment handling: OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (resource.WithFromEnv), OTEL_TRACES_SAMPLER
	// (the SDK), and for the exporter OTEL_TRACES_EXPORTER,
	// OTEL_EXPORTER_OTLP_PROTOCOL, the endpoints, headers, timeouts and
	// certificates (autoexport and the OTLP exporters). Our only default:
	// toolwire-<service> as the service name.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("toolwire-"+name)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if !exportAsked(getenv) || strings.TrimSpace(getenv(EnvOTelExporter)) == "none" {
		// Nothing asks for spans: they keep their trace ids (traces_url)
		// but are neither sampled nor exported (autoexport would otherwise
		// send them to localhost:4318).
		return sdktrace.NewTracerProvider(append(opts, sdktrace.WithSampler(sdktrace.NeverSample()))...), nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("span exporter (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*): %w", err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return sdktrace.NewTracerProvider(append(opts, sdktrace.WithSampler(sdktrace.NeverSample()))...), nil
	}
	return sdktrace.NewTracerProvider(append(opts, sdktrace.WithBatcher(exp))...), nil
}

// exportAsked reports whether the environment asks for spans to be
// exported: an exporter named, or an OTLP endpoint given.
func exportAsked(getenv func(string) string) bool {
	for _, v := range []string{EnvOTelExporter, EnvOTLPEndpoint, EnvOTLPTraces} {
		if strings.TrimSpace(getenv(v)) != "" {
			return true
		}
	}
	return false
}

// Deps are what a service's constructor receives.
type Deps struct {
	Common  Common
	Conn    *nats.Conn
	JS      jetstream.JetStream
	Log     *slog.Logger
	Tracer  trace.TracerProvider
	Metrics prometheus.Registerer
	// Getenv is the environment Build reads the service's Config from; New
	// never reads it.
	Getenv func(string) string
}

// WithDefaults returns d with a discarding logger, a tracer provider that
// records nothing and an empty environment where those are unset.
func (d Deps) WithDefaults() Deps {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Tracer == nil {
		d.Tracer = noop.NewTracerProvider()
	}
	if d.Getenv == nil {
		d.Getenv = func(string) string { return "" }
	}
	return d
}

// Component is a started service: Stop drains and releases it.
type Component interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// HTTPComponent is a component that also serves HTTP (the recorder's API and
// pages), as package stack runs one.
type HTTPComponent interface {
	Component
	Handler() http.Handler
}

// Build constructs a service's component; it may return an extra HTTP handler
// mounted on the service's HTTP server (the recorder's API), or nil.
type Build func(ctx context.Context, d Deps) (Component, http.Handler, error)

// Main runs a service binary: configuration from the environment, NATS,
// provisioning, the component, the probe server; then waits for SIGINT or
// SIGTERM and shuts down in order (stop pulling and drain, then the HTTP
// server, then NATS, then telemetry), joining every error.
func Main(name, defaultHTTPAddr string, build Build) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, name, defaultHTTPAddr, os.Getenv, build); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Run is Main without the process: it returns when ctx ends.
func Run(ctx context.Context, name, defaultHTTPAddr string, getenv func(string) string, build Build) (err error) {
	cfg, err := CommonFromEnv(name, defaultHTTPAddr, getenv)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	log := NewLogger(name, cfg.LogLevel)
	tp, err := TracerProvider(ctx, name, getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		err = errors.Join(err, tp.Shutdown(sctx))
	}()

	startCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	natsOpts, err := cfg.NATSOptions()
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	nc, js, err := Connect(startCtx, cfg.NATSURL, name, log, natsOpts...)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, nc.Drain()) }()
	// An account without JetStream of its own (a producer's, a worker's)
	// has nothing to provision, and no JetStream to be ready on.
	imported := direct.APIPrefix(js) == events.ImportedJSAPI
	if !imported {
		if err := provision.ProvisionRetrying(startCtx, js, cfg.StoreConfig(), func(attempt int, err error) {
			log.Warn("provisioning: JetStream not ready, retrying", "attempt", attempt, "err", err)
		}); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	comp, api, err := build(ctx, Deps{Common: cfg, Conn: nc, JS: js, Log: log, Tracer: tp, Metrics: reg, Getenv: getenv})
	if err != nil {
		return err
	}
	probes := &Probes{NoJetStream: imported}
	srv := &http.Server{Addr: cfg.HTTPAddr, Handler: probes.Handler(reg, nc, api), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http listen %s: %w", cfg.HTTPAddr, err)
	}
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()

	if err := comp.Start(startCtx); err != nil {
		_ = srv.Close()
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// A signal while starting: the component undid its start;
			// stopping then is not a failure.
			log.Info("stopped while starting")
			return nil
		}
		return fmt.Errorf("start %s: %w", name, err)
	}
	probes.SetReady(true)
	log.Info("started", "nats", cfg.NATSURL, "http", ln.Addr().String())

	select {
	case <-ctx.Done():
	case serr := <-srvErr:
		log.Error("http server failed", "err", serr)
		err = fmt.Errorf("http server: %w", serr)
	}
	log.Info("shutting down")
	probes.SetReady(false)
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer scancel()
	err = errors.Join(err, comp.Stop(sctx))
	if herr := srv.Shutdown(sctx); herr != nil && !errors.Is(herr, http.ErrServerClosed) {
		err = errors.Join(err, herr)
	}
	return err
}

// Probes serves /healthz, /readyz and /metrics.
type Probes struct {
	// NoJetStream: the service's account has no JetStream of its own (a
	// worker's), so readiness does not ask JetStream.
	NoJetStream bool
	ready       atomic.Bool
}

// SetReady flips readiness.
func (p *Probes) SetReady(v bool) { p.ready.Store(v) }

// Handler returns the probe mux; api, when not nil, serves every other path.
func (p *Probes) Handler(g prometheus.Gatherer, nc *nats.Conn, api http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	var jsc *jetStreamCheck
	if nc != nil && !p.NoJetStream {
		if js, err := jetstream.New(nc); err == nil {
			jsc = &jetStreamCheck{js: js}
		}
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !p.ready.Load():
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		case nc != nil && !nc.IsConnected():
			http.Error(w, "not ready: not connected to NATS", http.StatusServiceUnavailable)
		case jsc != nil && jsc.err(r.Context()) != nil:
			http.Error(w, "not ready: JetStream does not answer: "+jsc.err(r.Context()).Error(), http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ready\n"))
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	if api != nil {
		mux.Handle("/", api)
	}
	return mux
}

// jetStreamCheck asks JetStream for its account info, at most once a second:
// a service whose connection is up but whose JetStream does not answer (no
// quorum, JetStream off, the account's limits) cannot publish an event.
type jetStreamCheck struct {
	js   jetstream.JetStream
	mu   sync.Mutex
	at   time.Time
	last error
}

func (c *jetStreamCheck) err(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < time.Second {
		return c.last
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, c.last = c.js.AccountInfo(ctx)
	c.at = time.Now()
	return c.last
}

// Builder adapts a service package's Build (configuration from Deps.Getenv,
// then New) to Run. When the service offers an HTTP API (a Handler method,
// as the recorder does), it is mounted on the service's HTTP server.
func Builder[S Component, O any](build func(Deps, ...O) (S, error), opts ...O) Build {
	return func(_ context.Context, d Deps) (Component, http.Handler, error) {
		s, err := build(d, opts...)
		if err != nil {
			return nil, nil, err
		}
		var api http.Handler
		if h, ok := any(s).(interface{ Handler() http.Handler }); ok {
			api = h.Handler()
		}
		return s, api, nil
	}
}

// Prepare opens every service's New: cfg (its defaults applied) must be
// valid and d must carry a JetStream; it returns d with its defaults and the
// service's metrics, which newMetrics registers on d.Metrics. name prefixes
// the errors.
func Prepare[C interface{ Validate() error }, M any](name string, d Deps, cfg C,
	newMetrics func(prometheus.Registerer) (M, error)) (Deps, M, error) {
	var zero M
	if err := cfg.Validate(); err != nil {
		return d, zero, fmt.Errorf("%s config: %w", name, err)
	}
	if d.JS == nil {
		return d, zero, fmt.Errorf("%s: Deps.JS is required", name)
	}
	d = d.WithDefaults()
	m, err := newMetrics(d.Metrics)
	if err != nil {
		return d, zero, err
	}
	return d, m, nil
}

// Core is what every service's Service embeds: its Lifecycle, and what New
// takes from Deps (see Deps.Core): the JetStream, the logger, the service's
// tracer, a publisher of its events, and the group of its consumers, which
// Consume starts and Stop drains.
type Core struct {
	Lifecycle
	JS      jetstream.JetStream
	Log     *slog.Logger
	Tracer  trace.Tracer
	Pub     *publish.Publisher
	Runners consume.Runners

	name string // the service's: prefixes the errors of StartWith and Consume
}

// Core returns the Core of the service name on d (as Prepare returned it):
// its tracer is toolwire/<name>, and consumers (the service's
// ConsumerMetrics) observes what its consumers go through and, when it is a
// publish.Observer too (ConsumerMetrics is), every publish of its publisher
// that failed, which the publisher also logs on d.Log.
func (d Deps) Core(name string, consumers consume.Observer) Core {
	opts := []publish.Option{publish.WithLogger(d.Log)}
	if o, ok := consumers.(publish.Observer); ok {
		opts = append(opts, publish.WithObserver(o))
	}
	return Core{JS: d.JS, Log: d.Log, Tracer: d.Tracer.Tracer("toolwire/" + name), Pub: publish.NewPublisher(d.JS, opts...),
		Runners: consume.Runners{Observer: consumers}, name: name}
}

// StartWith is a service's Start: it runs start between Starting and Started
// (see Lifecycle), with ctx, which bounds the start, and the lifetime context
// life, which outlives it until Stop. Starting's error (ErrAlreadyStarted,
// ErrStopped) is prefixed with the service's name.
func (c *Core) StartWith(ctx context.Context, start func(ctx, life context.Context) error) (err error) {
	life, err := c.Starting(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	defer func() { err = c.Started(ctx, err) }()
	return start(ctx, life)
}

// Consume starts the service's consumers, a runner of each spec in order,
// each with concurrency handlers and, unless it has a logger of its own, the
// service's. Stop stops them before what Start registered earlier (which
// their handlers may still read). Start calls it once.
func (c *Core) Consume(ctx context.Context, concurrency int, specs ...consume.RunnerConfig) error {
	c.OnStop(c.Runners.Stop)
	for _, rc := range specs {
		rc.Concurrency = concurrency
		if rc.Logger == nil {
			rc.Logger = c.Log
		}
		if _, err := c.Runners.Start(ctx, c.JS, rc); err != nil {
			return fmt.Errorf("%s: start %s: %w", c.name, rc.Spec.Durable, err)
		}
	}
	return nil
}

// BuildFrom is every service's Build: its Config read from d.Getenv by
// fromEnv, the options applied in order (they win over the environment),
// then newFn. name prefixes a configuration error.
func BuildFrom[C any, O ~func(*C), S any](name string, d Deps, fromEnv func(getenv func(string) string) (C, error),
	newFn func(Deps, C) (S, error), opts ...O) (S, error) {
	cfg, err := fromEnv(d.Getenv)
	if err != nil {
		var zero S
		return zero, fmt.Errorf("%s configuration: %w", name, err)
	}
	for _, o := range opts {
		o(&cfg)
	}
	return newFn(d, cfg)
}

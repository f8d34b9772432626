// Package stack runs the whole toolwire pipeline in one process: an embedded
// nats-server with JetStream (or an external NATS), the orchestrator, the
// Policy Guard, the executor and the sandbox, and, when Options.Recorder is
// given one (recorder.ForStack), the recorder with its HTTP API. It is what
// `toolwire dev` runs, and what users' integration tests embed.
//
// The stack does not import the recorder: a worker's tests (package
// workertest) run the pipeline without the recorder's databases and browser
// in their module graph.
package stack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/services/sandbox"
)

// Options configure a stack. The zero value is not usable: set DataDir or
// NATSURL.
type Options struct {
	// DataDir holds the embedded server's JetStream store (DataDir/nats).
	// The stack holds it locked (DataDir/lock, with its pid) until Stop: a
	// second stack on it, in any process, fails with a *DataDirInUseError.
	DataDir string
	// NATSListen is the embedded server's host:port; "" picks a free port.
	NATSListen string
	// NATSURL connects to an existing NATS server instead of embedding one.
	NATSURL string
	// Recorder runs the recorder beside the pipeline, on a connection of its
	// own, and serves its HTTP API on HTTPListen: recorder.ForStack(url), with
	// a Postgres URL or sqlite:<path>. nil runs without the recorder.
	Recorder Recorder
	// HTTPListen is the recorder API's host:port; "" picks a free port.
	HTTPListen string
	// Logger receives every service's logs; default: discard.
	Logger *slog.Logger
	// Tracer is the tracer provider of every service; default: one that
	// gives spans trace ids (so runs have a trace id and traces_url) and
	// samples, records and exports nothing.
	Tracer trace.TracerProvider
	// Providers adds model adapters to the orchestrator, besides those the
	// environment configures (orchestrator.EnvVars), replacing one of the
	// same name.
	Providers orchestrator.Providers
	// TracesURLTemplate fills AgentOutputs.traces_url.
	TracesURLTemplate string
	// ExecutorReplicas is how many executors to run; default 1.
	ExecutorReplicas int
	// ExecutorConcurrency bounds each executor's calls at once; default
	// TOOLWIRE_EXECUTOR_CONCURRENCY, else 64.
	ExecutorConcurrency int
	// ExecutorOptions are passed to every executor (for example extra tools).
	ExecutorOptions []executor.Option
	// Sandbox configures the sandbox service; nil reads TOOLWIRE_SANDBOX_*
	// from the environment.
	Sandbox *sandbox.Config
	// Getenv is the environment every service reads its configuration from,
	// through the same Build as its binary; default os.Getenv.
	Getenv func(string) string
	// Identities provisions the embedded server with one nkey user per
	// role (package identity), each limited to its role's subjects, keeps
	// their seeds in DataDir/identities (created mode 0700, seeds 0600,
	// kept across restarts) and connects every service as its role, the
	// stack's own connection (provisioning, Client) as the operator. It
	// needs the embedded server.
	Identities bool
}

// IdentitiesDir is where a stack with Options.Identities keeps the seeds of
// its roles' nkeys: the operator's is what the CLI connects with.
func IdentitiesDir(dataDir string) string { return filepath.Join(dataDir, "identities") }

// Stack is a running pipeline.
type Stack struct {
	Server  *server.Server // nil with an external NATS
	URL     string         // NATS client URL
	Conn    *nats.Conn
	JS      jetstream.JetStream
	Client  *client.Client
	HTTPURL string // the recorder API's base URL; "" without the recorder
	Metrics *prometheus.Registry
	// Identities are the roles' nkeys with Options.Identities, else nil.
	Identities *identity.Keys

	// The running services, for tests that look inside (their Config, for
	// one).
	Executors    []*executor.Service
	Sandbox      *sandbox.Service
	Policy       *policy.Service
	Orchestrator *orchestrator.Service
	Recorder     service.HTTPComponent // nil without Options.Recorder

	components []service.Component
	conns      []*nats.Conn // one per service, as separate processes would have
	httpSrv    *http.Server
	ownTracer  *sdktrace.TracerProvider
	unlock     func() error // releases DataDir
}

// Start starts the pipeline and returns once every service consumes.
func Start(ctx context.Context, o Options) (st *Stack, err error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st = &Stack{Metrics: prometheus.NewRegistry()}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.TracesURLTemplate == "" {
		o.TracesURLTemplate = o.Getenv(service.EnvTracesTemplate)
	}
	if o.Tracer == nil {
		// Spans get trace ids (runs have a trace id and traces_url) but are
		// not sampled: nothing would export them, so nothing records them.
		st.ownTracer = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		o.Tracer = st.ownTracer
	}
	defer func() {
		if err != nil {
			_ = st.Stop(context.WithoutCancel(ctx))
			st = nil
		}
	}()
	if o.Recorder != nil {
		// On loopback the recorder needs no configuration; elsewhere it
		// needs authentication or the loud opt-out. Checked before anything
		// starts.
		if err := o.Recorder.Check(cmp.Or(o.HTTPListen, "127.0.0.1:0"), o.Getenv); err != nil {
			return st, err
		}
	}
	if o.DataDir != "" {
		if st.unlock, err = lockDataDir(o.DataDir); err != nil {
			return st, fmt.Errorf("stack: %w", err)
		}
	}
	st.URL = o.NATSURL
	if st.URL == "" {
		if o.DataDir == "" {
			return st, errors.New("stack: DataDir or NATSURL is required")
		}
		eo := embedded.Options{Listen: o.NATSListen, StoreDir: filepath.Join(o.DataDir, "nats")}
		if o.Identities {
			if st.Identities, err = identity.LoadOrCreate(IdentitiesDir(o.DataDir)); err != nil {
				return st, fmt.Errorf("stack: %w", err)
			}
			eo.Identities = st.Identities
		}
		st.Server, err = embedded.Start(eo)
		if err != nil {
			return st, err
		}
		st.URL = st.Server.ClientURL()
	} else if o.Identities {
		return st, errors.New("stack: Identities provisions the embedded server: leave NATSURL empty, or give the services their credentials on your own server (docs/operations.md: Who may publish what)")
	}
	// as signs a connection in as role when the stack has identities.
	as := func(role identity.Role) ([]nats.Option, error) {
		if st.Identities == nil {
			return nil, nil
		}
		return identity.ConnectOptions(role, st.Identities.SeedFile(role))
	}
	opts, err := as(identity.Operator)
	if err != nil {
		return st, err
	}
	st.Conn, st.JS, err = service.Connect(ctx, st.URL, "stack", log, opts...)
	if err != nil {
		return st, err
	}
	// The streams' retention as the services' binaries read it; one
	// replica on the embedded server, which is a single node.
	common, err := service.CommonFromEnv("stack", "127.0.0.1:0", o.Getenv)
	if err != nil {
		return st, fmt.Errorf("stack: %w", err)
	}
	store := common.StoreConfig()
	if st.Server != nil {
		store.Replicas = 1
	}
	if err := provision.ProvisionRetrying(ctx, st.JS, store, func(attempt int, err error) {
		log.Warn("provisioning: JetStream not ready, retrying", "attempt", attempt, "err", err)
	}); err != nil {
		return st, err
	}
	st.Client = client.New(st.JS, "/toolwire/stack")

	// Each service has its own connection, as it would as its own process:
	// one connection's read loop does not serialize every service's events.
	deps := func(name string) (service.Deps, error) {
		role, _ := identity.ForService(name)
		opts, err := as(role)
		if err != nil {
			return service.Deps{}, err
		}
		nc, js, err := service.Connect(ctx, st.URL, name, log, opts...)
		if err != nil {
			return service.Deps{}, err
		}
		st.conns = append(st.conns, nc)
		return service.Deps{
			Common: service.Common{Name: name, NATSURL: st.URL, Replicas: 1, TracesURLTemplate: o.TracesURLTemplate},
			Conn:   nc, JS: js, Log: log.With("service", name), Tracer: o.Tracer,
			Metrics: prometheus.WrapRegistererWith(prometheus.Labels{"service": name}, st.Metrics),
			Getenv:  o.Getenv,
		}, nil
	}
	start := func(c service.Component) error {
		if err := c.Start(ctx); err != nil {
			return err
		}
		st.components = append(st.components, c)
		return nil
	}

	// The executor first: it registers the built-in tools that the
	// orchestrator's catalog must see. Every service is built by its
	// package's Build, as its binary builds it, from o.Getenv.
	replicas := max(o.ExecutorReplicas, 1)
	for i := range replicas {
		d, err := deps("executor")
		if err != nil {
			return st, err
		}
		if replicas > 1 {
			d.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"service": "executor", "replica": fmt.Sprint(i)}, st.Metrics)
		}
		ex, err := newExecutor(d, o.ExecutorConcurrency, fmt.Sprintf("executor-%d", i), o.ExecutorOptions)
		if err == nil {
			err = start(ex)
		}
		if err != nil {
			return st, fmt.Errorf("executor: %w", err)
		}
		st.Executors = append(st.Executors, ex)
	}
	// The sandbox next: it registers python_exec.
	d, err := deps("sandbox")
	if err != nil {
		return st, err
	}
	if st.Sandbox, err = newSandbox(d, o.Sandbox); err == nil {
		err = start(st.Sandbox)
	}
	if err != nil {
		return st, fmt.Errorf("sandbox: %w", err)
	}
	if d, err = deps("policy"); err != nil {
		return st, err
	}
	if st.Policy, err = policy.Build(d); err == nil {
		err = start(st.Policy)
	}
	if err != nil {
		return st, fmt.Errorf("policy: %w", err)
	}
	// The model providers (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...) and the
	// price table come from the environment; Options.Providers add to them.
	if d, err = deps("orchestrator"); err != nil {
		return st, err
	}
	if st.Orchestrator, err = orchestrator.Build(d, orchestrator.WithProviders(o.Providers)); err == nil {
		err = start(st.Orchestrator)
	}
	if err != nil {
		return st, fmt.Errorf("orchestrator: %w", err)
	}
	if o.Recorder != nil {
		d, err := deps("recorder")
		if err != nil {
			return st, err
		}
		if st.Recorder, err = o.Recorder.Build(d); err == nil {
			err = start(st.Recorder)
		}
		if err != nil {
			return st, fmt.Errorf("recorder: %w", err)
		}
		listen := o.HTTPListen
		if listen == "" {
			listen = "127.0.0.1:0"
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", listen)
		if err != nil {
			return st, fmt.Errorf("recorder http listen %s: %w", listen, err)
		}
		probes := &service.Probes{}
		probes.SetReady(true)
		st.httpSrv = &http.Server{Handler: probes.Handler(st.Metrics, st.Conn, st.Recorder.Handler()), ReadHeaderTimeout: 10 * time.Second}
		st.HTTPURL = "http://" + ln.Addr().String()
		go func() { _ = st.httpSrv.Serve(ln) }()
	}
	return st, nil
}

// A Recorder is a service the stack runs after the pipeline's, as the
// recorder's role, and whose Handler it serves on Options.HTTPListen.
// recorder.ForStack makes the recorder one.
type Recorder interface {
	// Check says, before anything starts, whether the service may serve
	// listen with the configuration getenv gives it.
	Check(listen string, getenv func(string) string) error
	// Build builds the service as its binary does, from d.
	Build(d service.Deps) (service.HTTPComponent, error)
}

// newExecutor builds an executor as its binary does (standard.Build: the
// TOOLWIRE_EXECUTOR_* variables apply); the replicas are told apart by their
// ids unless the environment names one, and Options.ExecutorConcurrency,
// when set, wins.
func newExecutor(d service.Deps, concurrency int, id string, opts []executor.Option) (*executor.Service, error) {
	return standard.Build(d, append([]executor.Option{func(c *executor.Config) {
		if concurrency > 0 {
			c.Concurrency = concurrency
		}
		if d.Getenv(executor.EnvID) == "" {
			c.ID = id
		}
	}}, opts...)...)
}

func newSandbox(d service.Deps, cfg *sandbox.Config) (*sandbox.Service, error) {
	var opts []sandbox.Option
	if cfg != nil {
		opts = append(opts, func(c *sandbox.Config) { *c = *cfg })
	}
	return sandbox.Build(d, opts...)
}

// Stop stops the services in reverse order of their start (each drains its
// consumers), then the HTTP server, the connection and the embedded server.
func (st *Stack) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var err error
	for i := len(st.components) - 1; i >= 0; i-- {
		err = errors.Join(err, st.components[i].Stop(ctx))
	}
	st.components = nil
	if st.httpSrv != nil {
		err = errors.Join(err, st.httpSrv.Shutdown(ctx))
		st.httpSrv = nil
	}
	for _, nc := range st.conns {
		nc.Close()
	}
	st.conns = nil
	if st.Conn != nil {
		st.Conn.Close()
		st.Conn = nil
	}
	if st.Server != nil {
		embedded.Stop(st.Server)
		st.Server = nil
	}
	if st.ownTracer != nil {
		err = errors.Join(err, st.ownTracer.Shutdown(ctx))
		st.ownTracer = nil
	}
	if st.unlock != nil {
		err = errors.Join(err, st.unlock())
		st.unlock = nil
	}
	return err
}

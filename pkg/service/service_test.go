package service_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/identity"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// envOf is a getenv over a fixed map.
func envOf(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestCommonFromEnvDefaults(t *testing.T) {
	c, err := service.CommonFromEnv("policy", ":8082", envOf(nil))
	require.NoError(t, err)
	require.Equal(t, service.Common{
		Name:     "policy",
		NATSURL:  nats.DefaultURL,
		HTTPAddr: ":8082",
		Replicas: 1,
		LogLevel: slog.LevelInfo,
	}, c)

	c, err = service.CommonFromEnv("executor", ":8083", envOf(map[string]string{
		service.EnvNATSURL:        "nats://nats:4222",
		service.EnvHTTPAddr:       "0.0.0.0:9000",
		service.EnvReplicas:       "3",
		service.EnvLogLevel:       "debug",
		service.EnvTracesTemplate: "http://jaeger:16686/trace/{trace_id}",
	}))
	require.NoError(t, err)
	require.Equal(t, service.Common{
		Name: "executor", NATSURL: "nats://nats:4222", HTTPAddr: "0.0.0.0:9000", Replicas: 3,
		LogLevel: slog.LevelDebug, TracesURLTemplate: "http://jaeger:16686/trace/{trace_id}",
	}, c)
}

func TestCommonFromEnvRejects(t *testing.T) {
	cases := []struct {
		name, key, value, msg string
	}{
		{"replicas 0", service.EnvReplicas, "0", `TOOLWIRE_STREAM_REPLICAS="0": want a whole number from 1 to 5`},
		{"replicas 9", service.EnvReplicas, "9", `TOOLWIRE_STREAM_REPLICAS="9"`},
		{"replicas x", service.EnvReplicas, "x", `TOOLWIRE_STREAM_REPLICAS="x"`},
		{"replicas negative", service.EnvReplicas, "-1", `TOOLWIRE_STREAM_REPLICAS="-1"`},
		{"log level", service.EnvLogLevel, "loud", `TOOLWIRE_LOG_LEVEL="loud": want debug, info, warn or error`},
		{"addr without port", service.EnvHTTPAddr, "localhost", `TOOLWIRE_HTTP_ADDR="localhost": want host:port`},
		{"addr garbage", service.EnvHTTPAddr, "::::", `TOOLWIRE_HTTP_ADDR="::::"`},
		{"template without trace id", service.EnvTracesTemplate, "http://jaeger/trace/", `TOOLWIRE_TRACES_URL_TEMPLATE="http://jaeger/trace/": must contain {trace_id}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := service.CommonFromEnv("policy", ":8082", envOf(map[string]string{tc.key: tc.value}))
			require.ErrorContains(t, err, tc.msg)
		})
	}

	// Every problem is reported at once.
	_, err := service.CommonFromEnv("policy", ":8082", envOf(map[string]string{
		service.EnvReplicas: "0", service.EnvLogLevel: "loud", service.EnvHTTPAddr: "nope",
	}))
	require.ErrorContains(t, err, service.EnvReplicas)
	require.ErrorContains(t, err, service.EnvLogLevel)
	require.ErrorContains(t, err, service.EnvHTTPAddr)
}

func TestCommonEnvVars(t *testing.T) {
	// OTEL_* are read by OpenTelemetry's own setup (TracerProvider); the
	// rest set Common.
	var own []service.Var
	for _, v := range service.CommonEnvVars() {
		if !strings.HasPrefix(v.Name, "OTEL_") {
			own = append(own, v)
		}
	}
	require.Len(t, own, 10)
	servicetest.VarsTakeEffect(t, own, func(getenv func(string) string) (service.Common, error) {
		return service.CommonFromEnv("policy", ":8082", getenv)
	})
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	return rec.Code, string(b)
}

func TestProbes(t *testing.T) {
	reg := prometheus.NewRegistry()
	probe := prometheus.NewCounter(prometheus.CounterOpts{Name: "toolwire_test_total", Help: "test"})
	reg.MustRegister(probe)
	probe.Inc()
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "api "+r.URL.Path) })

	var p service.Probes
	h := p.Handler(reg, nil, api)

	code, body := get(t, h, "/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)

	code, _ = get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready before SetReady")
	p.SetReady(true)
	code, body = get(t, h, "/readyz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ready\n", body)
	p.SetReady(false)
	code, _ = get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)

	code, body = get(t, h, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "toolwire_test_total 1")

	code, body = get(t, h, "/v1/runs")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "api /v1/runs", body)

	// Without an API, other paths are not found.
	code, _ = get(t, p.Handler(reg, nil, nil), "/v1/runs")
	require.Equal(t, http.StatusNotFound, code)
}

func TestProbesNotReadyWhenNATSIsDown(t *testing.T) {
	env := eventstest.Start(t)
	nc := env.Connect(t)
	var p service.Probes
	p.SetReady(true)
	h := p.Handler(prometheus.NewRegistry(), nc, nil)
	code, _ := get(t, h, "/readyz")
	require.Equal(t, http.StatusOK, code)
	nc.Close()
	code, _ = get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
}

// A service whose connection is up but whose JetStream does not answer is
// not ready: it could not publish an event.
func TestProbesNotReadyWithoutJetStream(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true}) // no JetStream
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	var p service.Probes
	p.SetReady(true)
	code, body := get(t, p.Handler(prometheus.NewRegistry(), nc, nil), "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "JetStream does not answer")
}

// component records its lifecycle.
type component struct {
	started, stopped atomic.Bool
	startErr         error
}

func (c *component) Start(context.Context) error { c.started.Store(true); return c.startErr }
func (c *component) Stop(context.Context) error  { c.stopped.Store(true); return nil }

func TestRunEndToEnd(t *testing.T) {
	env := eventstest.Start(t)
	addr := servicetest.FreeAddr(t)
	vars := map[string]string{
		service.EnvNATSURL:  env.URL,
		service.EnvHTTPAddr: addr,
		service.EnvLogLevel: "error",
	}
	comp := &component{}
	var deps service.Deps
	api := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "api") })
	build := func(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
		deps = d
		return comp, api, nil
	}

	stop := servicetest.Run(t, "testsvc", ":0", vars, build)

	client := &http.Client{Timeout: 2 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	require.Eventually(t, func() bool {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "the service never became ready")
	require.True(t, comp.started.Load())
	require.Equal(t, "testsvc", deps.Common.Name)
	require.NotNil(t, deps.Conn)
	require.NotNil(t, deps.JS)
	require.NotNil(t, deps.Tracer)
	require.NotNil(t, deps.Metrics)

	for path, want := range map[string]int{"/healthz": 200, "/metrics": 200, "/v1/x": 200} {
		resp, err := client.Get("http://" + addr + path)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, path)
	}
	// Run provisioned the streams.
	_, err := env.JS.Stream(context.Background(), events.StreamCalls)
	require.NoError(t, err)

	require.NoError(t, stop())
	require.True(t, comp.stopped.Load(), "Stop was called")
	client.CloseIdleConnections()
	_, err = client.Get("http://" + addr + "/healthz")
	require.Error(t, err, "the HTTP server is shut down")
	require.Eventually(t, func() bool { return deps.Conn.IsClosed() }, 5*time.Second, 10*time.Millisecond,
		"the NATS connection is drained and closed")
}

func TestRunFailures(t *testing.T) {
	env := eventstest.Start(t)
	ok := func(_ context.Context, _ service.Deps) (service.Component, http.Handler, error) {
		return &component{}, nil, nil
	}

	err := service.Run(context.Background(), "svc", ":0", envOf(map[string]string{service.EnvReplicas: "x"}), ok)
	require.ErrorContains(t, err, "configuration")

	base := map[string]string{service.EnvNATSURL: env.URL, service.EnvHTTPAddr: "127.0.0.1:0", service.EnvLogLevel: "error"}

	err = service.Run(context.Background(), "svc", ":0", envOf(base),
		func(context.Context, service.Deps) (service.Component, http.Handler, error) {
			return nil, nil, errors.New("no model provider")
		})
	require.ErrorContains(t, err, "no model provider")

	comp := &component{startErr: errors.New("consumer refused")}
	err = service.Run(context.Background(), "svc", ":0", envOf(base),
		func(context.Context, service.Deps) (service.Component, http.Handler, error) { return comp, nil, nil })
	require.ErrorContains(t, err, "start svc: consumer refused")

	// A taken HTTP port is a clear error.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := map[string]string{service.EnvNATSURL: env.URL, service.EnvHTTPAddr: l.Addr().String(), service.EnvLogLevel: "error"}
	err = service.Run(context.Background(), "svc", ":0", envOf(taken), ok)
	require.ErrorContains(t, err, "http listen")

	// A NATS that never answers is bounded by the context.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	down := map[string]string{service.EnvNATSURL: "nats://" + servicetest.FreeAddr(t), service.EnvHTTPAddr: "127.0.0.1:0", service.EnvLogLevel: "error"}
	err = service.Run(ctx, "svc", ":0", envOf(down), ok)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "connect to NATS")
}

// TracerProvider follows OpenTelemetry's own environment: nothing asked,
// nothing sampled or sent; OTEL_TRACES_EXPORTER=none, the same; an OTLP
// endpoint, and the spans go there with the headers, protocol, service name
// and resource attributes the standard variables give.
func TestTracerProvider(t *testing.T) {
	span := func(tp *sdktrace.TracerProvider) trace.SpanContext {
		_, s := tp.Tracer("t").Start(context.Background(), "x")
		s.End()
		return s.SpanContext()
	}
	tp, err := service.TracerProvider(context.Background(), "svc", os.Getenv)
	require.NoError(t, err)
	sc := span(tp)
	require.True(t, sc.IsValid(), "trace ids are recorded without an exporter")
	require.False(t, sc.IsSampled())
	require.NoError(t, tp.Shutdown(context.Background()))

	t.Setenv(service.EnvOTelExporter, "none")
	tp, err = service.TracerProvider(context.Background(), "svc", os.Getenv)
	require.NoError(t, err)
	require.False(t, span(tp).IsSampled())
	require.NoError(t, tp.Shutdown(context.Background()))

	type got struct {
		path, team string
		body       []byte
	}
	received := make(chan got, 4)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		received <- got{r.URL.Path, r.Header.Get("X-Team"), b}
	}))
	t.Cleanup(collector.Close)
	t.Setenv(service.EnvOTelExporter, "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv(service.EnvOTLPEndpoint, collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=toolwire")
	t.Setenv(service.EnvOTelService, "my-orchestrator")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci-check")
	tp, err = service.TracerProvider(context.Background(), "svc", os.Getenv)
	require.NoError(t, err)
	require.True(t, span(tp).IsSampled())
	require.NoError(t, tp.Shutdown(context.Background())) // flushes
	select {
	case g := <-received:
		require.Equal(t, "/v1/traces", g.path)
		require.Equal(t, "toolwire", g.team)
		require.Contains(t, string(g.body), "my-orchestrator")
		require.Contains(t, string(g.body), "ci-check")
	case <-time.After(10 * time.Second):
		t.Fatal("no spans reached the collector")
	}
}

func TestBuildFrom(t *testing.T) {
	type cfg struct{ N, M int }
	fromEnv := func(getenv func(string) string) (cfg, error) {
		e := service.NewEnv(getenv)
		var c cfg
		e.Int("N", 1, 9, &c.N)
		return c, e.Err()
	}
	newFn := func(_ service.Deps, c cfg) (cfg, error) { return c, nil }
	env := func(v string) func(string) string { return func(string) string { return v } }
	got, err := service.BuildFrom("svc", service.Deps{Getenv: env("3")}, fromEnv, newFn, func(c *cfg) { c.M = 7 })
	require.NoError(t, err)
	require.Equal(t, cfg{N: 3, M: 7}, got)
	got, err = service.BuildFrom("svc", service.Deps{Getenv: env("3")}, fromEnv, newFn, func(c *cfg) { c.N = 5 })
	require.NoError(t, err)
	require.Equal(t, 5, got.N, "an option wins over the environment")
	_, err = service.BuildFrom[cfg, func(*cfg)]("svc", service.Deps{Getenv: env("x")}, fromEnv, newFn)
	require.EqualError(t, err, `svc configuration: N="x": want a whole number from 1 to 9`)
	got, err = service.BuildFrom[cfg, func(*cfg)]("svc", service.Deps{}, fromEnv, newFn)
	require.NoError(t, err, "no environment is an empty one")
	require.Zero(t, got)
}

// limit is a configuration whose Validate refuses a negative N.
type limit struct{ N int }

func (l limit) Validate() error {
	if l.N < 0 {
		return errors.New("N must not be negative")
	}
	return nil
}

func TestPrepare(t *testing.T) {
	js := eventstest.Start(t).JS
	registered := func(reg prometheus.Registerer) (prometheus.Registerer, error) { return reg, nil }
	refused := func(prometheus.Registerer) (prometheus.Registerer, error) { return nil, errors.New("clash") }
	reg := prometheus.NewRegistry()
	for _, tc := range []struct {
		name    string
		d       service.Deps
		cfg     limit
		metrics func(prometheus.Registerer) (prometheus.Registerer, error)
		err     string
	}{
		{name: "ready", d: service.Deps{JS: js, Metrics: reg}, metrics: registered},
		{name: "an invalid configuration", d: service.Deps{JS: js}, cfg: limit{N: -1}, metrics: registered,
			err: "svc config: N must not be negative"},
		{name: "no JetStream", metrics: registered, err: "svc: Deps.JS is required"},
		{name: "metrics refused", d: service.Deps{JS: js}, metrics: refused, err: "clash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, m, err := service.Prepare("svc", tc.d, tc.cfg, tc.metrics)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, prometheus.Registerer(reg), m, "the metrics are registered on Deps.Metrics")
			require.NotNil(t, d.Log, "Deps come back with their defaults")
			require.NotNil(t, d.Tracer)
		})
	}
}

// blockingStart is a component whose Start waits for its context: a
// service still starting when its process is told to stop.
type blockingStart struct{ entered chan struct{} }

func (b *blockingStart) Start(ctx context.Context) error {
	close(b.entered)
	<-ctx.Done()
	return fmt.Errorf("start: %w", ctx.Err())
}
func (b *blockingStart) Stop(context.Context) error { return nil }

// TestRunStoppedWhileStarting: a signal that arrives while the service
// starts ends Run cleanly (nil), as one after the start does; a start that
// fails on its own is still an error.
func TestRunStoppedWhileStarting(t *testing.T) {
	env := eventstest.Start(t)
	vars := map[string]string{service.EnvNATSURL: env.URL, service.EnvHTTPAddr: servicetest.FreeAddr(t),
		service.EnvLogLevel: "error", service.EnvOTelExporter: "none"}
	comp := &blockingStart{entered: make(chan struct{})}
	build := func(context.Context, service.Deps) (service.Component, http.Handler, error) { return comp, nil, nil }
	stop := servicetest.Run(t, "testsvc", ":0", vars, build)
	select {
	case <-comp.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("Start never called")
	}
	require.NoError(t, stop())

	failing := &component{startErr: errors.New("no such bucket")}
	build = func(context.Context, service.Deps) (service.Component, http.Handler, error) { return failing, nil, nil }
	vars[service.EnvHTTPAddr] = servicetest.FreeAddr(t)
	require.ErrorContains(t, service.Run(t.Context(), "testsvc", ":0", envOf(vars), build), "no such bucket")
}

func TestCommonFromEnvIdentityRejects(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		msg  string
	}{
		{"seed and creds", map[string]string{service.EnvNATSSeedFile: "/a.nk", service.EnvNATSCreds: "/a.creds"}, "set either TOOLWIRE_NATS_NKEY_SEED_FILE or NATS_CREDS, not both"},
		{"inbox with a dot", map[string]string{service.EnvNATSInbox: "_INBOX.x"}, "want one subject token"},
		{"inbox wildcard", map[string]string{service.EnvNATSInbox: "_INBOX_>"}, "want one subject token"},
		{"inbox too long", map[string]string{service.EnvNATSInbox: string(make([]byte, 65))}, "TOOLWIRE_NATS_INBOX_PREFIX"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := service.CommonFromEnv("policy", ":8082", envOf(tc.env))
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// TestRunWithIdentity: a service binary on a server with toolwire's roles
// connects with the seed its environment names, its replies under its
// role's inbox; a missing or unknown seed fails the start at once, saying
// why.
func TestRunWithIdentity(t *testing.T) {
	keys, err := identity.LoadOrCreate(filepath.Join(t.TempDir(), "ids"))
	require.NoError(t, err)
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Identities: keys})
	require.NoError(t, err)
	t.Cleanup(func() { embedded.Stop(s) })
	opts, err := identity.ConnectOptions(identity.Operator, keys.SeedFile(identity.Operator))
	require.NoError(t, err)
	op, err := nats.Connect(s.ClientURL(), opts...)
	require.NoError(t, err)
	defer op.Close()
	ojs, err := jetstream.New(op)
	require.NoError(t, err)
	require.NoError(t, provision.Provision(t.Context(), ojs, provision.StoreConfig{Replicas: 1}))

	started := make(chan service.Deps, 1)
	build := func(_ context.Context, d service.Deps) (service.Component, http.Handler, error) {
		started <- d
		return &component{}, nil, nil
	}
	env := func(seed string) func(string) string {
		return envOf(map[string]string{
			service.EnvNATSURL: s.ClientURL(), service.EnvHTTPAddr: "127.0.0.1:0", service.EnvLogLevel: "error",
			service.EnvNATSSeedFile: seed,
		})
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, "policy", ":0", env(keys.SeedFile(identity.Policy)), build) }()
	var d service.Deps
	select {
	case d = <-started:
	case err := <-done:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the service never started")
	}
	require.Equal(t, keys.SeedFile(identity.Policy), d.Common.NATSSeedFile)
	// It is the policy user: its replies come under its own inbox, and a
	// request through JetStream's API gets an answer.
	require.Contains(t, d.Conn.NewRespInbox(), identity.Policy.InboxPrefix()+".")
	_, err = d.JS.Stream(ctx, events.StreamCalls)
	require.NoError(t, err)
	cancel()
	require.NoError(t, <-done)

	for name, seed := range map[string]string{
		"missing": filepath.Join(t.TempDir(), "none.nk"),
		"unknown": func() string {
			other, err := identity.LoadOrCreate(t.TempDir())
			require.NoError(t, err)
			return other.SeedFile(identity.Policy)
		}(),
	} {
		err := service.Run(t.Context(), "policy", ":0", env(seed), build)
		require.Error(t, err, name)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "%s: refused at once, not after the start-up bound", name)
		if name == "missing" {
			require.ErrorIs(t, err, os.ErrNotExist)
			require.ErrorContains(t, err, service.EnvNATSSeedFile)
		} else {
			require.ErrorIs(t, err, nats.ErrAuthorization)
		}
	}
}

// FreeAddr draws loopback ports below the ephemeral range, which outbound
// connections take their local ports from, and each is free when drawn.
func TestFreeAddrBelowTheEphemeralRange(t *testing.T) {
	for range 20 {
		addr := servicetest.FreeAddr(t)
		host, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host)
		n, err := strconv.Atoi(port)
		require.NoError(t, err)
		require.Less(t, n, 32768, "below the ephemeral range")
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err, "free when drawn")
		require.NoError(t, l.Close())
	}
}

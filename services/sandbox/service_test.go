package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
)

// startService starts a sandbox service on env, registering its metrics on
// reg, and stops it at cleanup. Every service test runs on a service whose
// start context ended right after Start: the consumer hangs off the
// service's lifetime, never off the start-up context.
func startService(t *testing.T, env *eventstest.Env, id string, reg prometheus.Registerer) *Service {
	t.Helper()
	return startServiceWith(t, env, Config{ID: id, Limits: testLimits()}, reg)
}

// startServiceWith starts a sandbox service of cfg as startService does.
func startServiceWith(t *testing.T, env *eventstest.Env, cfg Config, reg prometheus.Registerer) *Service {
	t.Helper()
	newTestEngine(t, Config{}) // fails (or skips) the test when the runtimes do not work here
	return startServiceOn(t, env, cfg, reg)
}

// startServiceOn starts a sandbox service of cfg as startServiceWith does,
// whatever runtimes work here.
func startServiceOn(t *testing.T, env *eventstest.Env, cfg Config, reg prometheus.Registerer) *Service {
	t.Helper()
	cfg.StateDir, cfg.Concurrency = t.TempDir(), 2
	s, err := New(service.Deps{
		JS:      env.JetStream(t),
		Log:     slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Metrics: reg,
	}, cfg)
	require.NoError(t, err)
	startCtx, endStart := context.WithTimeout(context.Background(), 2*time.Minute)
	require.NoError(t, s.Start(startCtx))
	endStart()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, s.Stop(ctx))
	})
	return s
}

// awaitResult waits for the result of a job.
func awaitResult(t *testing.T, js jetstream.JetStream, runID, callID string) (events.SandboxResult, *event.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subj, err := events.SandboxSubject(runID, callID, "completed")
	require.NoError(t, err)
	c, err := js.OrderedConsumer(ctx, events.StreamSandbox, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	require.NoError(t, err)
	m, err := c.Next(jetstream.FetchContext(ctx))
	require.NoError(t, err)
	e, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	require.NoError(t, err)
	var res events.SandboxResult
	require.NoError(t, events.DecodeData(e, &res))
	return res, e
}

func publishJob(t *testing.T, js jetstream.JetStream, job events.SandboxJob) {
	t.Helper()
	out, err := events.NewSandboxJob("/test", job, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(js).Publish(t.Context(), out))
}

func serviceJob(callID, source string) events.SandboxJob {
	return events.SandboxJob{
		RunID: "run-svc", CallID: callID, Tool: "adder@1.0.0", TenantID: "acme/ws/u1",
		Language: events.SandboxPython, Source: source, Input: json.RawMessage(`{"a":2,"b":40}`),
		Stdout: events.SandboxStdoutJSON, TimeoutMS: 20000, Deadline: time.Now().Add(time.Minute),
	}
}

// TestServiceAnswersJobs: two replicas, whose start contexts have ended
// (startService), share the jobs published after their start; each job gets
// exactly one result, carrying the tenant and the runtime that ran it;
// python_exec is registered; both replicas count on one set of metrics.
func TestServiceAnswersJobs(t *testing.T) {
	env := eventstest.Start(t)
	metrics := prometheus.NewRegistry() // shared, as under toolwire dev
	a := startService(t, env, "sandbox-a", metrics)
	startService(t, env, "sandbox-b", metrics)

	const n = 6
	src := "import json, sys\nd = json.load(sys.stdin)\nprint(json.dumps(d['a'] + d['b']))"
	for i := range n {
		publishJob(t, env.JS, serviceJob(fmt.Sprintf("c%d", i), src))
	}
	for i := range n {
		res, e := awaitResult(t, env.JS, "run-svc", fmt.Sprintf("c%d", i))
		require.Nil(t, res.Error, "stderr: %s", res.Stderr)
		require.JSONEq(t, `42`, string(res.Output))
		require.Equal(t, RuntimeGVisor, res.Runtime, "gVisor is the default where it works")
		require.Contains(t, []string{"sandbox-a", "sandbox-b"}, res.Worker)
		require.Equal(t, "acme/ws/u1", events.Ext(e, events.ExtTenantID))
		require.Equal(t, "run-svc/"+fmt.Sprintf("c%d", i)+"/sandbox/completed", e.ID())
	}
	// Both replicas count on the same collectors, named by the one scheme.
	require.Equal(t, float64(n), testutil.ToFloat64(a.metrics.jobs.WithLabelValues(RuntimeGVisor, "ok")))
	require.Equal(t, 1.0, testutil.ToFloat64(a.metrics.available.WithLabelValues(RuntimeBwrap)))
	count, err := testutil.GatherAndCount(metrics, "toolwire_sandbox_jobs_total", "toolwire_sandbox_job_duration_seconds",
		"toolwire_sandbox_jobs_in_flight", "toolwire_sandbox_runtime_available")
	require.NoError(t, err)
	require.Equal(t, 1+1+1+2, count, "series: jobs (gvisor, ok), duration (gvisor), in flight, available (gvisor, bwrap)")
	// Exactly one result per job, also after a republish (deduplicated).
	publishJob(t, env.JS, serviceJob("c0", src))
	info, err := env.JS.Stream(t.Context(), events.StreamSandbox)
	require.NoError(t, err)
	si, err := info.Info(t.Context(), jetstream.WithSubjectFilter(events.Prefix+".sandbox.*.*.completed"))
	require.NoError(t, err)
	require.Equal(t, n, len(si.State.Subjects))
	for subj, count := range si.State.Subjects {
		require.Equal(t, uint64(1), count, subj)
	}

	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	entry, err := reg.Get(t.Context(), PythonExecRef)
	require.NoError(t, err)
	require.Equal(t, envelope.ImplSandbox, entry.Definition.Implementation.Kind)
}

// TestServiceRejects: a job that breaks its contract gets a SANDBOX_ERROR
// result (its caller is waiting); an event that cannot be answered at all (not
// a job, unsafe ids) goes to the dead letters, and the service goes on.
func TestServiceRejects(t *testing.T) {
	env := eventstest.Start(t)
	s := startService(t, env, "sandbox-r", prometheus.NewRegistry())
	require.ErrorIs(t, s.Start(t.Context()), service.ErrAlreadyStarted)

	bad := serviceJob("bad1", "print(1)")
	bad.Language = "ruby"
	b, err := json.Marshal(bad)
	require.NoError(t, err)
	subj, err := events.SandboxSubject(bad.RunID, bad.CallID, "requested")
	require.NoError(t, err)
	out, err := events.Build(events.TypeSandboxRequested, "bad1", subj, events.Attrs{RunID: bad.RunID, CallID: bad.CallID}, json.RawMessage(b))
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(env.JS).Publish(t.Context(), out))
	res, _ := awaitResult(t, env.JS, bad.RunID, bad.CallID)
	require.NotNil(t, res.Error)
	require.Equal(t, envelope.CodeSandboxError, res.Error.Code)
	require.Contains(t, res.Error.Message, `the sandbox refused the job`)
	require.Contains(t, res.Error.Message, `language "ruby" is not supported`)

	// Not a job: the wrong type on a job subject.
	subj2, err := events.SandboxSubject("run-svc", "bad2", "requested")
	require.NoError(t, err)
	out, err = events.Build(events.TypeCallStarted, "bad2", subj2, events.Attrs{}, map[string]string{"x": "y"})
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(env.JS).Publish(t.Context(), out))
	dlq, err := env.JS.Stream(t.Context(), events.StreamDLQ)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := dlq.Info(t.Context())
		return err == nil && info.State.Msgs == 1
	}, 30*time.Second, 20*time.Millisecond)
	m, err := dlq.GetLastMsgForSubject(t.Context(), consume.DLQSubject(events.StreamSandbox, Durable))
	require.NoError(t, err)
	require.Contains(t, m.Header.Get(consume.HeaderDLQError), `want `+events.TypeSandboxRequested)

	// And the service still answers.
	publishJob(t, env.JS, serviceJob("600d", "print(7)"))
	res, _ = awaitResult(t, env.JS, "run-svc", "600d")
	require.JSONEq(t, `7`, string(res.Output))
}

// TestBuild: Build reads the configuration from Deps.Getenv, the options
// adjust it, and Config reports what the service runs with; a bad variable
// or a bad option is refused before anything starts.
func TestBuild(t *testing.T) {
	env := eventstest.Start(t)
	getenv := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	d := service.Deps{JS: env.JetStream(t), Getenv: getenv(map[string]string{EnvConcurrency: "3", EnvCgroups: "off"})}
	dir := t.TempDir()
	s, err := Build(d, func(c *Config) { c.StateDir = dir })
	require.NoError(t, err)
	cfg := s.Config()
	require.Equal(t, 3, cfg.Concurrency)
	require.Equal(t, "off", cfg.Cgroups)
	require.Equal(t, dir, cfg.StateDir)
	require.Equal(t, DefaultLimits(), cfg.Limits)

	d.Getenv = getenv(map[string]string{EnvConcurrency: "many", EnvDiskMB: "0"})
	_, err = Build(d)
	require.ErrorContains(t, err, EnvConcurrency+`="many"`)
	require.ErrorContains(t, err, EnvDiskMB+`="0"`)

	d.Getenv = nil
	_, err = Build(d, func(c *Config) { c.Runtime = "docker" })
	require.ErrorContains(t, err, `runtime "docker"`)
}

// TestStartAfterStop: a stopped service cannot start again, and a second
// Stop returns the first one's result.
func TestStartAfterStop(t *testing.T) {
	env := eventstest.Start(t)
	s, err := New(service.Deps{JS: env.JetStream(t)}, Config{StateDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, s.Stop(t.Context()))
	require.ErrorIs(t, s.Start(t.Context()), service.ErrStopped)
	require.NoError(t, s.Stop(t.Context()))
	require.Nil(t, s.Engine(), "nothing was started")
}

// TestServiceResultsFitInOneMessage: a result larger than one message (the
// program's output, as JSON, and its stderr beyond the server's max_payload)
// is still answered: stderr is cut first, and an output that does not fit
// makes the result a SANDBOX_ERROR, limit output, that names the sizes and
// the limit. Before, the result could not be published, the job ran again
// at each redelivery, and its caller waited for nothing.
func TestServiceResultsFitInOneMessage(t *testing.T) {
	env := eventstest.Start(t)
	limits := testLimits()
	limits.OutputBytes, limits.StderrBytes = 4<<20, 2<<20
	startServiceWith(t, env, Config{ID: "sandbox-big", Limits: limits}, prometheus.NewRegistry())
	maxPayload := int(env.Conn.MaxPayload())

	job := func(callID, mode, source string) {
		j := serviceJob(callID, source)
		j.Stdout, j.Runtime = mode, RuntimeBwrap
		publishJob(t, env.JS, j)
	}
	job("b1", events.SandboxStdoutJSON, "import json\nprint(json.dumps('x' * (1200 << 10)))")
	// Text mode: 600 KiB of quotes are 1.2 MiB as a JSON string.
	job("b2", events.SandboxStdoutText, "print('\"' * (600 << 10))")
	job("be", events.SandboxStdoutJSON, "import sys\nsys.stderr.write('e' * (1200 << 10))\nprint(7)")

	for _, id := range []string{"b1", "b2"} {
		res, _ := awaitResult(t, env.JS, "run-svc", id)
		require.NotNil(t, res.Error, id)
		require.Equal(t, envelope.CodeSandboxError, res.Error.Code, id)
		require.Contains(t, res.Error.Message, "output limit hit: the program's output (", id)
		require.Contains(t, res.Error.Message, fmt.Sprintf("more than the %d bytes one message may carry", maxPayload-hopHeadroom), id)
		b, err := json.Marshal(res.Error.Details)
		require.NoError(t, err)
		require.Contains(t, string(b), `"limit":"output"`, id)
	}
	res, _ := awaitResult(t, env.JS, "run-svc", "be")
	require.Nil(t, res.Error, "stderr is cut, the output kept")
	require.JSONEq(t, `7`, string(res.Output))
	require.True(t, res.StderrTruncated)
	require.Len(t, res.Stderr, resultStderrBytes)
}

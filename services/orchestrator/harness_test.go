package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/policy"
)

// harness is a hermetic pipeline for tests: an embedded JetStream, the real
// Policy Guard and executor, and as many orchestrator replicas as a test
// starts, each on its own NATS connection so that a test can kill one.
type harness struct {
	t   *testing.T
	env *eventstest.Env
	pub *events.Publisher
}

// quietLogger discards the services' logs; TOOLWIRE_TEST_LOG=1 shows them.
func quietLogger() *slog.Logger {
	if os.Getenv("TOOLWIRE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func deps(name string, nc *nats.Conn, js jetstream.JetStream) service.Deps {
	return service.Deps{Common: service.Common{Name: name, Replicas: 1}, Conn: nc, JS: js, Log: quietLogger(),
		Getenv: func(string) string { return "" }}
}

// newHarness starts JetStream, the executor (with extra tools) and the Policy
// Guard; orchestrators are started by the test.
func newHarness(t *testing.T, tools ...executor.Tool) *harness {
	t.Helper()
	h := newHarnessWithoutPolicy(t, tools...)
	pol, err := policy.New(deps("policy", h.env.Conn, h.env.JS), policy.Config{})
	require.NoError(t, err)
	require.NoError(t, pol.Start(t.Context()))
	t.Cleanup(func() { _ = pol.Stop(context.Background()) })
	return h
}

// newHarnessWithoutPolicy leaves the Policy Guard's part to the test.
func newHarnessWithoutPolicy(t *testing.T, tools ...executor.Tool) *harness {
	t.Helper()
	env := eventstest.Start(t)
	h := &harness{t: t, env: env, pub: events.NewPublisher(env.JS)}
	ex, err := executor.New(deps("executor", env.Conn, env.JS), executor.Config{Concurrency: 64, ID: "executor-0"}, executor.WithTools(tools...))
	require.NoError(t, err)
	require.NoError(t, ex.Start(t.Context()))
	t.Cleanup(func() { _ = ex.Stop(context.Background()) })
	return h
}

// next returns the first message of a stream on filter, waiting for it.
func (h *harness) next(ctx context.Context, stream, filter string) stored {
	h.t.Helper()
	cons, err := h.env.JS.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	require.NoError(h.t, err)
	msg, err := cons.Next(jetstream.FetchContext(ctx))
	require.NoError(h.t, err, "waiting for %s", filter)
	ev, err := events.Decode(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
	require.NoError(h.t, err)
	return stored{Subject: msg.Subject(), Type: ev.Type(), ID: ev.ID(), Data: ev.Data()}
}

// testTool is an executor tool made of a definition and a function.
type testTool struct {
	def envelope.ToolDefinition
	fn  func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)
}

func (t testTool) Definition() envelope.ToolDefinition { return t.def }
func (t testTool) Execute(ctx context.Context, input json.RawMessage, _ executor.ToolContext) (json.RawMessage, error) {
	return t.fn(ctx, input)
}

func newTestTool(name string, cost float64, fn func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)) testTool {
	return testTool{def: envelope.ToolDefinition{
		Name: name, Version: "1.0.0", Description: "A test tool.",
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Metadata:    envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone},
		Cost:        cost, Implementation: executor.BuiltinImplementation(name),
	}, fn: fn}
}

// replica is one orchestrator on its own connection.
type replica struct {
	name string
	nc   *nats.Conn
	svc  *orchestrator.Service
	once sync.Once
}

// startOrchestrator starts a replica; it is stopped at the end of the test
// unless killed before.
func (h *harness) startOrchestrator(name string, cfg orchestrator.Config) *replica {
	h.t.Helper()
	return h.startOrchestratorWithLog(name, cfg, quietLogger())
}

func (h *harness) startOrchestratorWithLog(name string, cfg orchestrator.Config, log *slog.Logger) *replica {
	h.t.Helper()
	nc := h.env.Connect(h.t)
	js, err := jetstream.New(nc)
	require.NoError(h.t, err)
	if cfg.InstanceID == "" {
		cfg.InstanceID = name
	}
	d := deps("orchestrator", nc, js)
	d.Log = log
	svc, err := orchestrator.New(d, cfg)
	require.NoError(h.t, err)
	// Every replica runs on a start context that ends right after Start, as
	// service.Run's does after its timeout: nothing long-lived (the approval
	// watch, the catalog, the consumers) may hang off it.
	startCtx, endStart := context.WithCancel(h.t.Context())
	require.NoError(h.t, svc.Start(startCtx))
	endStart()
	r := &replica{name: name, nc: nc, svc: svc}
	h.t.Cleanup(r.stop)
	return r
}

// kill ends a replica as a crash would: its connection closes first, so that
// nothing it still does reaches NATS, then its goroutines are released.
func (r *replica) kill() {
	r.once.Do(func() {
		r.nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.svc.Stop(ctx)
	})
}

// stop shuts a replica down in order: its handlers finish, then its
// connection closes.
func (r *replica) stop() {
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.svc.Stop(ctx)
		r.nc.Close()
	})
}

func (h *harness) submit(ctx context.Context, req envelope.RunRequest) {
	h.t.Helper()
	out, err := events.NewRunRequested("/toolwire/test", req, events.RunTrace{})
	require.NoError(h.t, err)
	require.NoError(h.t, h.pub.Publish(ctx, out))
}

// wait returns the final status of a run.
func (h *harness) wait(ctx context.Context, runID string) (*events.RunStatus, error) {
	cons, err := h.env.JS.OrderedConsumer(ctx, events.StreamRuns, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"toolwire.run." + runID + ".completed", "toolwire.run." + runID + ".failed"}})
	if err != nil {
		return nil, err
	}
	msg, err := cons.Next(jetstream.FetchContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("wait for run %s: %w", runID, err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
	if err != nil {
		return nil, err
	}
	var st events.RunStatus
	return &st, events.DecodeData(ev, &st)
}

func (h *harness) run(req envelope.RunRequest, timeout time.Duration) *events.RunStatus {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), timeout)
	defer cancel()
	h.submit(ctx, req)
	st, err := h.wait(ctx, req.RunID)
	require.NoError(h.t, err)
	return st
}

// stored is one message of a stream.
type stored struct {
	Subject string
	Type    string
	ID      string
	Data    json.RawMessage
}

// streamEvents reads every message of the runs and calls streams, grouped by
// run id.
func (h *harness) streamEvents(ctx context.Context) map[string][]stored {
	h.t.Helper()
	out := map[string][]stored{}
	for _, name := range []string{events.StreamRuns, events.StreamCalls} {
		s, err := h.env.JS.Stream(ctx, name)
		require.NoError(h.t, err)
		info, err := s.Info(ctx)
		require.NoError(h.t, err)
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			require.NoError(h.t, err)
			ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
			require.NoError(h.t, err, m.Subject)
			run := strings.Split(m.Subject, ".")[2]
			out[run] = append(out[run], stored{Subject: m.Subject, Type: ev.Type(), ID: ev.ID(), Data: ev.Data()})
		}
	}
	return out
}

// countBySubject counts a run's messages by subject with the run and call ids
// replaced by placeholders, e.g. "call.*.requested".
func countBySubject(evs []stored) map[string]int {
	c := map[string]int{}
	for _, e := range evs {
		c[e.Subject]++
	}
	return c
}

func ofType(evs []stored, typ string) []stored {
	var out []stored
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// scripted builds a run request for the scripted model.
func scripted(t testing.TB, runID string, tools []string, policy envelope.Policy, turns ...map[string]any) envelope.RunRequest {
	t.Helper()
	opts, err := json.Marshal(map[string]any{"script": turns})
	require.NoError(t, err)
	return envelope.RunRequest{
		RunID:  runID,
		Tenant: envelope.Tenant{OrgID: "org1", WorkspaceID: "ws1", UserID: "u1"},
		Agent: envelope.Agent{
			Name: "test-agent", Model: envelope.Model{Provider: "scripted", Name: "script", Options: opts},
			EnabledTools: tools, Policy: policy,
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "go"}},
	}
}

func toolCall(name string, args any) map[string]any {
	return map[string]any{"name": name, "arguments": args}
}

// normalized is what must be equal between two runs of the same request: the
// outputs without timestamps and traces.
type normalized struct {
	Response  string
	ToolOrder []string
	Envelopes []string
	LastTool  string
}

func normalize(t testing.TB, out *envelope.AgentOutputs) normalized {
	t.Helper()
	require.NotNil(t, out)
	n := normalized{Response: out.Response, ToolOrder: out.ToolOrder}
	for _, id := range out.ToolOrder {
		e := out.ToolsByID[id]
		e.TStart, e.TEnd = time.Time{}, time.Time{}
		b, err := json.Marshal(e)
		require.NoError(t, err)
		n.Envelopes = append(n.Envelopes, string(b))
	}
	if out.LastTool != nil {
		n.LastTool = out.LastTool.CallID
	}
	return n
}

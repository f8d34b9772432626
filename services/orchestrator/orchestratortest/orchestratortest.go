// Package orchestratortest runs orchestrators on an embedded JetStream for
// tests: replicas a test can stop or kill, run requests and their outcome,
// the events a run leaves, and the parts of the Policy Guard and the executor
// played by hand (Guard), for tests that start no other service.
package orchestratortest

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

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator"
)

// Harness is a hermetic JetStream with as many orchestrator replicas as a
// test starts, each on its own NATS connection so that a test can kill one.
type Harness struct {
	T   *testing.T
	Env *eventstest.Env
	Pub *publish.Publisher
}

// New starts an embedded JetStream with toolwire's streams and buckets.
func New(t *testing.T) *Harness {
	t.Helper()
	env := eventstest.Start(t)
	return &Harness{T: t, Env: env, Pub: publish.NewPublisher(env.JS)}
}

// QuietLogger discards the services' logs; TOOLWIRE_TEST_LOG=1 shows them.
func QuietLogger() *slog.Logger {
	if os.Getenv("TOOLWIRE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Deps are a service's dependencies on nc, with a quiet logger and an empty
// environment.
func Deps(name string, nc *nats.Conn, js jetstream.JetStream) service.Deps {
	return service.Deps{Common: service.Common{Name: name, Replicas: 1}, Conn: nc, JS: js, Log: QuietLogger()}.WithDefaults()
}

// Register puts tool definitions in the registry, as the executor does for
// the tools it serves.
func (h *Harness) Register(defs ...envelope.ToolDefinition) {
	h.T.Helper()
	reg, err := registry.Open(h.T.Context(), h.Env.JS)
	require.NoError(h.T, err)
	for _, d := range defs {
		require.NoError(h.T, reg.Put(h.T.Context(), registry.Entry{Definition: d}))
	}
}

// Tool is a definition of a tool for Register: no side effects, no cache,
// the input any object.
func Tool(name, version string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: name, Version: version, Description: "A test tool.",
		InputSchema:    json.RawMessage(`{"type":"object"}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone},
		Implementation: envelope.Implementation{Kind: envelope.ImplBuiltin},
	}
}

// Replica is one orchestrator on its own connection.
type Replica struct {
	Name string
	Conn *nats.Conn
	Svc  *orchestrator.Service
	once sync.Once
}

// Start starts a replica (its InstanceID is its name unless cfg sets one); it
// is stopped at the end of the test unless killed before.
func (h *Harness) Start(name string, cfg orchestrator.Config) *Replica {
	h.T.Helper()
	return h.StartWithLog(name, cfg, QuietLogger())
}

// StartWithLog is Start with the replica's logger.
func (h *Harness) StartWithLog(name string, cfg orchestrator.Config, log *slog.Logger) *Replica {
	h.T.Helper()
	nc := h.Env.Connect(h.T)
	js, err := jetstream.New(nc)
	require.NoError(h.T, err)
	if cfg.InstanceID == "" {
		cfg.InstanceID = name
	}
	d := Deps("orchestrator", nc, js)
	d.Log = log
	svc, err := orchestrator.New(d, cfg)
	require.NoError(h.T, err)
	// Every replica runs on a start context that ends right after Start, as
	// service.Run's does after its timeout: nothing long-lived (the approval
	// watch, the catalog, the consumers) may hang off it.
	startCtx, endStart := context.WithCancel(h.T.Context())
	require.NoError(h.T, svc.Start(startCtx))
	endStart()
	r := &Replica{Name: name, Conn: nc, Svc: svc}
	h.T.Cleanup(r.Stop)
	return r
}

// Kill ends a replica as a crash would: its connection closes first, so that
// nothing it still does reaches NATS, then its goroutines are released.
func (r *Replica) Kill() {
	r.once.Do(func() {
		r.Conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.Svc.Stop(ctx)
	})
}

// Stop shuts a replica down in order: its handlers finish, then its
// connection closes.
func (r *Replica) Stop() {
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Svc.Stop(ctx)
		r.Conn.Close()
	})
}

// Submit publishes a run request as client.Submit does: on the condition
// that its run has none yet.
func (h *Harness) Submit(ctx context.Context, req envelope.RunRequest) {
	h.T.Helper()
	out, err := events.NewRunRequested("/toolwire/test", req, events.RunTrace{})
	require.NoError(h.T, err)
	_, err = h.Pub.PublishFirst(ctx, out)
	require.NoError(h.T, err)
}

// Wait returns the final status of a run.
func (h *Harness) Wait(ctx context.Context, runID string) (*events.RunStatus, error) {
	var filters []string
	for _, f := range []events.Filter{events.FilterRunCompleted, events.FilterRunFailed, events.FilterRunCancelled} {
		s, err := f.ForRun(runID)
		if err != nil {
			return nil, err
		}
		filters = append(filters, s)
	}
	within := time.Hour
	if dl, ok := ctx.Deadline(); ok {
		within = time.Until(dl)
	}
	ev, _, err := eventstest.NextEvent(ctx, h.Env.JS, events.StreamRuns, within, filters...)
	if err != nil {
		return nil, fmt.Errorf("wait for run %s: %w", runID, err)
	}
	var st events.RunStatus
	return &st, events.DecodeData(ev, &st)
}

// Run submits a run request and returns its final status.
func (h *Harness) Run(req envelope.RunRequest, timeout time.Duration) *events.RunStatus {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(h.T.Context(), timeout)
	defer cancel()
	h.Submit(ctx, req)
	st, err := h.Wait(ctx, req.RunID)
	require.NoError(h.T, err)
	return st
}

// Stored is one message of a stream.
type Stored struct {
	Subject string
	Type    string
	ID      string
	Data    json.RawMessage
}

// Next returns the first message of a stream on filter, waiting for it.
func (h *Harness) Next(ctx context.Context, stream, filter string) Stored {
	h.T.Helper()
	within := time.Hour
	if dl, ok := ctx.Deadline(); ok {
		within = time.Until(dl)
	}
	ev, subject, err := eventstest.NextEvent(ctx, h.Env.JS, stream, within, filter)
	require.NoError(h.T, err, "waiting for %s", filter)
	return Stored{Subject: subject, Type: ev.Type(), ID: ev.ID(), Data: ev.Data()}
}

// StreamEvents reads every message of the runs and calls streams, grouped by
// run id.
func (h *Harness) StreamEvents(ctx context.Context) map[string][]Stored {
	h.T.Helper()
	out := map[string][]Stored{}
	for _, name := range []string{events.StreamRuns, events.StreamCalls} {
		s, err := h.Env.JS.Stream(ctx, name)
		require.NoError(h.T, err)
		info, err := s.Info(ctx)
		require.NoError(h.T, err)
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			require.NoError(h.T, err)
			ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
			require.NoError(h.T, err, m.Subject)
			run := strings.Split(m.Subject, ".")[2]
			out[run] = append(out[run], Stored{Subject: m.Subject, Type: ev.Type(), ID: ev.ID(), Data: ev.Data()})
		}
	}
	return out
}

// CountBySubject counts a run's messages by subject.
func CountBySubject(evs []Stored) map[string]int {
	c := map[string]int{}
	for _, e := range evs {
		c[e.Subject]++
	}
	return c
}

// OfType returns the messages of an event type.
func OfType(evs []Stored, typ string) []Stored {
	var out []Stored
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// Turns returns a run's turns in order: its turn events, and the turn its
// end event carries (the model's final answer or a denied model call).
func Turns(t testing.TB, evs []Stored) []events.Turn {
	t.Helper()
	var out []events.Turn
	for _, e := range evs {
		switch e.Type {
		case events.TypeTurnCompleted:
			var tr events.Turn
			require.NoError(t, json.Unmarshal(e.Data, &tr))
			out = append(out, tr)
		case events.TypeRunCompleted, events.TypeRunFailed:
			if st := StatusOf(t, e); st.Turn != nil {
				out = append(out, *st.Turn)
			}
		}
	}
	return out
}

// StatusOf decodes a run status event (started, suspended, resumed,
// completed, failed).
func StatusOf(t testing.TB, e Stored) events.RunStatus {
	t.Helper()
	var s events.RunStatus
	require.NoError(t, json.Unmarshal(e.Data, &s))
	return s
}

// Scripted builds a run request for the scripted model: each turn is a map
// with "content" or "tool_calls" (see ToolCall).
func Scripted(t testing.TB, runID string, tools []string, policy envelope.Policy, turns ...map[string]any) envelope.RunRequest {
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

// ToolCall is a tool call of a scripted turn.
func ToolCall(name string, args any) map[string]any {
	return map[string]any{"name": name, "arguments": args}
}

// Normalized is what must be equal between two runs of the same request: the
// outputs without timestamps and traces.
type Normalized struct {
	Response  string
	ToolOrder []string
	Envelopes []string
	LastTool  string
}

// Normalize returns the outputs' Normalized form.
func Normalize(t testing.TB, out *envelope.AgentOutputs) Normalized {
	t.Helper()
	require.NotNil(t, out)
	n := Normalized{Response: out.Response, ToolOrder: out.ToolOrder}
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

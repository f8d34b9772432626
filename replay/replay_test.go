package replay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/replay"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/tool"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// lookupTool reads something that changes: each execution answers the next
// number. Its side effects are reads.
type lookupTool struct{ n atomic.Int64 }

func (*lookupTool) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{Name: "lookup", Version: "1.0.0", Description: "reads a counter",
		InputSchema:    json.RawMessage(`{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryData, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		Implementation: tool.BuiltinImplementation("lookup")}
}

func (l *lookupTool) Execute(_ context.Context, input json.RawMessage, _ tool.Context) (json.RawMessage, error) {
	var in struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"key": in.Key, "value": l.n.Add(1)})
}

// appendTool writes: it counts its executions, which a replay must never add
// to.
type appendTool struct{ runs atomic.Int64 }

func (*appendTool) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{Name: "append_note", Version: "1.0.0", Description: "appends a note",
		InputSchema:    json.RawMessage(`{"type":"object","properties":{"note":{"type":"string"}},"required":["note"]}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryData, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone},
		Implementation: tool.BuiltinImplementation("append_note")}
}

func (a *appendTool) Execute(_ context.Context, _ json.RawMessage, _ tool.Context) (json.RawMessage, error) {
	n := a.runs.Add(1)
	return json.Marshal(map[string]any{"appended": true, "line": n})
}

// recording is a run recorded by a whole stack, and the tools it used.
type recording struct {
	bundle replay.Bundle
	lookup *lookupTool
	write  *appendTool
	dbURL  string
	apiURL string
	st     *stack.Stack
}

func scriptedRequest(t testing.TB, runID string) envelope.RunRequest {
	t.Helper()
	call := func(name string, args any) map[string]any { return map[string]any{"name": name, "arguments": args} }
	script := map[string]any{"script": []any{
		map[string]any{"tool_calls": []any{
			call("calculator", map[string]any{"expression": "6*7"}),
			call("echo", map[string]any{"text": "hello"}),
		}},
		map[string]any{"tool_calls": []any{
			call("lookup", map[string]any{"key": "inventory"}),
			call("append_note", map[string]any{"note": "checked inventory"}),
			call("calculator", map[string]any{"expression": 42}), // fails validation
		}},
		map[string]any{"content": "Done: 42, the inventory and a note."},
	}}
	opts, err := json.Marshal(script)
	require.NoError(t, err)
	return envelope.RunRequest{
		RunID:  runID,
		Tenant: envelope.Tenant{OrgID: "org-r", WorkspaceID: "ws-r", UserID: "u-r"},
		Agent: envelope.Agent{
			Name:         "replayed-agent",
			Model:        envelope.Model{Provider: "scripted", Name: "script-r", Options: opts},
			SystemPrompt: "You use tools.",
			EnabledTools: []string{"calculator@1.0.0", "echo@1.0.0", "lookup@1.0.0", "append_note@1.0.0"},
			Policy:       envelope.Policy{MaxIterations: 5, MaxToolCalls: 10},
		},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "Compute, check the inventory, note it."}},
	}
}

// record runs the request through a whole stack with the recorder on SQLite
// and returns its bundle, as the recorder's API serves it.
func record(t *testing.T) *recording {
	t.Helper()
	r := &recording{lookup: &lookupTool{}, write: &appendTool{}}
	dir := t.TempDir()
	r.dbURL = sqlite.URL(filepath.Join(dir, "recorder.db"))
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, DatabaseURL: r.dbURL,
		ExecutorOptions: []executor.Option{executor.WithTools(r.lookup, r.write)}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })
	r.st, r.apiURL = st, st.HTTPURL

	req := scriptedRequest(t, "replayed-run")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, st.Client.Submit(ctx, req))
	final, err := st.Client.Follow(ctx, req.RunID, nil)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Len(t, final.Outputs.ToolOrder, 5)

	// Wait until the recorder has all of it.
	require.Eventually(t, func() bool {
		b, err := replay.FromRecorder(ctx, r.apiURL, req.RunID)
		if err != nil || b.Status != events.StatusCompleted || len(b.Envelopes) != 5 || len(b.Turns) != 3 || len(b.Tools) != 4 {
			return false
		}
		r.bundle = b
		return true
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, int64(1), r.write.runs.Load())
	require.Equal(t, int64(1), r.lookup.n.Load())
	return r
}

func stepTitles(steps []replay.Step) []string {
	var out []string
	for _, s := range steps {
		out = append(out, fmt.Sprintf("%d %s ok=%t", s.N, s.Title(), s.OK))
	}
	return out
}

// TestReplayClean: a recorded run replays clean against this build: every
// model turn, every call (by call id, so tool, version, input and place) and
// the outcome match; the bundle read from the database replays the same.
func TestReplayClean(t *testing.T) {
	rec := record(t)
	rep, err := replay.Run(t.Context(), rec.bundle, replay.Options{})
	require.NoError(t, err)
	require.True(t, rep.Clean, "divergence: %v", rep.Divergence)
	require.Equal(t, events.StatusCompleted, rep.Status)
	require.Len(t, rep.Steps, 1+2+1+3+1+1, stepTitles(rep.Steps))
	for _, s := range rep.Steps {
		require.True(t, s.Checked && s.OK, "step %s", s.Title())
		if s.Kind == replay.StepToolCall {
			require.Equal(t, "recorded", s.Source)
			require.NotEmpty(t, s.CallID)
		}
	}
	require.Equal(t, int64(1), rec.write.runs.Load(), "a replay executed a writes tool")
	require.Equal(t, int64(1), rec.lookup.n.Load(), "a strict replay executed a tool")

	// The bundle as `toolwire replay --database-url` reads it, from the
	// recorder's database without a recorder.
	db, closeDB, err := recorder.OpenStore(rec.dbURL)
	require.NoError(t, err)
	defer closeDB()
	fromDB, err := store.ReplayBundle(t.Context(), db, rec.bundle.RunID)
	require.NoError(t, err)
	require.Equal(t, mustJSON(t, rec.bundle), mustJSON(t, fromDB))
	rep, err = replay.Run(t.Context(), fromDB, replay.Options{})
	require.NoError(t, err)
	require.True(t, rep.Clean, "divergence: %v", rep.Divergence)
}

// reorderingProvider stands for an orchestrator whose handling of parallel
// tool calls changed: it hands the calls of iteration 2 on in reverse order.
type reorderingProvider struct{ inner provider.Provider }

func (p reorderingProvider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	resp, err := p.inner.Complete(ctx, req)
	if req.Iteration == 2 {
		slices.Reverse(resp.ToolCalls)
	}
	return resp, err
}

// forgetfulProvider stands for an orchestrator that changed what it tells
// the model: from iteration 2 on, the tool results lose their content.
type forgetfulProvider struct{ inner provider.Provider }

func (p forgetfulProvider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	msgs := slices.Clone(req.Messages)
	for i := range msgs {
		if msgs[i].Role == envelope.RoleTool {
			msgs[i].Content = "(results elided)"
		}
	}
	req.Messages = msgs
	return p.inner.Complete(ctx, req)
}

func changedOrchestrator(wrap func(provider.Provider) provider.Provider) replay.OrchestratorFactory {
	return func(d service.Deps, cfg orchestrator.Config) (service.Component, error) {
		ps := orchestrator.Providers{}
		for name, p := range cfg.Providers {
			ps[name] = wrap(p)
		}
		cfg.Providers = ps
		return orchestrator.New(d, cfg)
	}
}

// TestReplayReportsDivergence: deliberately changed orchestrator behaviours
// are reported at the first step that differs, and the replay stops there.
func TestReplayReportsDivergence(t *testing.T) {
	rec := record(t)
	order := rec.bundle.Outputs.ToolOrder

	t.Run("parallel calls reordered", func(t *testing.T) {
		rep, err := replay.Run(t.Context(), rec.bundle, replay.Options{
			Orchestrator: changedOrchestrator(func(p provider.Provider) provider.Provider { return reorderingProvider{p} }),
		})
		require.NoError(t, err)
		require.False(t, rep.Clean)
		d := rep.Divergence
		require.NotNil(t, d)
		// Steps: 1 turn 1, 2-3 its calls, 4 turn 2, 5 call #3 (lookup), ...
		require.Equal(t, 5, d.Step.N, d.Error())
		require.Equal(t, replay.StepToolCall, d.Step.Kind)
		require.Equal(t, 3, d.Step.Seq)
		require.Equal(t, 2, d.Step.Iteration)
		require.Equal(t, order[2], d.Step.CallID)
		require.Equal(t, "lookup@1.0.0", d.Step.Tool)
		require.Contains(t, d.Recorded, "lookup@1.0.0")
		require.Contains(t, d.Replayed, "calculator@1.0.0") // the last call of the turn came first
		require.Contains(t, d.Error(), "step 5, tool call #3 (iteration 2, lookup@1.0.0)")
		require.Empty(t, rep.Status, "the replay went on past the divergence")
		for _, s := range rep.Steps[:4] {
			require.True(t, s.OK, "step %s before the divergence", s.Title())
		}
		require.Equal(t, int64(1), rec.write.runs.Load())
	})

	t.Run("conversation changed", func(t *testing.T) {
		rep, err := replay.Run(t.Context(), rec.bundle, replay.Options{
			Orchestrator: changedOrchestrator(func(p provider.Provider) provider.Provider { return forgetfulProvider{p} }),
		})
		require.NoError(t, err)
		d := rep.Divergence
		require.NotNil(t, d)
		require.Equal(t, 4, d.Step.N, d.Error())
		require.Equal(t, replay.StepModelTurn, d.Step.Kind)
		require.Equal(t, 2, d.Step.Iteration)
		require.Contains(t, d.What, "message 4 of the conversation") // system, user, assistant, then the first tool result
		require.Contains(t, d.Recorded, `{\"result\":42}`)
		require.Contains(t, d.Replayed, "(results elided)")
	})
}

// TestReplayLive: --live executes the calls of none and reads tools again and
// reports the outputs that changed (the lookup reads a new value); the writes
// tool is never executed: it gets its recorded envelope.
func TestReplayLive(t *testing.T) {
	rec := record(t)
	order := rec.bundle.Outputs.ToolOrder
	lookupID, appendID := order[2], order[3]

	rep, err := replay.Run(t.Context(), rec.bundle, replay.Options{Live: true,
		ExecutorOptions: []executor.Option{executor.WithTools(rec.lookup, rec.write)}})
	require.NoError(t, err)
	require.True(t, rep.Clean, "divergence: %v", rep.Divergence)
	require.Equal(t, events.StatusCompleted, rep.Status)

	require.Equal(t, int64(1), rec.write.runs.Load(), "the writes tool ran again")
	require.Equal(t, int64(2), rec.lookup.n.Load(), "the reads tool did not run again")
	require.Contains(t, rep.Kept[appendID], "writes")
	require.Contains(t, rep.Reexecuted, lookupID)
	require.NotContains(t, rep.Reexecuted, appendID)
	for _, s := range rep.Steps {
		switch s.CallID {
		case appendID:
			require.Equal(t, "recorded", s.Source)
		case lookupID:
			require.Equal(t, "live", s.Source)
		}
	}

	// Only the lookup's output changed: the calculator and echo answer the
	// same, and the invalid calculator call fails validation again.
	require.Len(t, rep.Changed, 1, "%+v", rep.Changed)
	c := rep.Changed[0]
	require.Equal(t, lookupID, c.CallID)
	require.Equal(t, "lookup@1.0.0", c.Tool)
	require.Equal(t, 3, c.Seq)
	require.JSONEq(t, `{"output":{"key":"inventory","value":1}}`, string(c.Recorded))
	require.JSONEq(t, `{"output":{"key":"inventory","value":2}}`, string(c.Replayed))
}

// TestReplayRefusesBadBundles: a bundle that cannot be replayed is refused
// with what is wrong, before anything runs.
func TestReplayRefusesBadBundles(t *testing.T) {
	good := replay.Bundle{Status: events.StatusCompleted}
	good.RunID = "r1"
	good.Request = scriptedRequest(t, "r1")
	good.Turns = []envelope.ModelTurn{{Iteration: 1, Response: envelope.ModelResponse{Content: "hi"}}}
	cases := map[string]func(b *replay.Bundle){
		"no turns":           func(b *replay.Bundle) { b.Turns = nil },
		"turns out of order": func(b *replay.Bundle) { b.Turns[0].Iteration = 2 },
		"another run":        func(b *replay.Bundle) { b.Request.RunID = "r2" },
		"invalid request":    func(b *replay.Bundle) { b.Request.Messages = nil },
		"no status":          func(b *replay.Bundle) { b.Status = "" },
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			b := good
			b.Turns = slices.Clone(good.Turns)
			spoil(&b)
			_, err := replay.Run(t.Context(), b, replay.Options{})
			require.ErrorIs(t, err, replay.ErrBundle)
		})
	}
	_, err := replay.FromRecorder(t.Context(), "ftp://x", "r1")
	require.Error(t, err)
	_, err = replay.FromRecorder(t.Context(), "http://127.0.0.1:1", "bad id!")
	require.Error(t, err)
}

// TestFromRecorderErrors: the recorder's error is passed on.
func TestFromRecorderErrors(t *testing.T) {
	rec := record(t)
	_, err := replay.FromRecorder(t.Context(), rec.apiURL, "no-such-run")
	require.ErrorContains(t, err, "is not recorded")
	resp, err := http.Get(rec.apiURL + "/v1/runs/" + rec.bundle.RunID + "/replay")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"))
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

package rerun_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
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
	"github.com/toolwire/toolwire/rerun"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// dataToolDefinition is the definition of a test's data tool name@1.0.0,
// built in, uncached, with the side effects given, whose input is an object
// with the one string property field.
func dataToolDefinition(name, description, field string, effects envelope.SideEffects) envelope.ToolDefinition {
	return envelope.ToolDefinition{Name: name, Version: "1.0.0", Description: description,
		InputSchema:    json.RawMessage(`{"type":"object","properties":{"` + field + `":{"type":"string"}},"required":["` + field + `"]}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryData, SideEffects: effects, Cache: envelope.CacheNone},
		Implementation: toolapi.BuiltinImplementation(name)}
}

// lookupTool reads something that changes: each execution answers the next
// number. Its side effects are reads.
type lookupTool struct{ n atomic.Int64 }

func (*lookupTool) Definition() envelope.ToolDefinition {
	return dataToolDefinition("lookup", "reads a counter", "key", envelope.SideEffectsReads)
}

func (l *lookupTool) Execute(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
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
	return dataToolDefinition("append_note", "appends a note", "note", envelope.SideEffectsWrites)
}

func (a *appendTool) Execute(_ context.Context, _ json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	n := a.runs.Add(1)
	return json.Marshal(map[string]any{"appended": true, "line": n})
}

// recording is a run recorded by a whole stack, and the tools it used.
type recording struct {
	bundle rerun.Bundle
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
	st, err := stack.Start(t.Context(), stack.Options{DataDir: dir, Recorder: recorder.ForStack(r.dbURL),
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
		b, err := rerun.FromRecorder(ctx, r.apiURL, req.RunID)
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

func stepTitles(steps []rerun.Step) []string {
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
	rep, err := rerun.Run(t.Context(), rec.bundle, rerun.Options{})
	require.NoError(t, err)
	require.True(t, rep.Clean, "divergence: %v", rep.Divergence)
	require.Equal(t, events.StatusCompleted, rep.Status)
	require.Len(t, rep.Steps, 1+2+1+3+1+1, stepTitles(rep.Steps))
	for _, s := range rep.Steps {
		require.True(t, s.Checked && s.OK, "step %s", s.Title())
		if s.Kind == rerun.StepToolCall {
			require.Equal(t, "recorded", s.Source)
			require.NotEmpty(t, s.CallID)
		}
	}
	require.Equal(t, int64(1), rec.write.runs.Load(), "a replay executed a writes tool")
	require.Equal(t, int64(1), rec.lookup.n.Load(), "a strict replay executed a tool")
	// A bundle of contract v2: its turns carry no messages.
	require.Equal(t, envelope.ReplayBundleVersion, rec.bundle.Version)
	for _, turn := range rec.bundle.Turns {
		require.Nil(t, turn.Messages)
	}

	// The bundle as `toolwire replay --database-url` reads it, from the
	// recorder's database without a recorder.
	db, closeDB, err := recorder.OpenStore(rec.dbURL)
	require.NoError(t, err)
	defer closeDB()
	fromDB, err := store.ReplayBundle(t.Context(), db, rec.bundle.RunID, nil)
	require.NoError(t, err)
	require.Equal(t, mustJSON(t, rec.bundle), mustJSON(t, fromDB))
	rep, err = rerun.Run(t.Context(), fromDB, rerun.Options{})
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
// the model: from iteration 2 on, the conversation loses the tool results.
type forgetfulProvider struct{ inner provider.Provider }

func (p forgetfulProvider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	req.Messages = slices.DeleteFunc(slices.Clone(req.Messages), func(m envelope.Message) bool {
		return m.Role == envelope.RoleTool
	})
	return p.inner.Complete(ctx, req)
}

// narrowProvider stands for an orchestrator that offers the model fewer
// tools from iteration 2 on.
type narrowProvider struct{ inner provider.Provider }

func (p narrowProvider) Complete(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
	if req.Iteration >= 2 && len(req.Tools) > 0 {
		req.Tools = req.Tools[:len(req.Tools)-1]
	}
	return p.inner.Complete(ctx, req)
}

func changedOrchestrator(wrap func(provider.Provider) provider.Provider) rerun.OrchestratorFactory {
	return func(d service.Deps, cfg orchestrator.Config) (service.Component, error) {
		ps := orchestrator.Providers{}
		for name, p := range cfg.Providers {
			ps[name] = wrap(p)
		}
		cfg.Providers = ps
		return orchestrator.New(d, cfg)
	}
}

// divergence replays b against an orchestrator whose model is wrapped by
// wrap and returns the divergence it must report.
func divergence(t *testing.T, b rerun.Bundle, wrap func(provider.Provider) provider.Provider) *rerun.Divergence {
	t.Helper()
	rep, err := rerun.Run(t.Context(), b, rerun.Options{Orchestrator: changedOrchestrator(wrap)})
	require.NoError(t, err)
	require.NotNil(t, rep.Divergence, "the replay is clean")
	return rep.Divergence
}

// TestReplayReportsDivergence: deliberately changed orchestrator behaviours
// are reported at the first step that differs, and the replay stops there.
func TestReplayReportsDivergence(t *testing.T) {
	rec := record(t)
	order := rec.bundle.Outputs.ToolOrder

	t.Run("parallel calls reordered", func(t *testing.T) {
		rep, err := rerun.Run(t.Context(), rec.bundle, rerun.Options{
			Orchestrator: changedOrchestrator(func(p provider.Provider) provider.Provider { return reorderingProvider{p} }),
		})
		require.NoError(t, err)
		require.False(t, rep.Clean)
		d := rep.Divergence
		require.NotNil(t, d)
		// Steps: 1 turn 1, 2-3 its calls, 4 turn 2, 5 call #3 (lookup), ...
		require.Equal(t, 5, d.Step.N, d.Error())
		require.Equal(t, rerun.StepToolCall, d.Step.Kind)
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
		d := divergence(t, rec.bundle, func(p provider.Provider) provider.Provider { return forgetfulProvider{p} })
		require.Equal(t, 4, d.Step.N, d.Error())
		require.Equal(t, rerun.StepModelTurn, d.Step.Kind)
		require.Equal(t, 2, d.Step.Iteration)
		// The results of turn 1's calls, the first of which is the calculator's.
		require.Contains(t, d.What, "the conversation sent to the model lacks the result of tool call #1 (iteration 1, calculator@1.0.0)")
		require.Contains(t, d.Recorded, "a tool message for tool call #1")
	})

	t.Run("tools offered changed", func(t *testing.T) {
		d := divergence(t, rec.bundle, func(p provider.Provider) provider.Provider { return narrowProvider{p} })
		require.Equal(t, 4, d.Step.N, d.Error())
		require.Equal(t, "the tools offered to the model differ", d.What)
		require.Contains(t, d.Recorded, "append_note@1.0.0")
		require.NotContains(t, d.Replayed, "append_note@1.0.0")
	})

	t.Run("loop rules changed", func(t *testing.T) {
		// The same recording under a policy that allows one model call: the
		// orchestrator's loop rules deny iteration 2, which the recording
		// allowed.
		b := rec.bundle
		b.Request.Agent.Policy.MaxIterations = 1
		rep, err := rerun.Run(t.Context(), b, rerun.Options{})
		require.NoError(t, err)
		d := rep.Divergence
		require.NotNil(t, d)
		require.Equal(t, 4, d.Step.N, d.Error())
		require.Equal(t, rerun.StepModelTurn, d.Step.Kind)
		require.Equal(t, "the loop rules' verdict on iteration 2 differs", d.What)
		require.Equal(t, "allowed", d.Recorded)
		require.Contains(t, d.Replayed, "denied POLICY_DENIED")
		require.Equal(t, int64(1), rec.write.runs.Load())
	})
}

// TestReplayLive: --live executes the calls of none and reads tools again and
// reports the outputs that changed (the lookup reads a new value); the writes
// tool is never executed: it gets its recorded envelope.
func TestReplayLive(t *testing.T) {
	rec := record(t)
	order := rec.bundle.Outputs.ToolOrder
	lookupID, appendID := order[2], order[3]

	rep, err := rerun.Run(t.Context(), rec.bundle, rerun.Options{Live: true,
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
	good := rerun.Bundle{Status: events.StatusCompleted}
	good.RunID = "r1"
	good.Request = scriptedRequest(t, "r1")
	good.Turns = []envelope.ModelTurn{{Iteration: 1, Response: envelope.ModelResponse{Content: "hi"}}}
	cases := map[string]func(b *rerun.Bundle){
		"no turns":           func(b *rerun.Bundle) { b.Turns = nil },
		"turns out of order": func(b *rerun.Bundle) { b.Turns[0].Iteration = 2 },
		"another run":        func(b *rerun.Bundle) { b.Request.RunID = "r2" },
		"invalid request":    func(b *rerun.Bundle) { b.Request.Messages = nil },
		"no status":          func(b *rerun.Bundle) { b.Status = "" },
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			b := good
			b.Turns = slices.Clone(good.Turns)
			spoil(&b)
			_, err := rerun.Run(t.Context(), b, rerun.Options{})
			require.ErrorIs(t, err, rerun.ErrBundle)
		})
	}
	_, err := rerun.FromRecorder(t.Context(), "ftp://x", "r1")
	require.Error(t, err)
	_, err = rerun.FromRecorder(t.Context(), "http://127.0.0.1:1", "bad id!")
	require.Error(t, err)
}

// TestReplayVersion1Bundle: a bundle recorded before contract v2 (no version,
// the messages of every turn) replays clean: its messages are ignored, every
// call is checked by its call id and answered with its recorded envelope.
func TestReplayVersion1Bundle(t *testing.T) {
	b := readBundle(t, "testdata/v1-demo-bundle.json")
	require.Zero(t, b.Version)
	require.NotEmpty(t, b.Turns[1].Messages, "a version 1 bundle has its messages")
	rep, err := rerun.Run(t.Context(), b, rerun.Options{})
	require.NoError(t, err)
	require.True(t, rep.Clean, "divergence: %v", rep.Divergence)
	require.Equal(t, events.StatusCompleted, rep.Status)
	require.Len(t, rep.Steps, 1+3+1+1+1+1, stepTitles(rep.Steps)) // 3 turns, 4 calls, the outcome
	for _, s := range rep.Steps {
		require.True(t, s.Checked && s.OK, "step %s", s.Title())
	}
}

// TestReplayRefusesANewerVersion: a bundle of a version newer than this
// build reads is refused before anything runs, with both versions named;
// one below 1 too.
func TestReplayRefusesANewerVersion(t *testing.T) {
	f, err := os.Open("testdata/v3-bundle.json")
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	_, err = rerun.ReadBundle(f)
	require.ErrorIs(t, err, rerun.ErrBundle)
	require.ErrorIs(t, err, rerun.ErrBundleVersion)
	require.ErrorContains(t, err, "of version 3, newer than this build reads (versions 1 to 2)")

	// The same refusal from Run, whatever else the bundle holds.
	b := readBundle(t, "testdata/v1-demo-bundle.json")
	for v, want := range map[int]string{3: "of version 3, newer than this build reads (versions 1 to 2)",
		-1: "of version -1; versions start at 1"} {
		b.Version = v
		_, err = rerun.Run(t.Context(), b, rerun.Options{})
		require.ErrorIs(t, err, rerun.ErrBundleVersion)
		require.ErrorContains(t, err, want)
	}
	for _, v := range []int{0, 1, envelope.ReplayBundleVersion} {
		b.Version = v
		require.NoError(t, rerun.CheckVersion(b), "version %d", v)
	}
}

func readBundle(t *testing.T, path string) rerun.Bundle {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	b, err := rerun.ReadBundle(f)
	require.NoError(t, err)
	return b
}

// TestFromRecorderErrors: the recorder's error is passed on.
func TestFromRecorderErrors(t *testing.T) {
	rec := record(t)
	_, err := rerun.FromRecorder(t.Context(), rec.apiURL, "no-such-run")
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

package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/stack"
)

// stackTool is an in-process tool for the stack tests; it counts its runs per
// run and call.
type stackTool struct {
	def envelope.ToolDefinition
	run func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)

	mu   sync.Mutex
	runs map[string]int // "<run_id> <call_id>"
	// last is when the tool last started a call of each run.
	last map[string]time.Time
}

func newStackTool(name string, meta envelope.ToolMetadata, run func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)) *stackTool {
	return &stackTool{
		def: envelope.ToolDefinition{
			Name: name, Version: "1.0.0", Description: "stack test tool " + name,
			InputSchema: json.RawMessage(`{"type":"object"}`), Metadata: meta,
			Implementation: toolapi.BuiltinImplementation("stack_" + name),
		},
		run:  run,
		runs: map[string]int{},
		last: map[string]time.Time{},
	}
}

func (s *stackTool) Definition() envelope.ToolDefinition { return s.def }

func (s *stackTool) Execute(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	s.mu.Lock()
	s.runs[tc.RunID+" "+tc.CallID]++
	s.last[tc.RunID] = time.Now()
	s.mu.Unlock()
	return s.run(ctx, input)
}

// lastStarts returns when the tool last started a call, by run id.
func (s *stackTool) lastStarts() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.last)
}

// counts returns how many times the tool ran, by "<run_id> <call_id>".
func (s *stackTool) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.runs)
}

func (s *stackTool) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.runs {
		n += c
	}
	return n
}

// onlyEnvelope returns the envelope of the run's call at seq.
func envelopeAt(t *testing.T, final *events.RunStatus, seq int) envelope.ToolEnvelope {
	t.Helper()
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.GreaterOrEqual(t, len(final.Outputs.ToolOrder), seq)
	return final.Outputs.ToolsByID[final.Outputs.ToolOrder[seq-1]]
}

// TestCacheAcrossRunsAndTenants: a cached tool's result is served to a later
// run of the same tenant (cached, with that call's own id and times) and never
// to another tenant's run.
func TestCacheAcrossRunsAndTenants(t *testing.T) {
	lookup := newStackTool("city_lookup", envelope.ToolMetadata{
		Category: envelope.CategoryData, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheTTL, CacheTTLS: 3600,
	}, func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(`{"city":"Lyon","population":522250}`), nil
	})
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(lookup)}})
	tools := []string{"city_lookup@1.0.0", "echo@1.0.0"}
	args := map[string]any{"q": "lyon"}
	done := map[string]any{"content": "done"}

	first := runToEnd(t, st, scripted(t, "cache-acme-1", tools,
		map[string]any{"tool_calls": []any{call("city_lookup", args)}}, done))
	miss := envelopeAt(t, first, 1)
	require.Nil(t, miss.Error)
	require.False(t, miss.Cached)

	// The same tenant's next run asks the same question as its second call.
	second := runToEnd(t, st, scripted(t, "cache-acme-2", tools,
		map[string]any{"tool_calls": []any{call("echo", map[string]any{"text": "first"})}},
		map[string]any{"tool_calls": []any{call("city_lookup", map[string]any{"q": "lyon"})}}, done))
	hit := envelopeAt(t, second, 2)
	require.Nil(t, hit.Error)
	require.True(t, hit.Cached, "served from the cache")
	require.JSONEq(t, string(miss.Output), string(hit.Output))
	wantID, err := envelope.CallID("city_lookup", "1.0.0", []byte(`{"q":"lyon"}`), 2)
	require.NoError(t, err)
	require.Equal(t, wantID, hit.CallID, "the new call's own id")
	require.NotEqual(t, miss.CallID, hit.CallID)
	require.False(t, hit.TStart.Before(miss.TEnd), "the new call's own times")
	require.Equal(t, 1, lookup.total(), "the tool ran once for acme")

	// Another tenant asking the same question runs the tool.
	other := scripted(t, "cache-globex-1", tools, map[string]any{"tool_calls": []any{call("city_lookup", args)}}, done)
	other.Tenant = envelope.Tenant{OrgID: "globex", WorkspaceID: "ws1", UserID: "u1"}
	third := envelopeAt(t, runToEnd(t, st, other), 1)
	require.Nil(t, third.Error)
	require.False(t, third.Cached, "one tenant never reads another's cache")
	require.Equal(t, miss.CallID, third.CallID, "same tool, input and seq: same call id, yet no hit")
	require.Equal(t, 2, lookup.total())
}

// TestScaleOut: three executor replicas share the calls of many runs through
// one durable consumer: every call runs exactly once and every replica runs
// some of them.
func TestScaleOut(t *testing.T) {
	work := newStackTool("work", envelope.ToolMetadata{
		Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone,
	}, func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		t := time.NewTimer(20 * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			return in, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	st := startStack(t, stack.Options{
		ExecutorReplicas: 3, ExecutorConcurrency: 2,
		// Started at once: each call's started event names its replica (a
		// 20ms call publishes none by default).
		ExecutorOptions: []executor.Option{executor.WithTools(work), func(c *executor.Config) { c.StartedAfter = -1 }},
	})
	const runs, callsPerRun = 12, 4
	var reqs []envelope.RunRequest
	for r := range runs {
		var calls []any
		for c := range callsPerRun {
			calls = append(calls, call("work", map[string]any{"run": r, "call": c}))
		}
		req := scripted(t, fmt.Sprintf("scale-%d", r), []string{"work@1.0.0"},
			map[string]any{"tool_calls": calls}, map[string]any{"content": "done"})
		reqs = append(reqs, req)
		require.NoError(t, st.Client.Submit(t.Context(), req))
	}

	byReplica := map[string]int{}
	for _, req := range reqs {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		final, err := st.Client.Wait(ctx, req.RunID)
		cancel()
		require.NoError(t, err)
		require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
		require.Len(t, final.Outputs.ToolOrder, callsPerRun)
		for _, id := range final.Outputs.ToolOrder {
			require.Nil(t, final.Outputs.ToolsByID[id].Error)
			// Which replica ran it: its call.started event says.
			subj, err := events.CallSubject(req.RunID, id, "started")
			require.NoError(t, err)
			var s events.CallStarted
			require.True(t, lastEventData(t, st.JS, events.StreamCalls, subj, &s), "no started event of %s", id)
			byReplica[s.Executor]++
		}
	}
	t.Logf("calls per replica: %v", byReplica)
	work.mu.Lock()
	require.Len(t, work.runs, runs*callsPerRun)
	for k, n := range work.runs {
		require.Equal(t, 1, n, "call %s ran %d times", k, n)
	}
	work.mu.Unlock()
	require.Len(t, byReplica, 3, "every replica did some of the work")
	total := 0
	for id, n := range byReplica {
		require.Contains(t, []string{"executor-0", "executor-1", "executor-2"}, id)
		require.Positive(t, n)
		total += n
	}
	require.Equal(t, runs*callsPerRun, total)
}

// TestTruncatedOutputServedByURL: a 5 MiB output is truncated in the envelope
// and fetched back whole through its attachment's url on the HTTP server.
func TestTruncatedOutputServedByURL(t *testing.T) {
	payload := []byte(`{"rows":"` + strings.Repeat("0123456789abcdef", 5<<20/16) + `"}`)
	dump := newStackTool("dump", envelope.ToolMetadata{
		Category: envelope.CategoryData, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone,
	}, func(context.Context, json.RawMessage) (json.RawMessage, error) { return payload, nil })
	st := startStack(t, stack.Options{Recorder: recorder.ForStack(pgtest.Schema(t)), ExecutorOptions: []executor.Option{executor.WithTools(dump)}})

	final := runToEnd(t, st, scripted(t, "truncate-1", []string{"dump@1.0.0"},
		map[string]any{"tool_calls": []any{call("dump", map[string]any{})}}, map[string]any{"content": "done"}))
	env := envelopeAt(t, final, 1)
	require.Nil(t, env.Error)
	require.True(t, env.Truncated)
	require.Len(t, env.Attachments, 1)
	att := env.Attachments[0]
	require.Equal(t, envelope.AttachmentBlob, att.Kind)
	require.Equal(t, "application/json", att.ContentType)
	require.Equal(t, int64(len(payload)), att.Bytes)
	require.True(t, strings.HasPrefix(att.URL, "/v1/blobs/"), att.URL)
	var preview executor.TruncatedOutput
	require.NoError(t, json.Unmarshal(env.Output, &preview), "the preview is valid JSON")
	require.True(t, preview.Truncated)
	require.Equal(t, len(payload), preview.Bytes)
	require.True(t, bytes.HasPrefix(payload, []byte(preview.Preview)))

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, st.HTTPURL+att.URL, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, len(payload), len(body))
	require.True(t, bytes.Equal(payload, body), "the blob comes back whole")

	code, _ := get(t, st.HTTPURL+"/v1/blobs/no-such-blob")
	require.Equal(t, http.StatusNotFound, code)
}

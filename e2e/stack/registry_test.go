package stack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// gateTool waits, in call n, until gate n is opened; entered says it is in.
type gateTool struct {
	gates   []chan struct{}
	entered chan int
}

func (g *gateTool) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: "gate", Version: "1.0.0", Description: "waits for the test",
		InputSchema:    json.RawMessage(`{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone},
		Implementation: toolapi.BuiltinImplementation("stack_gate"),
	}
}

func (g *gateTool) Execute(ctx context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in struct{ N int }
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	g.entered <- in.N
	select {
	case <-g.gates[in.N]:
		return json.RawMessage(`{"opened":true}`), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// probeDef is a registry entry run by the echo built-in.
func probeDef(version string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: "probe", Version: version, Description: "echoes, under another name",
		InputSchema:    json.RawMessage(`{"type":"object","required":["text"],"properties":{"text":{"type":"string"}}}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone},
		Implementation: toolapi.BuiltinImplementation("echo"),
	}
}

// within is the bound the issue sets on a registry change reaching the
// running services.
const within = time.Second

// TestRegistryChangesReachRunningServices: deprecating and blocking a tool
// version takes effect on the running services within a second, without a
// restart; a new version is a new entry and the old one stays callable until
// blocked.
func TestRegistryChangesReachRunningServices(t *testing.T) {
	const inFlight = 8
	gate := &gateTool{entered: make(chan int, inFlight)}
	for range inFlight {
		gate.gates = append(gate.gates, make(chan struct{}))
	}
	st := startStack(t, stack.Options{Recorder: recorder.ForStack(pgtest.Schema(t)), ExecutorOptions: []executor.Option{executor.WithTools(gate)}})
	ctx := t.Context()
	reg, err := registry.Open(ctx, st.JS)
	require.NoError(t, err)
	_, err = reg.Register(ctx, probeDef("1.0.0"))
	require.NoError(t, err)
	v1 := envelope.ToolRef{Name: "probe", Version: "1.0.0"}
	done := map[string]any{"content": "done"}
	probeTurn := map[string]any{"tool_calls": []any{call("probe", map[string]any{"text": "hi"})}}
	n := 0
	probeRun := func(version string) (*events.RunStatus, []string) {
		n++
		req := scripted(t, fmt.Sprintf("reg-probe-%d", n), []string{"probe@" + version}, probeTurn, done)
		var warnings []string
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, st.Client.Submit(cctx, req))
		final, err := st.Client.Follow(cctx, req.RunID, func(e client.Event) bool {
			// A run's warnings are on its first turn.
			if e.Event.Type() == events.TypeTurnCompleted {
				var tr events.Turn
				require.NoError(t, events.DecodeData(e.Event, &tr))
				if tr.Iteration == 1 {
					warnings = tr.Warnings
				}
			}
			return true
		})
		require.NoError(t, err)
		return final, warnings
	}
	catalog := func(query string) map[string]apitypes.CatalogToolJSON {
		code, body := get(t, st.HTTPURL+"/v1/tools"+query)
		require.Equal(t, http.StatusOK, code, string(body))
		var c apitypes.CatalogJSON
		require.NoError(t, json.Unmarshal(body, &c))
		out := map[string]apitypes.CatalogToolJSON{}
		for _, tool := range c.Tools {
			out[tool.Ref] = tool
		}
		return out
	}

	final, warnings := probeRun("1.0.0")
	require.Nil(t, envelopeAt(t, final, 1).Error)
	require.Empty(t, warnings)
	require.Contains(t, catalog(""), "probe@1.0.0")

	// Runs that are in flight when probe@1.0.0 gets blocked: each waits in
	// its first turn (gate), and calls probe@1.0.0 in its second.
	for i := range inFlight {
		req := scripted(t, fmt.Sprintf("reg-inflight-%d", i), []string{"gate@1.0.0", "probe@1.0.0"},
			map[string]any{"tool_calls": []any{call("gate", map[string]any{"n": i})}}, probeTurn, done)
		require.NoError(t, st.Client.Submit(ctx, req))
	}
	for range inFlight {
		select {
		case <-gate.entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the in-flight runs did not reach their gates")
		}
	}

	// Deprecate: hidden from the catalog, warned about at the start of a run,
	// still callable.
	require.NoError(t, reg.SetState(ctx, v1, registry.StateDeprecated))
	deprecatedAt := time.Now()
	servicetest.PollUntil(t, within, "a new run warns about the deprecated version", func() bool {
		final, warnings = probeRun("1.0.0")
		return len(warnings) == 1
	})
	t.Logf("deprecation seen by the orchestrator after %s", time.Since(deprecatedAt))
	require.Equal(t, []string{"tool probe@1.0.0 is deprecated"}, warnings)
	require.Nil(t, envelopeAt(t, final, 1).Error, "a deprecated version is still callable")
	require.NotContains(t, catalog(""), "probe@1.0.0")
	require.True(t, catalog("?show_deprecated=true")["probe@1.0.0"].Deprecated)

	// A new version is a new entry; the old one stays.
	_, err = reg.Register(ctx, probeDef("2.0.0"))
	require.NoError(t, err)
	final, _ = probeRun("2.0.0")
	require.Nil(t, envelopeAt(t, final, 1).Error)

	// Block: an in-flight run's next call of it is refused by the Policy
	// Guard with POLICY_DENIED, a new run is refused at its start, and the
	// catalog never lists it.
	require.NoError(t, reg.SetState(ctx, v1, registry.StateBlocked))
	blockedAt := time.Now()
	released := 0
	var refused envelope.ToolEnvelope
	servicetest.PollUntil(t, within, "a call of a blocked version is refused", func() bool {
		i := released
		released++
		close(gate.gates[i])
		final, err := st.Client.Wait(ctx, fmt.Sprintf("reg-inflight-%d", i))
		require.NoError(t, err)
		refused = envelopeAt(t, final, 2)
		return refused.Error != nil
	})
	t.Logf("block seen by the guard after %s (%d in-flight runs released)", time.Since(blockedAt), released)
	require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "tool probe@1.0.0 is blocked"}, refused.Error)
	for i := released; i < inFlight; i++ { // and every later call too
		close(gate.gates[i])
		final, err := st.Client.Wait(ctx, fmt.Sprintf("reg-inflight-%d", i))
		require.NoError(t, err)
		require.Equal(t, "tool probe@1.0.0 is blocked", envelopeAt(t, final, 2).Error.Message)
	}
	servicetest.PollUntil(t, within, "a new run with the blocked version is refused", func() bool {
		final, _ = probeRun("1.0.0")
		return final.Status == events.StatusFailed
	})
	require.Equal(t, "invalid run request: agent.enabled_tools: tool probe@1.0.0 is blocked", final.Reason)
	require.NotContains(t, catalog("?show_deprecated=true"), "probe@1.0.0")
	final, _ = probeRun("2.0.0")
	require.Nil(t, envelopeAt(t, final, 1).Error, "the new version is unaffected")

	// And back.
	require.NoError(t, reg.SetState(ctx, v1, registry.StateActive))
	servicetest.PollUntil(t, within, "an activated version runs again", func() bool {
		final, _ = probeRun("1.0.0")
		return final.Status == events.StatusCompleted && envelopeAt(t, final, 1).Error == nil
	})
}

// TestDraftRefusedUntilPublished: a draft version is refused when a run
// enables it (the run fails saying so, before any model call), is absent
// from the catalog, and runs once it is published.
func TestDraftRefusedUntilPublished(t *testing.T) {
	st := startStack(t, stack.Options{Recorder: recorder.ForStack(sqlite.URL(filepath.Join(t.TempDir(), "recorder.db")))})
	ctx := t.Context()
	reg, err := registry.Open(ctx, st.JS)
	require.NoError(t, err)
	def := probeDef("2.0.0")
	def.Name = "beta_probe"
	_, err = reg.RegisterDraftAs(ctx, def, "reviewer")
	require.NoError(t, err)
	turns := []map[string]any{{"tool_calls": []any{call("beta_probe", map[string]any{"text": "hi"})}}, {"content": "done"}}

	final := runToEnd(t, st, scripted(t, "draft-before", []string{"beta_probe@2.0.0"}, turns...))
	require.Equal(t, events.StatusFailed, final.Status)
	require.Contains(t, final.Reason, "tool beta_probe@2.0.0 is draft: it does not run until it is published")
	code, body := get(t, st.HTTPURL+"/v1/tools?search=beta_probe&show_deprecated=true")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, string(body), "beta_probe@2.0.0", "a draft is in no catalog")

	// A registry change reaches the services within a second (within), as
	// a block or an activation does above: not at once.
	require.NoError(t, reg.Publish(ctx, def.Ref(), "reviewer"))
	n := 0
	servicetest.PollUntil(t, within, "the published version runs", func() bool {
		n++
		final = runToEnd(t, st, scripted(t, fmt.Sprintf("draft-after-%d", n), []string{"beta_probe@2.0.0"}, turns...))
		return final.Status == events.StatusCompleted
	})
	require.JSONEq(t, `{"text":"hi"}`, string(envelopeAt(t, final, 1).Output))
	e, err := reg.Get(ctx, def.Ref())
	require.NoError(t, err)
	require.Equal(t, "reviewer", e.UpdatedBy)
}

package orchestrator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/openai"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

// A provider that keeps failing ends the run with a clear reason, after the
// adapter's retries.
func TestProviderThatKeepsFailingFailsTheRun(t *testing.T) {
	h := orchestratortest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	f := providertest.New(t, providertest.Reply{Status: 503, Headers: map[string]string{"Retry-After": "0"},
		Body: `{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error","param":null,"code":null}}`})
	h.Start("o1", orchestrator.Config{Providers: orchestrator.Providers{
		openai.Name: openai.New(provider.Config{APIKey: "k", BaseURL: f.URL, MaxRetries: 2}),
	}})
	req := envelope.RunRequest{RunID: "failing-model", Tenant: envelope.Tenant{OrgID: "acme"},
		Agent:    envelope.Agent{Name: "agent", Model: envelope.Model{Provider: "openai", Name: "gpt-4o-mini"}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}
	h.Submit(ctx, req)
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusFailed, final.Status)
	require.Equal(t, envelope.CodeProviderError, final.Code)
	require.Equal(t, "model call failed: openai model gpt-4o-mini failed after 3 attempts: OpenAI API error: 503 Service Unavailable: "+
		"The engine is currently overloaded, please try again later", final.Reason)
	require.Len(t, f.Requests(), 3)
}

// An unknown provider or a missing model name is refused at the start with a
// hint.
func TestRunRequestProviderRejections(t *testing.T) {
	h := orchestratortest.New(t)
	h.Start("o1", orchestrator.Config{})
	for _, tc := range []struct {
		model  envelope.Model
		reason string
	}{
		{envelope.Model{Provider: "openai", Name: "gpt-4o"}, `unknown model provider "openai"`},
		{envelope.Model{Provider: "openai", Name: "gpt-4o"}, "set OPENAI_API_KEY"},
		{envelope.Model{Provider: "anthropic", Name: "claude-haiku-4-5"}, "set ANTHROPIC_API_KEY"},
	} {
		id := fmt.Sprintf("rej-%s-%d", tc.model.Provider, len(tc.reason))
		final := h.Run(envelope.RunRequest{RunID: id, Tenant: envelope.Tenant{OrgID: "acme"},
			Agent:    envelope.Agent{Name: "agent", Model: tc.model},
			Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}, 30*time.Second)
		require.Equal(t, events.StatusFailed, final.Status)
		require.True(t, strings.Contains(final.Reason, tc.reason), final.Reason)
	}
}

// A run stores few events: the turn that answers without calls is not an
// event of its own but rides on the run's completed event, and a quick run
// publishes no started event. When the orchestrator dies after that end is
// stored and before its state says so, the redelivered completion finds the
// answer in the end event and the model is not called again.
func TestFinalTurnRidesOnTheEnd(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	var mu sync.Mutex
	modelCalls := map[int]int{}
	failed := false
	h.Start("o1", orchestrator.Config{
		Providers: orchestrator.Providers{scripted.Name: provider.Func(func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
			mu.Lock()
			modelCalls[r.Iteration]++
			mu.Unlock()
			return scripted.Provider{}.Complete(ctx, r)
		})},
		Faults: orchestrator.FaultsFunc(func(_ context.Context, p orchestrator.FaultPoint, _ string, it int) error {
			mu.Lock()
			defer mu.Unlock()
			if p == orchestrator.FaultAfterPublishTurn && it == 2 && !failed {
				failed = true
				return errors.New("injected: died after the end was stored")
			}
			return nil
		}),
	})
	req := orchestratortest.Scripted(t, "lean-1", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "hi"})}},
		map[string]any{"content": "said hi"},
	)
	h.Submit(ctx, req)
	c := g.Request(req.RunID, "echo", map[string]any{"text": "hi"}, 1)
	g.Approve(c)
	g.Complete(c, json.RawMessage(`{"text":"hi"}`))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, "said hi", final.Outputs.Response)
	require.NotNil(t, final.Turn)
	require.Equal(t, 2, final.Turn.Iteration)
	require.Equal(t, "said hi", final.Turn.Response.Content)
	require.Empty(t, final.Turn.Calls)

	runs := orchestratortest.CountBySubject(h.StreamEvents(ctx)[req.RunID])
	require.Equal(t, map[string]int{
		"toolwire.run.lean-1.requested": 1, "toolwire.run.lean-1.turn.1.completed": 1, "toolwire.run.lean-1.completed": 1,
		"toolwire.call.lean-1." + c.CallID + ".approved.default": 1, "toolwire.call.lean-1." + c.CallID + ".completed": 1,
	}, runs, "five events for a one-call run")
	// The redelivered completion brings the run's state to its end.
	kv, err := h.Env.JS.KeyValue(ctx, events.BucketRunState)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		e, err := kv.Get(ctx, req.RunID)
		if err != nil {
			return false
		}
		var st orchestrator.RunState
		return json.Unmarshal(e.Value(), &st) == nil && st.Phase == orchestrator.PhaseComplete
	}, 30*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.True(t, failed, "the fault was reached")
	require.Equal(t, map[int]int{1: 1, 2: 1}, modelCalls, "each model call made once")
}

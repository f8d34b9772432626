package orchestrator_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// endsOf returns the completed and failed events of a run.
func endsOf(t *testing.T, h *orchestratortest.Harness, ctx context.Context, runID string) (completed, failed []orchestratortest.Stored) {
	t.Helper()
	evs := h.StreamEvents(ctx)[runID]
	return orchestratortest.OfType(evs, events.TypeRunCompleted), orchestratortest.OfType(evs, events.TypeRunFailed)
}

// A run whose call nobody answers ends failed at its deadline, with code
// TIMEOUT and a reason that names the call, its queue and what to check;
// the reaper's timer survives every orchestrator being gone when it fires.
func TestRunFailsAtItsDeadlineWhileWaitingForACall(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	r1 := h.Start("o1", orchestrator.Config{})

	req := orchestratortest.Scripted(t, "deadline-call", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "lost"})}},
		map[string]any{"content": "never"},
	)
	req.DeadlineS = 2
	start := time.Now()
	h.Submit(ctx, req)
	call := g.Request(req.RunID, "echo", map[string]any{"text": "lost"}, 1)
	// Nobody answers the call, and the only orchestrator goes away before
	// the deadline; another starts after it.
	r1.Stop()
	time.Sleep(time.Until(start.Add(4 * time.Second)))
	h.Start("o2", orchestrator.Config{})

	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusFailed, final.Status)
	require.Equal(t, envelope.CodeTimeout, final.Code)
	for _, want := range []string{"run deadline-call passed its deadline", "in iteration 1",
		"waiting for call " + call.CallID + " (echo@1.0.0, queue default)", "toolwire dlq list", "deadline_s"} {
		require.Contains(t, final.Reason, want)
	}
	completed, failed := endsOf(t, h, ctx, req.RunID)
	require.Empty(t, completed)
	require.Len(t, failed, 1)

	// A completion that comes after the end changes nothing.
	g.Complete(call, []byte(`{"text":"lost"}`))
	time.Sleep(300 * time.Millisecond)
	completed, failed = endsOf(t, h, ctx, req.RunID)
	require.Empty(t, completed)
	require.Len(t, failed, 1)
}

// A model that does not answer by the deadline: the call is cut at the
// deadline and the run fails with TIMEOUT, never completes afterwards.
func TestRunFailsAtItsDeadlineWhileTheModelThinks(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	slow := provider.Func(func(ctx context.Context, _ provider.Request) (envelope.ModelResponse, error) {
		<-ctx.Done()
		return envelope.ModelResponse{}, ctx.Err()
	})
	h.Start("o1", orchestrator.Config{RunDeadline: time.Second, Providers: orchestrator.Providers{"slow": slow}})
	req := envelope.RunRequest{RunID: "deadline-model", Tenant: envelope.Tenant{OrgID: "acme"},
		Agent:    envelope.Agent{Name: "agent", Model: envelope.Model{Provider: "slow", Name: "m1"}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}
	final := h.Run(req, 30*time.Second)
	require.Equal(t, events.StatusFailed, final.Status)
	require.Equal(t, envelope.CodeTimeout, final.Code)
	require.Contains(t, final.Reason, "while waiting for the model (slow/m1, iteration 1)")
	time.Sleep(3 * time.Second) // past the reaper's grace: it adds nothing
	completed, failed := endsOf(t, h, ctx, req.RunID)
	require.Empty(t, completed)
	require.Len(t, failed, 1)
}

// A run whose request never gets a state (its handler fails for good, and
// the request is dead-lettered) still ends at its deadline.
func TestRunFailsAtItsDeadlineWhenItsRequestIsDeadLettered(t *testing.T) {
	h := newHarness(t)
	h.Start("o1", orchestrator.Config{RunDeadline: time.Second, Faults: orchestrator.FaultsFunc(
		func(_ context.Context, p orchestrator.FaultPoint, _ string, _ int) error {
			if p == orchestrator.FaultBeforeModel {
				return events.Permanent(errors.New("poison"))
			}
			return nil
		})})
	req := orchestratortest.Scripted(t, "deadline-dlq", nil, envelope.Policy{}, map[string]any{"content": "never"})
	final := h.Run(req, 30*time.Second)
	require.Equal(t, events.StatusFailed, final.Status)
	require.Equal(t, envelope.CodeTimeout, final.Code)
	require.True(t, strings.HasPrefix(final.Reason, "run deadline-dlq passed its deadline before its request was taken up"), final.Reason)
	require.Contains(t, final.Reason, "toolwire dlq list")
}

// A run that ends before its deadline is left alone when its timer fires.
func TestDeadlineLeavesAnEndedRunAlone(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h.Start("o1", orchestrator.Config{RunDeadline: time.Second})
	req := orchestratortest.Scripted(t, "deadline-done", nil, envelope.Policy{}, map[string]any{"content": "quick"})
	final := h.Run(req, 30*time.Second)
	require.Equal(t, events.StatusCompleted, final.Status)
	time.Sleep(3500 * time.Millisecond) // the deadline, its grace, and a moment
	completed, failed := endsOf(t, h, ctx, req.RunID)
	require.Len(t, completed, 1)
	require.Empty(t, failed)
	s, err := h.Env.JS.Stream(ctx, events.StreamTimers)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "the fired timer left nothing behind")
}

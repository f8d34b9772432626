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

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
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
	h, ctx, g := newGuarded(t)
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
	kv, err := h.Env.JS.KeyValue(ctx, provision.BucketRunState)
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

// A request submitted again under a run id that has begun (a new event on
// the run's requested subject, not a retried publish of the first, so past
// the stream's duplicate check, and not on the condition that the run have
// no request) makes no second run and no model call: the run stays as it
// was, whatever the new request says. (The first requests are submitted on
// that condition, so their runs' states are not read.)
func TestRequestSubmittedAgainMakesNoSecondRun(t *testing.T) {
	h, ctx, g := newGuarded(t)
	var mu sync.Mutex
	modelCalls := map[string]int{}
	h.Start("o1", orchestrator.Config{
		Providers: orchestrator.Providers{scripted.Name: provider.Func(func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
			mu.Lock()
			modelCalls[fmt.Sprintf("%s/%d", r.RunID, r.Iteration)]++
			mu.Unlock()
			return scripted.Provider{}.Complete(ctx, r)
		})},
	})
	calls := func(key string) int {
		mu.Lock()
		defer mu.Unlock()
		return modelCalls[key]
	}
	withTool := orchestratortest.Scripted(t, "again-tool", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "hi"})}},
		map[string]any{"content": "said hi"},
	)
	answer := orchestratortest.Scripted(t, "again-answer", nil, envelope.Policy{}, map[string]any{"content": "first"})
	h.Submit(ctx, withTool)
	c := g.Request(withTool.RunID, "echo", map[string]any{"text": "hi"}, 1)
	g.Approve(c)
	g.Complete(c, json.RawMessage(`{"text":"hi"}`))
	for _, req := range []envelope.RunRequest{withTool, answer} {
		if req.RunID == answer.RunID {
			h.Submit(ctx, req)
		}
		final, err := h.Wait(ctx, req.RunID)
		require.NoError(t, err)
		require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	}
	before := h.StreamEvents(ctx)

	// The same run ids again, as new events, with scripts that would answer
	// otherwise, published as a raw publisher may: without the condition
	// that the run have no request (which the stream would check), one of
	// them with that condition's header in a spelling the server ignores
	// (so it is stored, and must not be taken for the condition).
	for i, req := range []envelope.RunRequest{
		orchestratortest.Scripted(t, "again-tool", nil, envelope.Policy{}, map[string]any{"content": "second"}),
		orchestratortest.Scripted(t, "again-answer", []string{"echo@1.0.0"}, envelope.Policy{},
			map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "again"})}}),
	} {
		out, err := events.NewRunRequested("/toolwire/test", req, events.RunTrace{})
		require.NoError(t, err)
		out.Event.SetID(req.RunID + "/requested-again")
		m, err := out.Msg()
		require.NoError(t, err)
		if i == 1 {
			m.Header["nats-expected-last-subject-sequence"] = []string{"0"}
		}
		_, err = h.Env.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	eventstest.Drained(t, h.Env.JS, events.StreamRuns, orchestrator.DurableRuns, 30*time.Second) // both requests handled

	after := h.StreamEvents(ctx)
	for _, id := range []string{"again-tool", "again-answer"} {
		want := orchestratortest.CountBySubject(before[id])
		want["toolwire.run."+id+".requested"]++ // the request submitted again is stored, and nothing else
		require.Equal(t, want, orchestratortest.CountBySubject(after[id]), id)
	}
	for _, key := range []string{"again-tool/1", "again-tool/2", "again-answer/1"} {
		require.Equal(t, 1, calls(key), "model call %s made once", key)
	}
	dlq, err := h.Env.JS.Stream(ctx, events.StreamDLQ)
	require.NoError(t, err)
	info, err := dlq.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "nothing dead-lettered")
}

// newHarness is a JetStream whose registry holds echo@1.0.0, as the executor
// registers it; the tests play the guard's and the executor's parts.
func newHarness(t *testing.T) *orchestratortest.Harness {
	t.Helper()
	h := orchestratortest.New(t)
	h.Register(orchestratortest.Tool("echo", "1.0.0"))
	return h
}

// newGuarded is newHarness with a minute's context for the test and a Guard
// on both, for the tests that play the guard's and the executor's parts.
func newGuarded(t *testing.T) (*orchestratortest.Harness, context.Context, orchestratortest.Guard) {
	t.Helper()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return h, ctx, orchestratortest.Guard{H: h, Ctx: ctx}
}

// A call that waits for an operator's decision suspends the run; the run holds
// nothing in memory meanwhile, so every orchestrator replica can die and a new
// one resume it when the decision arrives.
func TestSuspendedRunResumesOnAnyReplica(t *testing.T) {
	h, ctx, g := newGuarded(t)
	// A dead replica's unacknowledged events come back after the ack wait.
	cfg := orchestrator.Config{AckWait: 2 * time.Second}
	r1, r2 := h.Start("o1", cfg), h.Start("o2", cfg)

	req := orchestratortest.Scripted(t, "suspend-1", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("echo", map[string]any{"text": "needs approval"}),
			orchestratortest.ToolCall("echo", map[string]any{"text": "runs meanwhile"}),
		}},
		map[string]any{"content": "both done"},
	)
	h.Submit(ctx, req)
	waiting := g.Request(req.RunID, "echo", map[string]any{"text": "needs approval"}, 1)
	other := g.Request(req.RunID, "echo", map[string]any{"text": "runs meanwhile"}, 2)

	g.ApprovalRequired(waiting)
	g.Approve(other)
	g.Complete(other, json.RawMessage(`{"text":"runs meanwhile"}`))
	sus := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended"))
	require.Equal(t, "waiting for approval of call "+waiting.CallID+" (echo@1.0.0)", sus.Reason)
	h.Next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+other.CallID+".completed")

	// Every replica dies while the run waits; a new one starts.
	r1.Kill()
	r2.Kill()
	h.Start("o3", cfg)
	g.OperatorApprove(waiting)
	g.Complete(waiting, json.RawMessage(`{"text":"needs approval"}`))
	res := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	// The approval and the completion it leads to race; either resumes.
	require.Contains(t, []string{"call " + waiting.CallID + " (echo@1.0.0) approved", "call " + waiting.CallID + " (echo@1.0.0) completed"},
		res.Reason)
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, "both done", final.Outputs.Response)
	require.Len(t, final.Outputs.ToolOrder, 2)

	evs := h.StreamEvents(ctx)[req.RunID]
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunSuspended), 1)
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunResumed), 1)
	require.Len(t, orchestratortest.OfType(evs, events.TypeTurnCompleted), 1, "the final answer rides on the completed event")
	require.Len(t, orchestratortest.Turns(t, evs), 2)
	require.Empty(t, orchestratortest.OfType(evs, events.TypeRunStarted), "the first model call answered at once: no started event")
}

// A denial arrives as the call's POLICY_DENIED completion: the run resumes and
// the model sees why.
func TestSuspendedRunResumesOnDenial(t *testing.T) {
	h, ctx, g := newGuarded(t)
	var mu sync.Mutex
	var sent [][]envelope.Message // what the model was sent, call by call
	h.Start("o1", orchestrator.Config{Providers: orchestrator.Providers{scripted.Name: provider.Func(
		func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
			mu.Lock()
			sent = append(sent, r.Messages)
			mu.Unlock()
			return scripted.Provider{}.Complete(ctx, r)
		})}})

	req := orchestratortest.Scripted(t, "suspend-2", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("echo", map[string]any{"text": "denied"}),
			orchestratortest.ToolCall("echo", map[string]any{"text": "fine"}),
		}},
		map[string]any{"content": "one was denied"},
	)
	h.Submit(ctx, req)
	calls := []events.CallRequest{
		g.Request(req.RunID, "echo", map[string]any{"text": "denied"}, 1),
		g.Request(req.RunID, "echo", map[string]any{"text": "fine"}, 2),
	}
	g.ApprovalRequired(calls[0])
	h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended")
	// A late or repeated approval request changes nothing.
	g.ApprovalRequired(calls[0])
	g.Approve(calls[1])
	g.Complete(calls[1], json.RawMessage(`{"text":"fine"}`))
	now := time.Now().UTC()
	g.Publish(events.NewCallCompleted("/toolwire/policy", req.RunID, envelope.ToolEnvelope{
		CallID: calls[0].CallID, Name: "echo", Version: "1.0.0", Input: calls[0].Input,
		Error: &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "approval denied"}, TStart: now, TEnd: now,
	}, calls[0].Tenant, events.RunTrace{}))
	res := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	require.Equal(t, "call "+calls[0].CallID+" (echo@1.0.0) completed without approval: POLICY_DENIED: approval denied", res.Reason)

	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	denied := final.Outputs.ToolsByID[calls[0].CallID]
	require.Equal(t, envelope.CodePolicyDenied, denied.Error.Code)

	// The model's second turn saw the denial: its record lists the results
	// it was sent, and the model was sent the conversation rebuilt from the
	// run's events.
	turns := orchestratortest.Turns(t, h.StreamEvents(ctx)[req.RunID])
	require.Len(t, turns, 2)
	turn2 := turns[1]
	require.Equal(t, 2, turn2.Iteration)
	require.Equal(t, "one was denied", turn2.Response.Content)
	require.Equal(t, []events.TurnResult{
		{CallID: calls[0].CallID, ProviderCallID: calls[0].ProviderCallID, IsError: true},
		{CallID: calls[1].CallID, ProviderCallID: calls[1].ProviderCallID},
	}, turn2.Results)
	mu.Lock()
	require.Len(t, sent, 2)
	second := sent[1]
	mu.Unlock()
	var toolMsgs []envelope.Message
	for _, m := range second {
		if m.Role == envelope.RoleTool {
			toolMsgs = append(toolMsgs, m)
		}
	}
	require.Len(t, toolMsgs, 2)
	require.True(t, toolMsgs[0].IsError)
	require.JSONEq(t, `{"error":{"code":"POLICY_DENIED","message":"approval denied"}}`, toolMsgs[0].Content)
	require.False(t, toolMsgs[1].IsError)
	require.Len(t, orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeRunSuspended), 1)
}

// The orchestrator learns of an operator's approval from the guard's approval
// record (approved and settled), not from call.approved: the run resumes with
// the approval as its reason even before the call completes. The replica was
// started with a context that ended right after Start (as service.Run's ends
// after its start-up timeout): the watch of the records outlives it.
func TestSuspendedRunResumesOnTheApprovalRecord(t *testing.T) {
	h, ctx, g := newGuarded(t)
	h.Start("o1", orchestrator.Config{})

	req := orchestratortest.Scripted(t, "suspend-3", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "held"})}},
		map[string]any{"content": "done"},
	)
	h.Submit(ctx, req)
	held := g.Request(req.RunID, "echo", map[string]any{"text": "held"}, 1)
	g.ApprovalRequired(held)
	h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended")

	g.SettleApproval(held)
	res := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed"))
	require.Equal(t, "call "+held.CallID+" (echo@1.0.0) approved", res.Reason)
	require.Len(t, orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeRunResumed), 1)
	require.Zero(t, len(orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeCallCompleted)), "the call itself was never sent on")
}

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
	h, ctx, g := newGuarded(t)
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

// A replica that crashes while it holds a run's request (the run outlasts
// nothing yet, so no timer is stored) leaves the run its deadline all the
// same: the request is redelivered to another replica, which arms the
// timer, and the run fails at its deadline.
func TestRunFailsAtItsDeadlineAfterTheReplicaHoldingItsRequestCrashed(t *testing.T) {
	h, ctx, g := newGuarded(t)
	cfg := orchestrator.Config{AckWait: time.Second, TimerAfter: time.Minute}
	r1 := h.Start("o1", cfg)

	req := orchestratortest.Scripted(t, "deadline-crash", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "lost"})}},
		map[string]any{"content": "never"},
	)
	req.DeadlineS = 3
	h.Submit(ctx, req)
	g.Request(req.RunID, "echo", map[string]any{"text": "lost"}, 1)
	timers, err := h.Env.JS.Stream(ctx, provision.StreamTimers)
	require.NoError(t, err)
	info, err := timers.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "held: no timer stored yet")
	r1.Kill()
	cfg.TimerAfter = 0 // the default
	h.Start("o2", cfg)

	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusFailed, final.Status)
	require.Equal(t, envelope.CodeTimeout, final.Code)
	require.Contains(t, final.Reason, "run deadline-crash passed its deadline")
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
				return consume.Permanent(errors.New("poison"))
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

// A run that ends before its deadline is left alone when its timer fires
// (stored with its first turn here: by default a run this quick stores
// none).
func TestDeadlineLeavesAnEndedRunAlone(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h.Start("o1", orchestrator.Config{RunDeadline: time.Second, TimerAfter: -1})
	req := orchestratortest.Scripted(t, "deadline-done", nil, envelope.Policy{}, map[string]any{"content": "quick"})
	final := h.Run(req, 30*time.Second)
	require.Equal(t, events.StatusCompleted, final.Status)
	time.Sleep(3500 * time.Millisecond) // the deadline, its grace, and a moment
	completed, failed := endsOf(t, h, ctx, req.RunID)
	require.Len(t, completed, 1)
	require.Empty(t, failed)
	s, err := h.Env.JS.Stream(ctx, provision.StreamTimers)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "the fired timer left nothing behind")
}

// intake hands req in on the intake subject of tenant (which may not be the
// request's own: a forgery).
func intake(ctx context.Context, t *testing.T, h *orchestratortest.Harness, tenant envelope.Tenant, req envelope.RunRequest) {
	t.Helper()
	out, err := events.NewRunRequested("/toolwire/test", req, events.RunTrace{})
	require.NoError(t, err)
	out.Subject, err = events.IntakeSubject(tenant, req.RunID)
	require.NoError(t, err)
	out.MsgID = out.Subject // as NewRunIntake
	require.NoError(t, h.Pub.Publish(ctx, out))
}

// deadLetter waits for the dead letter of the intake on subject.
func deadLetter(ctx context.Context, t *testing.T, h *orchestratortest.Harness, subject string) consume.DeadLetter {
	t.Helper()
	dlq, err := h.Env.JS.Stream(ctx, events.StreamDLQ)
	require.NoError(t, err)
	var dl consume.DeadLetter
	require.Eventually(t, func() bool {
		m, err := dlq.GetLastMsgForSubject(ctx, consume.DLQSubject(events.StreamIntake, orchestrator.DurableIntake))
		if err != nil {
			return false
		}
		dl = consume.DeadLetterOf(m)
		return dl.Subject == subject
	}, 20*time.Second, 20*time.Millisecond, "dead letter of %s", subject)
	return dl
}

// TestIntake: a tenant's request handed in on its intake subject becomes the
// run's request and the run completes; one handed in twice is one run; a
// request whose tenant is not its intake subject's, or whose run id is
// another tenant's run, is dead-lettered with the reason and makes no run
// (nor joins the other tenant's).
func TestIntake(t *testing.T) {
	h := orchestratortest.New(t)
	h.Start("o1", orchestrator.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	acme := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws1", UserID: "u1"}
	globex := envelope.Tenant{OrgID: "globex"}
	script := map[string]any{"content": "done"}

	req := orchestratortest.Scripted(t, "in-1", nil, envelope.Policy{}, script)
	req.Tenant = acme
	intake(ctx, t, h, acme, req)
	intake(ctx, t, h, acme, req) // a producer's retry
	st, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, st.Status, st.Reason)
	runs, err := h.Env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	info, err := runs.Info(ctx, jetstream.WithSubjectFilter("toolwire.run.in-1.requested"))
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Subjects["toolwire.run.in-1.requested"], "one request")

	// Another tenant's request in acme's subject, and acme's run id in
	// globex's intake: both refused, neither a run.
	forged := orchestratortest.Scripted(t, "in-2", nil, envelope.Policy{}, script)
	forged.Tenant = globex
	intake(ctx, t, h, acme, forged)
	dl := deadLetter(ctx, t, h, "toolwire.intake.acme.ws1.in-2")
	require.Contains(t, dl.Error, `tenant.org_id "globex" is not the intake subject's "acme"`)
	require.Equal(t, uint64(1), dl.Deliveries, "refused at once, not retried")

	takeover := orchestratortest.Scripted(t, "in-1", nil, envelope.Policy{}, script)
	takeover.Tenant = globex
	intake(ctx, t, h, globex, takeover)
	dl = deadLetter(ctx, t, h, "toolwire.intake.globex._.in-1")
	require.Contains(t, dl.Error, "run in-1 is another tenant's")

	// What is not a run request is refused too.
	bad, err := events.NewRunStatus("/toolwire/test", events.RunStatus{RunID: "in-3", Status: events.StatusCompleted}, "", events.RunTrace{})
	require.NoError(t, err)
	bad.Subject = "toolwire.intake.acme.ws1.in-3"
	require.NoError(t, h.Pub.Publish(ctx, bad))
	dl = deadLetter(ctx, t, h, bad.Subject)
	require.Contains(t, dl.Error, "the intake takes "+events.TypeRunRequested+" and "+events.TypeRunCancelRequested+" only")

	for _, id := range []string{"in-2", "in-3"} {
		_, err := runs.GetLastMsgForSubject(ctx, "toolwire.run."+id+".>")
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "%s made no run", id)
	}
	// in-1 is still acme's run, and the intake holds nothing: each request
	// was taken, handed over or refused.
	m, err := runs.GetLastMsgForSubject(ctx, "toolwire.run.in-1.requested")
	require.NoError(t, err)
	require.Equal(t, acme.ID(), m.Header.Get("ce-"+events.ExtTenantID))
	in, err := h.Env.JS.Stream(ctx, events.StreamIntake)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := in.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 20*time.Millisecond, "the intake is a work queue")
}

// TestIntakeIDsAreTheRuns (issue 29): a producer chooses its request's
// ce-id, and a tenant that learnt another tenant's event ids (they are
// deterministic) may choose one of those: the request of the other's
// future run, or its end. The orchestrator hands every request over under
// its own run's id, so the other tenant's request is handed over and its
// run ends, and the stored request of the first carries its own run's id.
func TestIntakeIDsAreTheRuns(t *testing.T) {
	h := orchestratortest.New(t)
	h.Start("o1", orchestrator.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	acme := envelope.Tenant{OrgID: "acme"}
	globex := envelope.Tenant{OrgID: "globex", WorkspaceID: "w"}
	script := map[string]any{"content": "done"}
	runs, err := h.Env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)

	// acme's runs, under ids of globex's runs to come.
	for runID, id := range map[string]string{
		"col-a1": events.RunRequestedID("col-b1"),
		"col-a2": "col-b2/completed",
	} {
		req := orchestratortest.Scripted(t, runID, nil, envelope.Policy{}, script)
		req.Tenant = acme
		out, err := events.NewRunIntake("/toolwire/test", req, events.RunTrace{})
		require.NoError(t, err)
		out.Event.SetID(id)
		out.MsgID += "/1"
		require.NoError(t, h.Pub.Publish(ctx, out))
		st, err := h.Wait(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, events.StatusCompleted, st.Status, st.Reason)
		m, err := runs.GetLastMsgForSubject(ctx, "toolwire.run."+runID+".requested")
		require.NoError(t, err)
		require.Equal(t, events.RunRequestedID(runID), m.Header.Get(events.HeaderMsgID))
		require.Equal(t, events.RunRequestedID(runID), m.Header.Get("ce-id"))
	}
	// A message of the runs stream under the Nats-Msg-Id of a run's request
	// that is not that request (a producer trusted with every tenant may
	// publish one): the intake it drops is dead-lettered, with the reason.
	squat, err := events.NewRunStatus("/toolwire/test", events.RunStatus{RunID: "col-y", Status: events.StatusStarted}, "", events.RunTrace{})
	require.NoError(t, err)
	squat.MsgID = events.RunRequestedID("col-z")
	require.NoError(t, h.Pub.Publish(ctx, squat))
	dropped := orchestratortest.Scripted(t, "col-z", nil, envelope.Policy{}, script)
	dropped.Tenant = globex
	intake(ctx, t, h, globex, dropped)
	dl := deadLetter(ctx, t, h, "toolwire.intake.globex.w.col-z")
	require.Contains(t, dl.Error, "dropped it as the duplicate of another message under Nats-Msg-Id col-z/requested")

	// globex's runs: handed over, and ended.
	for _, runID := range []string{"col-b1", "col-b2"} {
		req := orchestratortest.Scripted(t, runID, nil, envelope.Policy{}, script)
		req.Tenant = globex
		intake(ctx, t, h, globex, req)
		st, err := h.Wait(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, events.StatusCompleted, st.Status, st.Reason)
		m, err := runs.GetLastMsgForSubject(ctx, "toolwire.run."+runID+".requested")
		require.NoError(t, err)
		require.Equal(t, globex.ID(), m.Header.Get("ce-"+events.ExtTenantID))
	}
}

// The envelope of a turn's last call drives the next model call before the
// run's state records it; when the model then answers, the run's end is
// published and the state records the envelope with it in one write. A new
// run's state is kept by the replica that started it until a change of it
// is written (stateStore.stash), so a one-call run that ends before its
// request is settled writes its state not at all; a turn of calls is still
// preceded by the write of the envelope that led to it (which creates the
// state), so that its own envelopes find the run calling the model. A
// snapshot gone stale (the state changed by another replica; here the call's
// approval, written straight into KV) is caught by the end's write: the
// envelope is applied to the state as it is, and the run's resumption is
// published.
func TestLastEnvelopeEndsTheRunInOneStateWrite(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	// The requests are held (a run's state is its replica's) until the
	// runs end: no timer, and no flush of a state, comes before.
	h.Start("o1", orchestrator.Config{TimerAfter: time.Minute})
	kv, err := h.Env.JS.KeyValue(ctx, provision.BucketRunState)
	require.NoError(t, err)
	bucket, err := h.Env.JS.Stream(ctx, "KV_"+provision.BucketRunState)
	require.NoError(t, err)
	// writes counts the messages stored on the bucket (every write of a
	// state is one, and only this test's runs write) while fn runs.
	writes := func(fn func()) int {
		seq := func() uint64 {
			info, err := bucket.Info(ctx)
			require.NoError(t, err)
			return info.State.LastSeq
		}
		before := seq()
		fn()
		return int(seq() - before)
	}
	echo := func(text string) map[string]any {
		return map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": text})}}
	}
	answer := map[string]any{"content": "done"}
	// run submits a run of the turns and the answer, and waits for its end.
	run := func(id string, calls func(), turns ...map[string]any) *events.RunStatus {
		h.Submit(ctx, orchestratortest.Scripted(t, id, []string{"echo@1.0.0"}, envelope.Policy{}, append(turns, answer)...))
		calls()
		final, err := h.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
		return final
	}
	// complete answers call seq once its replica has gone on from the
	// turn: the test's envelopes come quicker than a tool's, which comes
	// after its replica has kept (or written) the turn's state.
	complete := func(id, text string, seq int) string {
		c := g.Request(id, "echo", map[string]any{"text": text}, seq)
		time.Sleep(100 * time.Millisecond)
		g.Complete(c, json.RawMessage(`{"text":"`+text+`"}`))
		return c.CallID
	}
	stateOf := func(id string) *orchestrator.RunState {
		e, err := kv.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		require.NoError(t, err)
		var st orchestrator.RunState
		require.NoError(t, json.Unmarshal(e.Value(), &st))
		return &st
	}

	n := writes(func() { run("early-one", func() { complete("early-one", "a", 1) }, echo("a")) })
	require.Zero(t, n, "a one-call run that ends before its request is settled writes no state")
	require.Nil(t, stateOf("early-one"))

	// ended waits for the run's state to record its end: the end is
	// published before the state's write (loop.go, publishEnd), so a
	// waiter on the end may see it first.
	ended := func(id string) {
		w, err := kv.Watch(ctx, id)
		require.NoError(t, err)
		defer func() { require.NoError(t, w.Stop()) }()
		for e := range w.Updates() {
			if e == nil {
				continue // the key's history has been delivered
			}
			var st orchestrator.RunState
			require.NoError(t, json.Unmarshal(e.Value(), &st))
			if st.Done() {
				return
			}
		}
		require.NoError(t, ctx.Err(), "the state of %s never recorded its end", id)
	}
	var call string
	n = writes(func() {
		run("early-two", func() {
			complete("early-two", "a", 1)
			call = complete("early-two", "b", 2)
		}, echo("a"), echo("b"))
		ended("early-two")
	})
	require.Equal(t, 3, n, "created by the first envelope's write before the second turn; that turn; the end")
	last := stateOf("early-two")
	require.Equal(t, orchestrator.PhaseComplete, last.Phase)
	require.Equal(t, 3, last.Iteration)
	require.Equal(t, "call/"+call, last.Trigger, "the envelope, which drove the last model call, is in the end's write")
}

// A state the replica wrote (here flushed as its request is settled, after
// TimerAfter) and another replica changed since (the call's approval, written
// straight into KV) is a stale snapshot: the end's write catches it, applies
// the envelope to the state as it is, and the run's resumption is published.
func TestLastEnvelopeOnAStaleSnapshot(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	h.Start("o1", orchestrator.Config{TimerAfter: 20 * time.Millisecond})
	kv, err := h.Env.JS.KeyValue(ctx, provision.BucketRunState)
	require.NoError(t, err)
	req := orchestratortest.Scripted(t, "early-stale", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "a"})}},
		map[string]any{"content": "done"})
	h.Submit(ctx, req)
	c := g.Request("early-stale", "echo", map[string]any{"text": "a"}, 1)
	// The request settled: the state is written (and its writer knows it).
	var e jetstream.KeyValueEntry
	require.Eventually(t, func() bool {
		e, err = kv.Get(ctx, "early-stale")
		if err != nil {
			return false
		}
		cons, err := h.Env.JS.Consumer(ctx, events.StreamRuns, orchestrator.DurableRuns)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0
	}, 10*time.Second, time.Millisecond)
	var st orchestrator.RunState
	require.NoError(t, json.Unmarshal(e.Value(), &st))
	require.Equal(t, orchestrator.PhaseAwaitingTools, st.Phase)
	st.Pending[0].Approval = orchestrator.ApprovalWaiting
	b, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Update(ctx, "early-stale", b, e.Revision())
	require.NoError(t, err)
	g.Complete(c, json.RawMessage(`{"text":"a"}`))
	final, err := h.Wait(ctx, "early-stale")
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	resumed := h.Next(ctx, events.StreamRuns, "toolwire.run.early-stale.resumed")
	require.Contains(t, string(resumed.Data), "call "+c.CallID+" (echo@1.0.0) completed")
	require.Eventually(t, func() bool {
		e, err := kv.Get(ctx, "early-stale")
		var st orchestrator.RunState
		return err == nil && json.Unmarshal(e.Value(), &st) == nil && st.Phase == orchestrator.PhaseComplete
	}, 10*time.Second, 10*time.Millisecond, "the end written on the state as it was")
}

// TestRunRequestWithAnotherID: a new run's request whose event id is not its
// run's request id (another run's, or any a producer chose) is refused: the
// run fails, saying why, and no model call is made.
func TestRunRequestWithAnotherID(t *testing.T) {
	h := newHarness(t)
	called := false
	h.Start("o1", orchestrator.Config{
		Providers: orchestrator.Providers{scripted.Name: provider.Func(func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
			called = true
			return scripted.Provider{}.Complete(ctx, r)
		})},
	})
	ctx := t.Context()
	for _, id := range []string{"victim-run/requested", "chosen-by-producer", "foreign-id/turn/1/completed"} {
		req := orchestratortest.Scripted(t, "foreign-"+fmt.Sprint(len(id)), nil, envelope.Policy{}, map[string]any{"content": "hi"})
		out, err := events.NewRunRequested("/toolwire/test", req, events.RunTrace{})
		require.NoError(t, err)
		out.Event.SetID(id)
		m, err := out.Msg()
		require.NoError(t, err)
		_, err = h.Env.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		final, err := h.Wait(ctx, req.RunID)
		require.NoError(t, err)
		require.Equal(t, events.StatusFailed, final.Status, id)
		require.Contains(t, final.Reason, "is not the run's request id", id)
	}
	require.False(t, called, "no model call for a refused request")
}

// TestUndecodableRunRequestsAreAnswered: a run request (direct or on a
// tenant's intake) that names a run id but is not an event (not JSON, nested
// past the decoder's depth) ends its run with a failed event saying why,
// instead of only a dead letter; one under the id of a run that has ended
// leaves that run as it was.
func TestUndecodableRunRequestsAreAnswered(t *testing.T) {
	h := newHarness(t)
	h.Start("o1", orchestrator.Config{})
	ctx := t.Context()
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	cases := []struct{ subject, runID, body string }{
		{"toolwire.run.bad-json.requested", "bad-json", "this is not json"},
		{"toolwire.run.bad-deep.requested", "bad-deep", deep},
		{"toolwire.intake.acme._.bad-intake", "bad-intake", "{"},
	}
	for _, c := range cases {
		_, err := h.Env.JS.Publish(ctx, c.subject, []byte(c.body))
		require.NoError(t, err)
		final, err := h.Wait(ctx, c.runID)
		require.NoError(t, err, c.subject)
		require.Equal(t, events.StatusFailed, final.Status, c.subject)
		require.Contains(t, final.Reason, "cannot be decoded", c.subject)
		if strings.Contains(c.subject, "intake") {
			require.Equal(t, "acme", final.Tenant.OrgID, "the failed event names the intake's tenant")
		}
	}

	// A run that ended: a later undecodable request under its id adds nothing.
	done := orchestratortest.Scripted(t, "ended-then-garbage", nil, envelope.Policy{}, map[string]any{"content": "hi"})
	h.Submit(ctx, done)
	final, err := h.Wait(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status)
	_, err = h.Env.JS.Publish(ctx, "toolwire.run.ended-then-garbage.requested", []byte("garbage"))
	require.NoError(t, err)
	dlq, err := h.Env.JS.Stream(ctx, events.StreamDLQ)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		m, err := dlq.GetLastMsgForSubject(ctx, events.SubjectsDLQ)
		return err == nil && m.Header.Get(consume.HeaderDLQSubject) == "toolwire.run.ended-then-garbage.requested"
	}, 10*time.Second, 10*time.Millisecond, "the garbage is dead-lettered")
	runs, err := h.Env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	info, err := runs.Info(ctx, jetstream.WithSubjectFilter("toolwire.run.ended-then-garbage.>"))
	require.NoError(t, err)
	require.Zero(t, info.State.Subjects["toolwire.run.ended-then-garbage.failed"], "no second end of an ended run")
	require.EqualValues(t, 1, info.State.Subjects["toolwire.run.ended-then-garbage.completed"])
}

// A run ends once. Its state, lost after its end was published (the write
// that records the end died with a node), lags behind the stream; a
// completion of its call delivered again after its deadline then drives it
// from that state, which would fail it TIMEOUT. The end stored first is the
// run's: no second end is stored, no event follows the end, and the state
// comes back to say completed.
func TestARunEndsOnce(t *testing.T) {
	h, ctx, g := newGuarded(t)
	r1 := h.Start("o1", orchestrator.Config{TimerAfter: 10 * time.Millisecond})
	kv, err := h.Env.JS.KeyValue(ctx, provision.BucketRunState)
	require.NoError(t, err)
	req := orchestratortest.Scripted(t, "ends-once", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "a"})}},
		map[string]any{"content": "done"},
	)
	req.DeadlineS = 1
	h.Submit(ctx, req)
	call := g.Request(req.RunID, "echo", map[string]any{"text": "a"}, 1)
	time.Sleep(100 * time.Millisecond) // the state is written (TimerAfter) before the envelope
	g.Complete(call, json.RawMessage(`{"text":"a"}`))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)

	stateOf := func() orchestrator.RunState {
		e, err := kv.Get(ctx, req.RunID)
		require.NoError(t, err)
		var st orchestrator.RunState
		require.NoError(t, json.Unmarshal(e.Value(), &st))
		return st
	}
	require.Eventually(t, func() bool { return stateOf().Phase == orchestrator.PhaseComplete }, 10*time.Second, 10*time.Millisecond)
	// The state as it was before the end: turn 1 recorded, its call pending.
	stale := stateOf()
	stale.Phase, stale.Iteration, stale.Trigger = orchestrator.PhaseAwaitingTools, 1, "request"
	stale.Pending = []orchestrator.PendingCall{{CallID: call.CallID, Seq: call.Seq, Name: call.Name, Version: call.Version}}
	b, err := json.Marshal(stale)
	require.NoError(t, err)
	_, err = kv.Put(ctx, req.RunID, b)
	require.NoError(t, err)
	// The replica that ended it is gone; another takes the run up.
	r1.Kill()
	h.Start("o2", orchestrator.Config{TimerAfter: 10 * time.Millisecond})
	time.Sleep(time.Until(stale.Deadline.Add(100 * time.Millisecond)))

	// The completion again, past the deadline (stored anew: the stream's
	// duplicate window would drop the same message id).
	now := time.Now().UTC()
	out, err := events.NewCallCompleted("/toolwire/executor", call.RunID, envelope.ToolEnvelope{
		CallID: call.CallID, Name: call.Name, Version: call.Version, Input: call.Input, Output: json.RawMessage(`{"text":"a"}`),
		TStart: now, TEnd: now,
	}, call.Tenant, events.RunTrace{})
	require.NoError(t, err)
	out.MsgID = "delivered-again"
	require.NoError(t, h.Pub.Publish(ctx, out))

	require.Eventually(t, func() bool {
		st := stateOf()
		return st.Phase == orchestrator.PhaseComplete
	}, 15*time.Second, 20*time.Millisecond, "the state follows the run's one end: %+v\n%v", stateOf(), orchestratortest.CountBySubject(h.StreamEvents(ctx)[req.RunID]))
	time.Sleep(2500 * time.Millisecond) // the deadline's timer fires, and finds the run ended
	completed, failed := endsOf(t, h, ctx, req.RunID)
	require.Len(t, completed, 1)
	require.Empty(t, failed, "a run that completed is never failed after")
	broken, err := eventstest.AfterEnd(ctx, h.Env.JS)
	require.NoError(t, err)
	callDone, err := events.CallSubject(call.RunID, call.CallID, events.VerbCompleted)
	require.NoError(t, err)
	require.Equal(t, []eventstest.Ended{{RunID: req.RunID, Ends: []string{"toolwire.run." + req.RunID + ".completed"},
		After: []string{callDone}}}, broken, "only the test's own completion follows the end")
	require.Equal(t, orchestrator.PhaseComplete, stateOf().Phase)
}

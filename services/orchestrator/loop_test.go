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

// A request submitted again under a run id that has begun (a new event on
// the run's requested subject, not a retried publish of the first, so past
// the stream's duplicate check, and not on the condition that the run have
// no request) makes no second run and no model call: the run stays as it
// was, whatever the new request says. (The first requests are submitted on
// that condition, so their runs' states are not read.)
func TestRequestSubmittedAgainMakesNoSecondRun(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
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
	cons, err := h.Env.JS.Consumer(ctx, events.StreamRuns, orchestrator.DurableRuns)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= info.Delivered.Stream &&
			info.AckFloor.Stream > 0
	}, 30*time.Second, 10*time.Millisecond, "both requests handled")

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

// The envelope of a turn's last call drives the next model call before the
// run's state records it; when the model then answers, the run's end is
// published and the state records the envelope with it in one write. A
// one-call run writes its state twice (created with its first turn, then
// ended); a turn of calls is still preceded by the write of the envelope
// that led to it, so that its own envelopes find the run calling the model.
// A snapshot gone stale (the state changed by another replica; here the
// call's approval, written straight into KV) is caught by the end's write:
// the envelope is applied to the state as it is, and the run's resumption is
// published.
func TestLastEnvelopeEndsTheRunInOneStateWrite(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	h.Start("o1", orchestrator.Config{})
	kv, err := h.Env.JS.KeyValue(ctx, events.BucketRunState)
	require.NoError(t, err)
	// watch collects every state written to the run's key.
	watch := func(run string) func() []orchestrator.RunState {
		w, err := kv.Watch(ctx, run, jetstream.UpdatesOnly())
		require.NoError(t, err)
		var got []orchestrator.RunState
		return func() []orchestrator.RunState {
			defer func() { require.NoError(t, w.Stop()) }()
			for {
				select {
				case e := <-w.Updates():
					var st orchestrator.RunState
					require.NoError(t, json.Unmarshal(e.Value(), &st))
					if got = append(got, st); st.Done() {
						return got
					}
				case <-ctx.Done():
					t.Fatalf("run %s: its state never ended; written %d times", run, len(got))
				}
			}
		}
	}
	echo := func(text string) map[string]any {
		return map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": text})}}
	}
	answer := map[string]any{"content": "done"}
	run := func(id string, turns ...map[string]any) func() []orchestrator.RunState {
		req := orchestratortest.Scripted(t, id, []string{"echo@1.0.0"}, envelope.Policy{}, append(turns, answer)...)
		written := watch(id)
		h.Submit(ctx, req)
		return written
	}
	// recorded waits until the run's state has turn n: the test's envelopes
	// come quicker than a tool's, before the turn's record otherwise.
	recorded := func(id string, n int) jetstream.KeyValueEntry {
		var e jetstream.KeyValueEntry
		require.Eventually(t, func() bool {
			var st orchestrator.RunState
			e, err = kv.Get(ctx, id)
			return err == nil && json.Unmarshal(e.Value(), &st) == nil && st.Iteration == n && st.Phase == orchestrator.PhaseAwaitingTools
		}, 10*time.Second, time.Millisecond)
		return e
	}
	complete := func(id, text string, seq int) string {
		c := g.Request(id, "echo", map[string]any{"text": text}, seq)
		recorded(id, seq)
		g.Complete(c, json.RawMessage(`{"text":"`+text+`"}`))
		return c.CallID
	}

	written := run("early-one", echo("a"))
	call := complete("early-one", "a", 1)
	states := written()
	require.Len(t, states, 2, "created with its first turn, then ended with the envelope")
	require.Equal(t, orchestrator.PhaseComplete, states[1].Phase)
	require.Equal(t, 2, states[1].Iteration)
	require.Equal(t, "call/"+call, states[1].Trigger, "the envelope, which drove the last model call, is in the end's write")

	written = run("early-two", echo("a"), echo("b"))
	complete("early-two", "a", 1)
	complete("early-two", "b", 2)
	states = written()
	require.Len(t, states, 4, "created; the first envelope before the second turn; that turn; the end")
	require.Equal(t, orchestrator.PhaseCalling, states[1].Phase, "the second turn's envelopes find the run calling the model")
	require.Equal(t, 2, states[2].Iteration)
	require.Equal(t, orchestrator.PhaseComplete, states[3].Phase)

	written = run("early-stale", echo("a"))
	c := g.Request("early-stale", "echo", map[string]any{"text": "a"}, 1)
	e := recorded("early-stale", 1)
	var st orchestrator.RunState
	require.NoError(t, json.Unmarshal(e.Value(), &st))
	st.Pending[0].Approval = orchestrator.ApprovalWaiting
	b, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Update(ctx, "early-stale", b, e.Revision())
	require.NoError(t, err)
	g.Complete(c, json.RawMessage(`{"text":"a"}`))
	states = written()
	require.Equal(t, orchestrator.PhaseComplete, states[len(states)-1].Phase)
	resumed := h.Next(ctx, events.StreamRuns, "toolwire.run.early-stale.resumed")
	require.Contains(t, string(resumed.Data), "call "+c.CallID+" (echo@1.0.0) completed")
}

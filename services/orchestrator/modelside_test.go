package orchestrator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

const citySchema = `{"type":"object","required":["city","temp_c"],"properties":{"city":{"type":"string"},"temp_c":{"type":"number"}},"additionalProperties":false}`

// TestOutputSchema: a final answer the agent's output schema refuses goes
// back to the model with the problems (a rejected turn, then the next model
// call); the answer it accepts completes the run with its value in
// AgentOutputs.Output; one wrong three times fails the run with the errors.
func TestOutputSchema(t *testing.T) {
	h, ctx, _ := newGuarded(t)
	h.Start("o1", orchestrator.Config{})

	req := orchestratortest.Scripted(t, "schema-ok", nil, envelope.Policy{},
		map[string]any{"content": `{"city": 3}`},
		map[string]any{"content": ` {"city": "Lyon", "temp_c": 21.5} `},
	)
	req.Agent.OutputSchema = json.RawMessage(citySchema)
	req.Agent.PinnedHandles = []envelope.PinnedHandle{{Name: "answer", Selector: envelope.PinSelector{Tool: envelope.OutputToolName}}}
	h.Submit(ctx, req)
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.JSONEq(t, `{"city":"Lyon","temp_c":21.5}`, string(final.Outputs.Output))
	require.NotNil(t, final.Pinned["answer"], "the answer is pinned like a tool output")
	require.JSONEq(t, `{"city":"Lyon","temp_c":21.5}`, string(final.Pinned["answer"].Output))
	require.Equal(t, ` {"city": "Lyon", "temp_c": 21.5} `, final.Outputs.Response)
	turns := orchestratortest.Turns(t, orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeTurnCompleted))
	require.Len(t, turns, 1, "the rejected answer is a turn; the accepted one rides on the end")
	require.NotNil(t, turns[0].Rejected)
	require.Equal(t, 1, turns[0].Rejected.Attempt)
	require.Contains(t, strings.Join(turns[0].Rejected.Problems, " "), "city")
	require.Equal(t, 2, final.Turn.Iteration)

	req = orchestratortest.Scripted(t, "schema-wrong", nil, envelope.Policy{},
		map[string]any{"content": "Lyon, 21 degrees"},
		map[string]any{"content": `{"city":"Lyon"}`},
		map[string]any{"content": `{"city":"Lyon","temp_c":"warm"}`},
		map[string]any{"content": `{"city":"Lyon","temp_c":21}`},
	)
	req.Agent.OutputSchema = json.RawMessage(citySchema)
	h.Submit(ctx, req)
	final, err = h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusFailed, final.Status)
	require.Equal(t, envelope.CodeValidation, final.Code)
	require.Contains(t, final.Reason, "failed agent.output_schema 3 times")
	require.Contains(t, final.Reason, "temp_c")
}

// TestStopAtTools: the first successful call of a stop_at_tools tool ends
// the run with its output as the answer: no further model call.
func TestStopAtTools(t *testing.T) {
	h, ctx, g := newGuarded(t)
	h.Start("o1", orchestrator.Config{})
	req := orchestratortest.Scripted(t, "stop-1", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "the answer"})}},
		map[string]any{"content": "never asked"},
	)
	req.Agent.StopAtTools = []string{"echo"}
	h.Submit(ctx, req)
	c := g.Request(req.RunID, "echo", map[string]any{"text": "the answer"}, 1)
	g.Approve(c)
	g.Complete(c, json.RawMessage(`{"text":"the answer"}`))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.JSONEq(t, `{"text":"the answer"}`, final.Outputs.Response)
	require.JSONEq(t, `{"text":"the answer"}`, string(final.Outputs.Output))
	require.Len(t, final.Outputs.ToolOrder, 1)
	turns := orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeTurnCompleted)
	require.Len(t, turns, 1, "one model call")
}

// TestStreamedTurnIsTheSumOfItsDeltas: an agent that streams publishes its
// answers' pieces under the run on core NATS, numbered without a gap; what
// they add up to is the turn event's response.
func TestStreamedTurnIsTheSumOfItsDeltas(t *testing.T) {
	h, ctx, g := newGuarded(t)
	h.Start("o1", orchestrator.Config{})
	var mu sync.Mutex
	var got []events.Delta
	sub, err := h.Env.JS.Conn().Subscribe("toolwire.delta.stream-1.*", func(m *nats.Msg) {
		d, err := events.DecodeDelta(m.Subject, m.Data)
		require.NoError(t, err)
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, h.Env.JS.Conn().Flush())

	req := orchestratortest.Scripted(t, "stream-1", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"content": "Let me echo that for you, in a few pieces.", "tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "hello, streamed world"})}},
		map[string]any{"content": "It said: hello, streamed world. That is all there is to it."},
	)
	req.Agent.Stream = true
	h.Submit(ctx, req)
	c := g.Request(req.RunID, "echo", map[string]any{"text": "hello, streamed world"}, 1)
	g.Approve(c)
	g.Complete(c, json.RawMessage(`{"text":"hello, streamed world"}`))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	turns := orchestratortest.Turns(t, orchestratortest.OfType(h.StreamEvents(ctx)[req.RunID], events.TypeTurnCompleted))
	require.Len(t, turns, 1)
	want := map[int]*events.Turn{1: &turns[0], 2: final.Turn}

	require.NoError(t, h.Env.JS.Conn().Flush())
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		text := map[int]string{}
		for _, d := range got {
			text[d.Iteration] += d.Text
		}
		return text[2] == want[2].Response.Content
	}, 10*time.Second, 10*time.Millisecond, "the last delta arrives")
	mu.Lock()
	defer mu.Unlock()
	seq := map[int]int{}
	text := map[int]string{}
	args := map[int]string{}
	names := map[int]string{}
	for _, d := range got {
		seq[d.Iteration]++
		require.Equal(t, seq[d.Iteration], d.Seq, "numbered without a gap")
		require.Equal(t, 1, d.Attempt)
		text[d.Iteration] += d.Text
		if d.ToolCall != nil {
			args[d.Iteration] += d.ToolCall.Arguments
			names[d.Iteration] += d.ToolCall.Name
		}
	}
	for it, turn := range want {
		require.Equal(t, turn.Response.Content, text[it], "iteration %d", it)
	}
	require.Equal(t, "echo", names[1])
	require.JSONEq(t, string(want[1].Response.ToolCalls[0].Arguments), args[1])
}

// TestToolControlsReachTheModel: the agent's tool choice applies to the
// first model call (auto after it), parallel tool calls to every call.
func TestToolControlsReachTheModel(t *testing.T) {
	h, ctx, g := newGuarded(t)
	var mu sync.Mutex
	var seen []string
	h.Start("o1", orchestrator.Config{Providers: orchestrator.Providers{"scripted": recordingProvider(&mu, &seen)}})
	no := false
	req := orchestratortest.Scripted(t, "controls-1", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "a"}), orchestratortest.ToolCall("echo", map[string]any{"text": "b"})}},
		map[string]any{"content": "done"},
	)
	req.Agent.ToolChoice, req.Agent.ParallelToolCalls = "echo", &no
	h.Submit(ctx, req)
	c := g.Request(req.RunID, "echo", map[string]any{"text": "a"}, 1)
	g.Approve(c)
	g.Complete(c, json.RawMessage(`{"text":"a"}`))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Len(t, final.Outputs.ToolOrder, 1, "one call at a time: the script's second is not made")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"1 echo false", "2 auto false"}, seen)
}

// recordingProvider is the scripted model, noting each call's iteration,
// tool choice and parallel setting.
func recordingProvider(mu *sync.Mutex, seen *[]string) provider.Provider {
	return provider.Func(func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
		mu.Lock()
		*seen = append(*seen, fmt.Sprintf("%d %s %v", r.Iteration, r.ToolChoice, r.ParallelToolCalls != nil && *r.ParallelToolCalls))
		mu.Unlock()
		return scripted.Provider{}.Complete(ctx, r)
	})
}

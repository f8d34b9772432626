package stack_test

// The orchestrator's tests that need the whole pipeline: the agent loop
// through the real Policy Guard and executor on an orchestratortest.Harness
// (newPipeline), with real provider adapters, budgets, suspension for an
// approval, and a crash at every fault point; and, through the whole stack,
// a long run whose state and events stay bounded. Every use of the executor's
// tool API by these tests is in this file. Besides the tools below, they call
// echo@1.0.0, calculator@1.0.0 and sleep@1.0.0 as the executor serves them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/standard"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/builtin"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/anthropic"
	"github.com/toolwire/toolwire/services/orchestrator/provider/openai"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
	scriptedmodel "github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
	"github.com/toolwire/toolwire/services/policy"
	"github.com/toolwire/toolwire/stack"
)

// The whole loop with each real adapter against a server that speaks its wire
// format: the registry's definitions of the enabled tools go out, three
// parallel tool calls come back and run through policy and executor, and the
// results (a success, a VALIDATION_ERROR, an UNKNOWN whose internals stay in
// the logs) go back in the provider's shape; the run completes with its
// spend and usage events.
func TestRealProvidersThroughTheLoop(t *testing.T) {
	type shape struct {
		name      string
		provider  string
		model     string
		toolCalls string // first reply
		final     string // second reply
		// results extracts, from the second request, the results in order:
		// the id they answer, their text, and whether they are marked errors.
		results func(t *testing.T, body map[string]any) [][3]any
		tools   func(body map[string]any) []any
		price   orchestrator.Price
		usage   [2]envelope.Usage
	}
	shapes := []shape{
		{
			name: "openai", provider: "openai", model: "gpt-4o-mini",
			toolCalls: `{"id":"chatcmpl-1","object":"chat.completion","created":1741570283,"model":"gpt-4o-mini-2024-07-18",
			  "choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[
			    {"id":"call_a","type":"function","function":{"name":"echo","arguments":"{\"text\":\"hi\"}"}},
			    {"id":"call_b","type":"function","function":{"name":"calculator","arguments":"{\"expression\":42}"}},
			    {"id":"call_c","type":"function","function":{"name":"leaky","arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],
			  "usage":{"prompt_tokens":1000,"completion_tokens":50,"total_tokens":1050}}`,
			final: `{"id":"chatcmpl-2","object":"chat.completion","created":1741570284,"model":"gpt-4o-mini-2024-07-18",
			  "choices":[{"index":0,"message":{"role":"assistant","content":"Done."},"logprobs":null,"finish_reason":"stop"}],
			  "usage":{"prompt_tokens":2000,"completion_tokens":10,"total_tokens":2010}}`,
			results: func(t *testing.T, body map[string]any) [][3]any {
				var out [][3]any
				for _, m := range body["messages"].([]any) {
					m := m.(map[string]any)
					if m["role"] == "tool" {
						out = append(out, [3]any{m["tool_call_id"], m["content"], nil})
					}
				}
				return out
			},
			tools: func(body map[string]any) []any {
				var out []any
				for _, tl := range body["tools"].([]any) {
					out = append(out, tl.(map[string]any)["function"].(map[string]any)["parameters"])
				}
				return out
			},
			price: orchestrator.Price{InputPerMTok: 0.15, OutputPerMTok: 0.60},
			usage: [2]envelope.Usage{{InputTokens: 1000, OutputTokens: 50}, {InputTokens: 2000, OutputTokens: 10}},
		},
		{
			name: "anthropic", provider: "anthropic", model: "claude-haiku-4-5",
			toolCalls: `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[
			    {"type":"tool_use","id":"toolu_a","name":"echo","input":{"text":"hi"}},
			    {"type":"tool_use","id":"toolu_b","name":"calculator","input":{"expression":42}},
			    {"type":"tool_use","id":"toolu_c","name":"leaky","input":{}}],
			  "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":1000,"output_tokens":50}}`,
			final: `{"id":"msg_2","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"Done."}],
			  "stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2000,"output_tokens":10}}`,
			results: func(t *testing.T, body map[string]any) [][3]any {
				msgs := body["messages"].([]any)
				last := msgs[len(msgs)-1].(map[string]any)
				require.Equal(t, "user", last["role"], "every result in one user message")
				var out [][3]any
				for _, b := range last["content"].([]any) {
					b := b.(map[string]any)
					require.Equal(t, "tool_result", b["type"])
					text := b["content"].([]any)[0].(map[string]any)["text"]
					out = append(out, [3]any{b["tool_use_id"], text, b["is_error"]})
				}
				return out
			},
			tools: func(body map[string]any) []any {
				var out []any
				for _, tl := range body["tools"].([]any) {
					out = append(out, tl.(map[string]any)["input_schema"])
				}
				return out
			},
			price: orchestrator.Price{InputPerMTok: 1, OutputPerMTok: 5},
			usage: [2]envelope.Usage{{InputTokens: 1000, OutputTokens: 50}, {InputTokens: 2000, OutputTokens: 10}},
		},
	}
	h := newPipeline(t, internalsTool())
	var logs servicetest.Output
	f := map[string]*providertest.Model{}
	for _, s := range shapes {
		f[s.name] = providertest.New(t, providertest.Reply{Body: s.toolCalls}, providertest.Reply{Body: s.final})
	}
	svcCfg := orchestrator.Config{Providers: orchestrator.Providers{
		openai.Name:    openai.New(provider.Config{APIKey: "sk-test", BaseURL: f["openai"].URL}),
		anthropic.Name: anthropic.New(provider.Config{APIKey: "sk-ant-test", BaseURL: f["anthropic"].URL}),
	}}
	h.StartWithLog("o1", svcCfg, slog.New(slog.NewTextHandler(&logs, nil)))

	byName := builtinDefinitions()
	byName["leaky"] = internalsTool().Definition()

	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			req := envelope.RunRequest{
				RunID: "loop-" + s.name, Tenant: envelope.Tenant{OrgID: "acme"},
				Agent: envelope.Agent{Name: "agent", Model: envelope.Model{Provider: s.provider, Name: s.model},
					SystemPrompt: "Use tools.", EnabledTools: []string{"echo@1.0.0", "calculator@1.0.0", "leaky@1.0.0"}},
				Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "echo hi, compute 42, call leaky"}},
			}
			final := h.Run(req, time.Minute)
			require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
			require.Equal(t, "Done.", final.Outputs.Response)
			require.Len(t, final.Outputs.ToolOrder, 3)
			got := f[s.name].Requests()
			require.Len(t, got, 2)

			// Registry definitions in: each tool's input schema, as the
			// registry holds it (less its $schema), in enabled order.
			var want []any
			for _, name := range []string{"echo", "calculator", "leaky"} {
				var m map[string]any
				require.NoError(t, json.Unmarshal(byName[name].InputSchema, &m))
				delete(m, "$schema")
				want = append(want, any(m))
			}
			require.Equal(t, want, s.tools(got[0].Body))

			// Results back in the provider's shape, in call order.
			res := s.results(t, got[1].Body)
			require.Len(t, res, 3)
			envs := final.Outputs.ToolsByID
			order := final.Outputs.ToolOrder
			require.Nil(t, envs[order[0]].Error)
			require.JSONEq(t, string(envs[order[0]].Output), res[0][1].(string))
			require.Equal(t, envelope.CodeValidation, envs[order[1]].Error.Code)
			require.Contains(t, res[1][1], `"code":"VALIDATION_ERROR"`)
			require.Equal(t, envelope.CodeUnknown, envs[order[2]].Error.Code)
			require.JSONEq(t, `{"error":{"code":"UNKNOWN","message":"internal error in tool leaky"}}`, res[2][1].(string),
				"the model sees an UNKNOWN error's code and message only")
			require.NotContains(t, string(got[1].Raw), "password authentication failed")
			if s.name == "anthropic" {
				require.Equal(t, []any{false, true, true}, []any{res[0][2], res[1][2], res[2][2]}, "is_error marks the failures")
				require.Equal(t, []any{"toolu_a", "toolu_b", "toolu_c"}, []any{res[0][0], res[1][0], res[2][0]})
			} else {
				require.Equal(t, []any{"call_a", "call_b", "call_c"}, []any{res[0][0], res[1][0], res[2][0]})
			}
			require.Contains(t, logs.String(), "password authentication failed for user admin", "internals are logged")

			// Spend: two model turns at the model's price; the tools are free.
			wantSpend := s.price.Cost(s.usage[0].InputTokens, s.usage[0].OutputTokens) + s.price.Cost(s.usage[1].InputTokens, s.usage[1].OutputTokens)
			require.InDelta(t, wantSpend, final.Spend, 1e-12)

			// Billing reads model cost on the turn events and tool cost on
			// the envelopes: two priced turns, three free calls.
			evs := h.StreamEvents(t.Context())[req.RunID]
			turns := turnsOf(t, evs)
			require.Len(t, turns, 2, "one record per model turn")
			for i, tr := range turns {
				require.Equal(t, req.Tenant, tr.Tenant)
				require.Equal(t, "agent", tr.Agent)
				require.Equal(t, events.ModelRef{Provider: s.provider, Name: s.model}, tr.Model)
				require.False(t, tr.Unpriced)
				it := s.usage[i]
				require.Equal(t, it, tr.Response.Usage)
				require.InDelta(t, s.price.Cost(it.InputTokens, it.OutputTokens), tr.Cost, 1e-12)
			}
			require.Len(t, turns[0].Calls, 3)
			for _, env := range envelopesOf(t, evs) {
				require.Zero(t, env.Cost, "the tools are free")
			}
		})
	}
}

// turnsOf decodes a run's turns (its turn events and the last turn its end
// carries), in turn order.
func turnsOf(t *testing.T, evs []orchestratortest.Stored) []events.Turn {
	t.Helper()
	out := orchestratortest.Turns(t, evs)
	sort.Slice(out, func(i, j int) bool { return out[i].Iteration < out[j].Iteration })
	return out
}

// envelopesOf decodes a run's call envelopes.
func envelopesOf(t *testing.T, evs []orchestratortest.Stored) []envelope.ToolEnvelope {
	t.Helper()
	var out []envelope.ToolEnvelope
	for _, e := range orchestratortest.OfType(evs, events.TypeCallCompleted) {
		var env envelope.ToolEnvelope
		require.NoError(t, json.Unmarshal(e.Data, &env))
		out = append(out, env)
	}
	return out
}

func money(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// A run that would exceed max_budget stops before the call that would exceed
// it, with POLICY_DENIED and a clear reason: a tool call whose declared cost
// would cross the budget never runs, and a model call whose least cost would
// cross it is never made.
func TestBudgetStopsBeforeTheCallThatWouldExceedIt(t *testing.T) {
	var paidRuns atomic.Int32
	paid := loopTool("paid", 0.01, func(context.Context, json.RawMessage) (json.RawMessage, error) {
		paidRuns.Add(1)
		return json.RawMessage(`{"ok":true}`), nil
	})
	h := newPipeline(t, paid)
	h.Start("o1", orchestrator.Config{Prices: orchestrator.Prices{
		"scripted/priced": {InputPerMTok: 1000, OutputPerMTok: 2000},
	}})

	t.Run("tool call", func(t *testing.T) {
		req := orchestratortest.Scripted(t, "budget-tools", []string{"paid@1.0.0"}, envelope.Policy{MaxBudget: 0.025},
			map[string]any{"tool_calls": []any{
				orchestratortest.ToolCall("paid", map[string]any{"n": 1}),
				orchestratortest.ToolCall("paid", map[string]any{"n": 2}),
				orchestratortest.ToolCall("paid", map[string]any{"n": 3}),
			}},
			map[string]any{"content": "two of three"},
		)
		final := h.Run(req, time.Minute)
		require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
		require.EqualValues(t, 2, paidRuns.Load(), "the third call never ran")
		require.InDelta(t, 0.02, final.Spend, 1e-12)

		out := final.Outputs
		require.Len(t, out.ToolOrder, 3)
		for i, id := range out.ToolOrder[:2] {
			require.Nil(t, out.ToolsByID[id].Error, "call #%d", i+1)
		}
		third := out.ToolsByID[out.ToolOrder[2]]
		require.Equal(t, envelope.CodePolicyDenied, third.Error.Code)
		require.Equal(t, "max_budget (0.025) would be exceeded by call #3 (paid@1.0.0, cost 0.01): "+
			"the run has spent 0 and this turn's calls up to it cost 0.03", third.Error.Message)

		evs := h.StreamEvents(t.Context())[req.RunID]
		shape := orchestratortest.CountBySubject(evs)
		require.Zero(t, shape["toolwire.call."+req.RunID+"."+third.CallID+".approved.default"], "never approved")
		require.Zero(t, shape["toolwire.call."+req.RunID+"."+third.CallID+".started"], "never started")
		billed := 0.0
		for _, env := range envelopesOf(t, evs) {
			if env.CallID == third.CallID {
				require.Zero(t, env.Cost, "a refused call costs nothing")
			} else {
				require.InDelta(t, 0.01, env.Cost, 1e-12, "a call that ran costs its tool's price")
			}
			billed += env.Cost
		}
		require.InDelta(t, 0.02, billed, 1e-12)
	})

	t.Run("model call", func(t *testing.T) {
		req := orchestratortest.Scripted(t, "budget-model", []string{"paid@1.0.0"}, envelope.Policy{MaxBudget: 0.15},
			map[string]any{"tool_calls": []any{orchestratortest.ToolCall("paid", map[string]any{"n": 1})}},
			map[string]any{"content": "never said"},
		)
		req.Agent.Model.Name = "priced"
		req.Messages[0].Content = strings.Repeat("spend ", 70) // 420 characters: 105 tokens to the scripted model
		final := h.Run(req, time.Minute)
		require.Equal(t, events.StatusFailed, final.Status)
		require.Equal(t, envelope.CodePolicyDenied, final.Code)

		evs := h.StreamEvents(t.Context())[req.RunID]
		turns := turnsOf(t, evs)
		require.Len(t, turns, 2)
		require.Nil(t, turns[1].Response, "the second model call was never made")
		require.False(t, turns[1].Verdict.Allowed, "its turn records the loop rules' denial")
		require.Equal(t, "max_budget", turns[1].Verdict.Rule)
		turn1 := turns[0].Response.Usage
		require.Equal(t, 105, turn1.InputTokens)
		spent := turns[0].Cost + 0.01
		least := float64(turn1.InputTokens+turn1.OutputTokens) * 1000 / 1e6
		require.InDelta(t, spent, final.Spend, 1e-12)
		require.Equal(t, "policy denied iteration 2: max_budget (0.15) would be exceeded by model call 2: the run has spent "+
			money(spent)+" and the call costs at least "+money(least), final.Reason)
	})
}

// With the real Policy Guard's approvals: a call the policy holds for an
// operator suspends the run while the turn's other call runs; the operator's
// approval resumes it.
func TestSuspensionWithTheRealGuard(t *testing.T) {
	h := newPipeline(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h.Start("o1", orchestrator.Config{AckWait: 2 * time.Second})
	req := orchestratortest.Scripted(t, "approval-1", []string{"echo@1.0.0", "calculator@1.0.0"},
		envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"echo"}}},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("echo", map[string]any{"text": "send it"}),
			orchestratortest.ToolCall("calculator", map[string]any{"expression": "1+1"}),
		}},
		map[string]any{"content": "sent"},
	)
	h.Submit(ctx, req)
	g := orchestratortest.Guard{H: h, Ctx: ctx}
	held := g.Request(req.RunID, "echo", map[string]any{"text": "send it"}, 1)
	calc := g.Request(req.RunID, "calculator", map[string]any{"expression": "1+1"}, 2)
	h.Next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+held.CallID+".approval_required")
	sus := orchestratortest.StatusOf(t, h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".suspended"))
	require.Equal(t, "waiting for approval of call "+held.CallID+" (echo@1.0.0)", sus.Reason)
	h.Next(ctx, events.StreamCalls, "toolwire.call."+req.RunID+"."+calc.CallID+".completed") // ran meanwhile

	g.Publish(events.NewDecided("/toolwire/cli", events.Decision{RunID: req.RunID, CallID: held.CallID,
		Decision: events.DecisionApprove, By: "ops"}, req.Tenant, events.RunTrace{}))
	h.Next(ctx, events.StreamRuns, "toolwire.run."+req.RunID+".resumed")
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	for _, id := range final.Outputs.ToolOrder {
		require.Nil(t, final.Outputs.ToolsByID[id].Error)
	}
	evs := h.StreamEvents(ctx)[req.RunID]
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunSuspended), 1)
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunResumed), 1)
}

// newPipeline starts the executor (with the built-in tools, the test tools
// failing and sleep, and tools) and the Policy Guard on a harness;
// orchestrators are started by the test.
func newPipeline(t *testing.T, tools ...toolapi.Tool) *orchestratortest.Harness {
	t.Helper()
	h := orchestratortest.New(t)
	cfg := executor.Config{Concurrency: 64, ID: "executor-0"}.With(standard.WithConfig(standard.Config{}), executor.WithTools(append(testtools.Tools(), tools...)...))
	ex, err := executor.New(orchestratortest.Deps("executor", h.Env.Conn, h.Env.JS), cfg)
	require.NoError(t, err)
	require.NoError(t, ex.Start(t.Context()))
	t.Cleanup(func() { _ = ex.Stop(context.Background()) })
	pol, err := policy.New(orchestratortest.Deps("policy", h.Env.Conn, h.Env.JS), policy.Config{})
	require.NoError(t, err)
	require.NoError(t, pol.Start(t.Context()))
	t.Cleanup(func() { _ = pol.Stop(context.Background()) })
	return h
}

// builtinDefinitions are the definitions of the executor's built-in tools
// (echo@1.0.0, calculator@1.0.0, sleep@1.0.0, ...), by name.
func builtinDefinitions() map[string]envelope.ToolDefinition {
	defs := map[string]envelope.ToolDefinition{}
	for _, tl := range slices.Concat(builtin.Tools(), testtools.Tools()) {
		defs[tl.Definition().Name] = tl.Definition()
	}
	return defs
}

// loopTool is a tool for the orchestrator's tests: no side effects, no cache,
// its declared cost, and fn as its body.
func loopTool(name string, cost float64, fn func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)) *stackTool {
	t := newStackTool(name, envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone}, fn)
	t.def.Cost = cost
	return t
}

// internalsTool fails with an UNKNOWN error whose details are internals.
func internalsTool() *stackTool {
	return loopTool("leaky", 0, func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return nil, &envelope.ToolError{Code: envelope.CodeUnknown, Message: "internal error in tool leaky",
			Details: "pq: password authentication failed for user admin at db-7.internal:5432"}
	})
}

// countingModel is the scripted model, counting its calls per run,
// iteration and replica.
type countingModel struct {
	mu    sync.Mutex
	calls map[string][]modelCall // by "run/iteration"
}

type modelCall struct {
	replica string
	at      time.Time
}

// forReplica is the model as one replica calls it.
func (m *countingModel) forReplica(name string) provider.Provider {
	return provider.Func(func(ctx context.Context, req provider.Request) (envelope.ModelResponse, error) {
		k := fmt.Sprintf("%s/%d", req.RunID, req.Iteration)
		m.mu.Lock()
		m.calls[k] = append(m.calls[k], modelCall{replica: name, at: time.Now()})
		m.mu.Unlock()
		return scriptedmodel.Provider{}.Complete(ctx, req)
	})
}

func (m *countingModel) of(run string, it int) []modelCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]modelCall(nil), m.calls[fmt.Sprintf("%s/%d", run, it)]...)
}

// explainModelCalls accounts for every model call of one turn: exactly one
// answer was recorded (the call that started at the recorded turn's t_start),
// one more call for each answer a crash right after the model threw away, and
// any other call was made by a replica that died, its answer with it. It
// returns how many calls a death explains.
func explainModelCalls(t *testing.T, key string, calls []modelCall, recordedStart time.Time,
	lost []modelCall, killedAt map[string]time.Time) int {
	t.Helper()
	rec := -1
	for i, c := range calls {
		d := c.at.Round(0).Sub(recordedStart)
		if d >= 0 && d < 100*time.Millisecond && (rec < 0 || d < calls[rec].at.Round(0).Sub(recordedStart)) {
			rec = i
		}
	}
	require.GreaterOrEqual(t, rec, 0, "%s: the recorded turn is one of the model's answers", key)
	rest := append(append([]modelCall(nil), calls[:rec]...), calls[rec+1:]...)
	// Each answer lost by a crash: the latest call of that replica before it.
	for _, l := range lost {
		best := -1
		for i, c := range rest {
			if c.replica == l.replica && !c.at.After(l.at) && (best < 0 || c.at.After(rest[best].at)) {
				best = i
			}
		}
		require.GreaterOrEqual(t, best, 0, "%s: a crash after the model's answer follows a model call", key)
		rest = append(rest[:best], rest[best+1:]...)
	}
	// The rest died with their replica: it was killed while it waited for
	// the answer (or, as the test kills a replica by closing its connection,
	// its last handlers still called the model after the close, and could
	// record nothing).
	for _, c := range rest {
		_, died := killedAt[c.replica]
		require.True(t, died, "%s: a model call by %s at %s is explained by no lost answer", key, c.replica, c.at)
	}
	return len(rest)
}

// A fault plan fails every (run, point, iteration) of the runs it covers
// exactly once, the first time a replica reaches it: most as a crash of the
// handler (an error or a panic: the event is redelivered at once), some as
// the death of the whole replica (its connection closes while the handler is
// stopped at the point; another replica gets the event when its ack wait
// runs out, and a new replica takes the dead one's place).
type faultPlan struct {
	mu       sync.Mutex
	covers   func(run string) bool
	killAt   map[string]orchestrator.FaultPoint // run -> point where its first hit kills the replica
	failed   map[faultKey]string                // how each key failed: "error", "panic" or "kill"
	lost     map[faultKey][]modelCall           // the after_model failures: whose answer was lost, when
	byPoint  map[orchestrator.FaultPoint]int
	replicas map[string]int             // fault points reached per replica
	touched  map[string]map[string]bool // replica -> the covered runs it reached a fault point of
	kills    chan *faultyReplica
}

type faultKey struct {
	run   string
	point orchestrator.FaultPoint
	it    int
}

var errInjected = errors.New("injected crash")

// faultyReplica is the Faults of one replica.
type faultyReplica struct {
	plan *faultPlan
	name string
	dead chan struct{}
	r    *orchestratortest.Replica
}

func (f *faultyReplica) Fault(ctx context.Context, p orchestrator.FaultPoint, run string, it int) error {
	pl := f.plan
	pl.mu.Lock()
	pl.replicas[f.name]++
	k := faultKey{run, p, it}
	if pl.covers(run) {
		if pl.touched[f.name] == nil {
			pl.touched[f.name] = map[string]bool{}
		}
		pl.touched[f.name][run] = true
	}
	if !pl.covers(run) || pl.failed[k] != "" {
		pl.mu.Unlock()
		return nil
	}
	how := "error"
	switch {
	case pl.killAt[run] == p:
		how = "kill"
		delete(pl.killAt, run)
	case (len(pl.failed))%2 == 1:
		how = "panic"
	}
	pl.failed[k] = how
	pl.byPoint[p]++
	if p == orchestrator.FaultAfterModel {
		pl.lost[k] = append(pl.lost[k], modelCall{replica: f.name, at: time.Now()})
	}
	pl.mu.Unlock()
	switch how {
	case "kill":
		pl.kills <- f
		select {
		case <-f.dead:
		case <-ctx.Done():
		}
		return fmt.Errorf("%w: replica %s killed at %s", errInjected, f.name, p)
	case "panic":
		panic(fmt.Sprintf("injected crash at %s of run %s iteration %d", p, run, it))
	}
	return fmt.Errorf("%w at %s of run %s iteration %d", errInjected, p, run, it)
}

func (pl *faultPlan) lostAnswers(run string, it int) []modelCall {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.lost[faultKey{run, orchestrator.FaultAfterModel, it}]
}

var runToken = regexp.MustCompile(`^toolwire\.(run|call)\.[^.]+\.`)

// shape is a run's events as a multiset of subjects with the run id blanked:
// the call ids (in call subjects), the iterations, the turns, the usage
// numbers and the lifecycle, each with how often it was stored. A call's
// started event is left out: the executor publishes it only for a call
// still running after its threshold, which a loaded machine decides (the
// 100 ms sleep passed it in one run of a test beside others); the
// comparison of shapes checks that the rest is stored once, as undisturbed,
// and shape itself that no call started twice.
func shape(t *testing.T, evs []orchestratortest.Stored) map[string]int {
	t.Helper()
	out, started := map[string]int{}, map[string]int{}
	for _, e := range evs {
		subj := runToken.ReplaceAllString(e.Subject, "toolwire.$1.RUN.")
		if strings.HasPrefix(subj, "toolwire.call.") && strings.HasSuffix(subj, ".started") {
			started[subj]++
			require.Equal(t, 1, started[subj], "%s stored once", e.Subject)
			continue
		}
		out[subj]++
	}
	return out
}

// TestCrashAtEveryPoint kills the orchestrator at every point of every turn
// of many concurrent runs, served by two replicas that share the work (and
// are replaced when one dies), and checks that every run ends exactly as an
// undisturbed run of the same request: the same outputs, the same call ids,
// every event stored once (no duplicate call, turn or lifecycle event), and
// the model called again only when its answer was lost.
func TestCrashAtEveryPoint(t *testing.T) {
	const runs = 25
	h := newPipeline(t)
	model := &countingModel{calls: map[string][]modelCall{}}
	plan := &faultPlan{
		covers:   func(run string) bool { return strings.HasPrefix(run, "crash-") },
		killAt:   map[string]orchestrator.FaultPoint{},
		failed:   map[faultKey]string{},
		lost:     map[faultKey][]modelCall{},
		byPoint:  map[orchestrator.FaultPoint]int{},
		replicas: map[string]int{},
		touched:  map[string]map[string]bool{},
		kills:    make(chan *faultyReplica, 64),
	}
	points := orchestrator.FaultPoints()
	for i := 0; i < runs; i += 5 {
		plan.killAt[fmt.Sprintf("crash-%02d", i)] = points[(i/5)%len(points)]
	}
	started := 0
	start := func() *faultyReplica {
		started++
		f := &faultyReplica{plan: plan, name: fmt.Sprintf("orchestrator-%d", started), dead: make(chan struct{})}
		f.r = h.Start(f.name, orchestrator.Config{
			Providers:    orchestrator.Providers{scriptedmodel.Name: model.forReplica(f.name)},
			ModelTimeout: 500 * time.Millisecond, AckWait: 2 * time.Second, Faults: f,
			// Every run publishes its started event (at once), so that the
			// shape of a run that crashes and one that does not are the same.
			StartedAfter: -1,
		})
		return f
	}
	start()
	start()

	request := func(id string) envelope.RunRequest {
		return orchestratortest.Scripted(t, id, []string{"echo@1.0.0", "calculator@1.0.0", "sleep@1.0.0"}, envelope.Policy{},
			map[string]any{"tool_calls": []any{
				orchestratortest.ToolCall("echo", map[string]any{"text": "a"}),
				orchestratortest.ToolCall("calculator", map[string]any{"expression": "6*7"}),
				orchestratortest.ToolCall("sleep", map[string]any{"ms": 100}),
			}},
			map[string]any{"tool_calls": []any{
				orchestratortest.ToolCall("echo", map[string]any{"text": "b"}),
				orchestratortest.ToolCall("calculator", map[string]any{"expression": 7}), // VALIDATION_ERROR
			}},
			map[string]any{"content": "done"},
		)
	}

	// The undisturbed run.
	ref := h.Run(request("reference"), time.Minute)
	require.Equal(t, events.StatusCompleted, ref.Status, ref.Reason)
	refOut := orchestratortest.Normalize(t, ref.Outputs)
	require.Len(t, refOut.ToolOrder, 5)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	type result struct {
		id  string
		st  *events.RunStatus
		err error
	}
	results := make(chan result, runs)
	for i := range runs {
		id := fmt.Sprintf("crash-%02d", i)
		h.Submit(ctx, request(id))
		go func() {
			st, err := h.Wait(ctx, id)
			results <- result{id, st, err}
		}()
	}
	final := map[string]*events.RunStatus{}
	killed := map[*faultyReplica]bool{}
	killedAt := map[string]time.Time{}
	for len(final) < runs {
		select {
		case f := <-plan.kills:
			if killed[f] {
				continue
			}
			killed[f] = true
			killedAt[f.name] = time.Now()
			f.r.Conn.Close() // dead: nothing it still does reaches NATS
			close(f.dead)
			f.r.Kill()
			start() // and a new replica takes its place
		case r := <-results:
			require.NoError(t, r.err, r.id)
			final[r.id] = r.st
		case <-ctx.Done():
			t.Fatalf("runs did not finish: %d of %d done", len(final), runs)
		}
	}

	all := h.StreamEvents(t.Context())
	refShape := shape(t, all["reference"])
	byDeath := 0
	for id, st := range final {
		require.Equal(t, events.StatusCompleted, st.Status, "%s: %s", id, st.Reason)
		require.Equal(t, refOut, orchestratortest.Normalize(t, st.Outputs), "%s: outputs and call ids as undisturbed", id)
		require.Equal(t, refShape, shape(t, all[id]), "%s: every event once, the same as undisturbed", id)
		// The model is called again only when its answer was lost.
		for _, e := range orchestratortest.OfType(all[id], events.TypeTurnCompleted) {
			var tr events.Turn
			require.NoError(t, json.Unmarshal(e.Data, &tr))
			it := tr.Iteration
			byDeath += explainModelCalls(t, fmt.Sprintf("%s iteration %d", id, it), model.of(id, it), tr.TStart,
				plan.lostAnswers(id, it), killedAt)
		}
	}
	for s, n := range refShape {
		require.Equal(t, 1, n, "the reference stores %s once", s)
	}
	require.Len(t, model.of("reference", 1), 1)

	plan.mu.Lock()
	defer plan.mu.Unlock()
	var kinds []string
	hows := map[string]int{}
	for _, how := range plan.failed {
		hows[how]++
	}
	for p, n := range plan.byPoint {
		kinds = append(kinds, fmt.Sprintf("%s=%d", p, n))
	}
	sort.Strings(kinds)
	t.Logf("injected %d failures (%v) at %v; %d replicas started, %d killed; fault points reached per replica: %v; "+
		"%d model calls were lost with a dying replica", len(plan.failed), hows, kinds, started, len(killed), plan.replicas, byDeath)
	// Every point of every turn fails once in every run: before_model,
	// after_model and after_publish_turn (3 turns), after_record_envelope
	// (2 turns with calls), before_publish_outputs (1). A point is passed by
	// only when a handler working on the run died just after the state
	// change before it (its write or publication stored, its
	// acknowledgement lost with the connection), and then another event's
	// handler took the run past it: so only in a run a killed replica was
	// working on. A kill stops every handler of its replica, not just the
	// one at the kill point, so one kill may explain several.
	perRun := map[orchestrator.FaultPoint]int{
		orchestrator.FaultBeforeModel: 3, orchestrator.FaultAfterModel: 3, orchestrator.FaultAfterPublishTurn: 3,
		orchestrator.FaultAfterRecordEnvelope: 2, orchestrator.FaultBeforePublishOutputs: 1,
	}
	failedAt := map[string]map[orchestrator.FaultPoint]int{}
	for k := range plan.failed {
		if failedAt[k.run] == nil {
			failedAt[k.run] = map[orchestrator.FaultPoint]int{}
		}
		failedAt[k.run][k.point]++
	}
	var passed []string
	for i := range runs {
		id := fmt.Sprintf("crash-%02d", i)
		for p, want := range perRun {
			got := failedAt[id][p]
			require.LessOrEqual(t, got, want, "%s: failures at %s", id, p)
			if got == want {
				continue
			}
			passed = append(passed, fmt.Sprintf("%s:%s x%d", id, p, want-got))
			worked := false
			for f := range killed {
				worked = worked || plan.touched[f.name][id]
			}
			require.True(t, worked, "%s: %s passed by %d time(s) with no killed replica working on the run", id, p, want-got)
		}
	}
	sort.Strings(passed)
	t.Logf("points passed by in runs a killed replica was working on: %v", passed)
	require.LessOrEqual(t, len(passed), runs, "most points of most runs fail once")
	require.Equal(t, len(points), hows["kill"], "one replica death at each point")
	require.NotEmpty(t, killed)
	served := 0
	for _, n := range plan.replicas {
		if n > 0 {
			served++
		}
	}
	require.GreaterOrEqual(t, served, 3, "the replicas share the work")
	requireNothingAfterEnds(t.Context(), t, h.Env.JS)
}

// TestLongRunWithLargeOutputsStaysBounded: a run of 50 turns whose tools
// return 10 MiB in all (several outputs of 300 KiB to 2 MiB among small
// ones) completes, and no KV value and no stored event grows with it: the
// largest of each stays under 256 KiB. The run state holds what the loop
// needs; envelopes live in their completed events; big outputs are blobs.
func TestLongRunWithLargeOutputsStaysBounded(t *testing.T) {
	const turns, limit = 50, 256 << 10
	big := []int{300 << 10, 2 << 20, 1 << 20, 2 << 20, 1536 << 10, 2 << 20, 1536 << 10}
	sizes := make([]int, turns)
	total := 0
	for i := range sizes {
		sizes[i] = 2 << 10
		if i%7 == 3 && i/7 < len(big) {
			sizes[i] = big[i/7]
		}
		total += sizes[i]
	}
	require.GreaterOrEqual(t, total, 10<<20, "10 MiB of outputs in all")

	blob := newStackTool("bulk", envelope.ToolMetadata{
		Category: envelope.CategoryData, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone,
	}, func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		var a struct {
			Bytes int `json:"bytes"`
		}
		if err := json.Unmarshal(in, &a); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"data": strings.Repeat("x", a.Bytes)})
	})
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(blob)}})

	script := make([]map[string]any, 0, turns+1)
	for i, n := range sizes {
		script = append(script, map[string]any{"tool_calls": []any{call("bulk", map[string]any{"bytes": n, "turn": i + 1})}})
	}
	script = append(script, map[string]any{"content": "read it all"})
	req := orchestratortest.Scripted(t, "bounded-50", []string{"bulk@1.0.0"},
		envelope.Policy{MaxIterations: turns + 1, MaxToolCalls: turns}, script...)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	require.NoError(t, st.Client.Submit(ctx, req))
	final, err := st.Client.Follow(ctx, req.RunID, nil)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Equal(t, "read it all", final.Outputs.Response)
	require.NotNil(t, final.OutputsBlob, "50 envelopes make the completed event too large: its outputs are a blob")
	require.Len(t, final.Outputs.ToolOrder, turns)
	whole := 0
	for i, id := range final.Outputs.ToolOrder {
		env := final.Outputs.ToolsByID[id]
		require.Nil(t, env.Error, "call %d", i+1)
		if sizes[i] > 64<<10 {
			require.True(t, env.Truncated, "call %d: a %d-byte output is a blob, its envelope a preview", i+1, sizes[i])
			require.NotEmpty(t, env.Attachments)
			whole += int(env.Attachments[0].Bytes)
		} else {
			whole += len(env.Output)
		}
	}
	require.Greater(t, whole, 10<<20, "every output kept whole, inline or in its blob")

	// Every message the run left at the server: events and KV values.
	largestEvent, largestKV := largestMessages(ctx, t, st.JS)
	t.Logf("largest stored event %d bytes (%s); largest KV value %d bytes (%s)",
		largestEvent.size, largestEvent.subject, largestKV.size, largestKV.subject)
	require.Less(t, largestEvent.size, limit, largestEvent.subject)
	require.Less(t, largestKV.size, limit, largestKV.subject)
}

type sized struct {
	size    int
	subject string
}

// largestMessages returns the largest message (data and headers) of
// toolwire's event streams and of every KV bucket, every revision included.
func largestMessages(ctx context.Context, t *testing.T, js jetstream.JetStream) (event, kv sized) {
	t.Helper()
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		isKV := strings.HasPrefix(name, "KV_")
		if !isKV && !strings.HasPrefix(name, "TOOLWIRE_") {
			continue // the object store's chunks are blobs, not values
		}
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			n := len(m.Data)
			for k, vs := range m.Header {
				for _, v := range vs {
					n += len(k) + len(v)
				}
			}
			at := &event
			if isKV {
				at = &kv
			}
			if n > at.size {
				*at = sized{n, fmt.Sprintf("%s seq %d %s", name, seq, m.Subject)}
			}
		}
	}
	require.NoError(t, names.Err())
	return event, kv
}

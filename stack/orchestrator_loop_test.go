package stack_test

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/anthropic"
	"github.com/toolwire/toolwire/services/orchestrator/provider/openai"
	"github.com/toolwire/toolwire/services/orchestrator/provider/providertest"
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
	var logs syncBuffer
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

			evs := h.StreamEvents(t.Context())[req.RunID]
			usage := orchestratortest.OfType(evs, events.TypeUsageRecorded)
			require.Len(t, usage, 5, "one per model turn and one per tool call")
			kinds := map[string]int{}
			for _, e := range usage {
				var u events.Usage
				require.NoError(t, json.Unmarshal(e.Data, &u))
				kinds[u.Kind]++
				require.Equal(t, req.Tenant, u.Tenant)
				require.Equal(t, "agent", u.Agent)
				if u.Kind == events.UsageKindModel {
					require.Equal(t, s.model, u.Model)
					require.Equal(t, s.provider, u.Provider)
					require.False(t, u.Unpriced)
					it := s.usage[u.Iteration-1]
					require.Equal(t, [2]int{it.InputTokens, it.OutputTokens}, [2]int{u.InputTokens, u.OutputTokens})
					require.InDelta(t, s.price.Cost(it.InputTokens, it.OutputTokens), u.Cost, 1e-12)
				}
			}
			require.Equal(t, map[string]int{"model": 2, "tool": 3}, kinds)
		})
	}
}

package envelope_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestPinnedHandleValidate(t *testing.T) {
	id := mustCallID(t, "web_search", "1.2.0", `{}`, 1)
	sel := func(tool string) envelope.PinSelector { return envelope.PinSelector{Tool: tool} }
	tests := []struct {
		name string
		pin  envelope.PinnedHandle
		want string // fragment; empty: valid
	}{
		{"defaults", envelope.PinnedHandle{Name: "weather_report", Selector: sel("web_search")}, ""},
		{"latest", envelope.PinnedHandle{Name: "w", Selector: envelope.PinSelector{Tool: "web_search", Strategy: envelope.PinLatest}, OnMissing: envelope.MissingNull}, ""},
		{"first success", envelope.PinnedHandle{Name: "_w", Selector: envelope.PinSelector{Tool: "web_search", Strategy: envelope.PinFirstSuccess}, OnMissing: envelope.MissingError}, ""},
		{"by call id", envelope.PinnedHandle{Name: "W-1", Selector: envelope.PinSelector{Tool: "web_search", Strategy: envelope.PinByCallID, CallID: id}, OnMissing: envelope.MissingStaleLastSuccess}, ""},
		{"longest name", envelope.PinnedHandle{Name: "a" + strings.Repeat("b", 63), Selector: sel("t")}, ""},
		{"empty name", envelope.PinnedHandle{Selector: sel("web_search")}, `name "" must start with a letter or '_'`},
		{"name starts with digit", envelope.PinnedHandle{Name: "1st", Selector: sel("web_search")}, `name "1st" must start`},
		{"name starts with dash", envelope.PinnedHandle{Name: "-x", Selector: sel("web_search")}, `name "-x" must start`},
		{"name too long", envelope.PinnedHandle{Name: "a" + strings.Repeat("b", 64), Selector: sel("t")}, "hold at most 64"},
		{"name with space", envelope.PinnedHandle{Name: "my pin", Selector: sel("t")}, `name "my pin"`},
		{"no tool", envelope.PinnedHandle{Name: "p"}, `invalid pinned handle "p": selector.tool "" is not a tool name`},
		{"bad tool", envelope.PinnedHandle{Name: "p", Selector: sel("web.search")}, `selector.tool "web.search" is not a tool name`},
		{"call id without strategy", envelope.PinnedHandle{Name: "p", Selector: envelope.PinSelector{Tool: "t", CallID: id}}, "selector.call_id is only for strategy by_call_id"},
		{"call id with latest", envelope.PinnedHandle{Name: "p", Selector: envelope.PinSelector{Tool: "t", Strategy: envelope.PinLatest, CallID: id}}, "selector.call_id is only for strategy by_call_id"},
		{"by call id without id", envelope.PinnedHandle{Name: "p", Selector: envelope.PinSelector{Tool: "t", Strategy: envelope.PinByCallID}}, "strategy by_call_id needs selector.call_id, 64 lowercase hex digits"},
		{"by call id uppercase", envelope.PinnedHandle{Name: "p", Selector: envelope.PinSelector{Tool: "t", Strategy: envelope.PinByCallID, CallID: strings.ToUpper(id)}}, "64 lowercase hex digits"},
		{"by call id short", envelope.PinnedHandle{Name: "p", Selector: envelope.PinSelector{Tool: "t", Strategy: envelope.PinByCallID, CallID: id[1:]}}, "64 lowercase hex digits"},
		{"unknown strategy", envelope.PinnedHandle{Name: "p", Selector: envelope.PinSelector{Tool: "t", Strategy: "oldest"}}, `selector.strategy "oldest" is not one of latest, first_success, by_call_id`},
		{"unknown on_missing", envelope.PinnedHandle{Name: "p", Selector: sel("t"), OnMissing: "ignore"}, `on_missing "ignore" is not one of null, error, stale_last_success`},
	}
	s := newSchemas(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.pin.Validate()
			schemaErr := s.ValidateValue(envelope.SchemaPinnedHandle, tc.pin)
			if tc.want == "" {
				require.NoError(t, err)
				require.NoError(t, schemaErr)
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidPin)
			require.ErrorContains(t, err, tc.want)
			require.ErrorIs(t, schemaErr, envelope.ErrSchemaViolation, "the schema rejects it too")
		})
	}
}

// resolveFixture is a run in which web_search fails, succeeds twice and then
// fails again, and http_request runs once.
func resolveFixture(t *testing.T) (envelope.AgentOutputs, map[string]envelope.ToolEnvelope) {
	t.Helper()
	fail1 := env(t, "web_search", "1.2.0", `{"q":"a"}`, "", 1)
	fail1.Error = envelope.NewToolError(envelope.CodeTimeout, "slow")
	ok1 := env(t, "web_search", "1.2.0", `{"q":"b"}`, `{"n":1}`, 2)
	fetch := env(t, "http_request", "1.0.0", `{"url":"https://x"}`, `"body"`, 3)
	ok2 := env(t, "web_search", "1.2.0", `{"q":"c"}`, `{"n":2}`, 4)
	fail2 := env(t, "web_search", "1.2.0", `{"q":"d"}`, "", 5)
	fail2.Error = envelope.NewToolError(envelope.CodeRateLimit, "quota")
	out := envelope.NewAgentOutputs("done", []envelope.ToolEnvelope{fail1, ok1, fetch, ok2, fail2}, "")
	return out, map[string]envelope.ToolEnvelope{"fail1": fail1, "ok1": ok1, "fetch": fetch, "ok2": ok2, "fail2": fail2}
}

func TestPinSelect(t *testing.T) {
	out, e := resolveFixture(t)
	pin := func(tool string, s envelope.PinStrategy, id string) envelope.PinnedHandle {
		return envelope.PinnedHandle{Name: "h", Selector: envelope.PinSelector{Tool: tool, Strategy: s, CallID: id}}
	}
	tests := []struct {
		name string
		pin  envelope.PinnedHandle
		want string // key of e; empty: nil
	}{
		{"default is latest, even a failure", pin("web_search", "", ""), "fail2"},
		{"latest", pin("web_search", envelope.PinLatest, ""), "fail2"},
		{"first success skips failures", pin("web_search", envelope.PinFirstSuccess, ""), "ok1"},
		{"by call id", pin("web_search", envelope.PinByCallID, e["ok2"].CallID), "ok2"},
		{"by call id of a failure", pin("web_search", envelope.PinByCallID, e["fail1"].CallID), "fail1"},
		{"by call id of another tool", pin("web_search", envelope.PinByCallID, e["fetch"].CallID), ""},
		{"by unknown call id", pin("web_search", envelope.PinByCallID, strings.Repeat("0", 64)), ""},
		{"other tool latest", pin("http_request", envelope.PinLatest, ""), "fetch"},
		{"tool never called", pin("calculator", envelope.PinLatest, ""), ""},
		{"tool never called first success", pin("calculator", envelope.PinFirstSuccess, ""), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.pin.Select(out)
			if tc.want == "" {
				require.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			want := e[tc.want]
			require.Equal(t, &want, got)
		})
	}

	t.Run("first success when all failed", func(t *testing.T) {
		only := envelope.NewAgentOutputs("", []envelope.ToolEnvelope{e["fail1"], e["fail2"]}, "")
		require.Nil(t, pin("web_search", envelope.PinFirstSuccess, "").Select(only))
	})
	t.Run("selection is a copy", func(t *testing.T) {
		got := pin("web_search", envelope.PinLatest, "").Select(out)
		got.Name = "changed"
		require.Equal(t, "web_search", out.ToolsByID[e["fail2"].CallID].Name)
	})
	t.Run("ids in tool_order missing from tools_by_id are skipped", func(t *testing.T) {
		broken := out
		broken.ToolOrder = append([]string{strings.Repeat("f", 64)}, out.ToolOrder...)
		require.Equal(t, e["ok1"].CallID, pin("web_search", envelope.PinFirstSuccess, "").Select(broken).CallID)
	})
}

func TestResolvePins(t *testing.T) {
	out, e := resolveFixture(t)
	h := func(name, tool string, s envelope.PinStrategy, id string, m envelope.OnMissing) envelope.PinnedHandle {
		return envelope.PinnedHandle{Name: name, Selector: envelope.PinSelector{Tool: tool, Strategy: s, CallID: id}, OnMissing: m}
	}

	tests := []struct {
		name string
		out  envelope.AgentOutputs
		pins []envelope.PinnedHandle
		want map[string]string // handle -> key of e, "" for nil
		err  string            // fragment of an ErrPinMissing error
	}{
		{
			name: "every strategy",
			out:  out,
			pins: []envelope.PinnedHandle{
				h("latest", "web_search", envelope.PinLatest, "", ""),
				h("first", "web_search", envelope.PinFirstSuccess, "", envelope.MissingError),
				h("exact", "http_request", envelope.PinByCallID, e["fetch"].CallID, envelope.MissingNull),
			},
			want: map[string]string{"latest": "fail2", "first": "ok1", "exact": "fetch"},
		},
		{
			name: "disabled tool stays as null",
			out:  out,
			pins: []envelope.PinnedHandle{
				h("weather", "web_search", "", "", ""),
				h("old_default", "disabled_tool", "", "", ""),
				h("old_null", "disabled_tool", envelope.PinLatest, "", envelope.MissingNull),
				h("old_stale", "disabled_tool", envelope.PinFirstSuccess, "", envelope.MissingStaleLastSuccess),
			},
			want: map[string]string{"weather": "fail2", "old_default": "", "old_null": "", "old_stale": ""},
		},
		{
			name: "no calls at all",
			out:  envelope.NewAgentOutputs("", nil, ""),
			pins: []envelope.PinnedHandle{h("a", "web_search", "", "", ""), h("b", "http_request", envelope.PinByCallID, e["fetch"].CallID, envelope.MissingNull)},
			want: map[string]string{"a": "", "b": ""},
		},
		{
			name: "no pins",
			out:  out,
			pins: nil,
			want: map[string]string{},
		},
		{
			name: "on_missing error",
			out:  out,
			pins: []envelope.PinnedHandle{h("must", "calculator", "", "", envelope.MissingError)},
			err:  `handle "must" (tool calculator, strategy latest)`,
		},
		{
			name: "on_missing error for first_success with only failures",
			out:  envelope.NewAgentOutputs("", []envelope.ToolEnvelope{e["fail1"]}, ""),
			pins: []envelope.PinnedHandle{h("ok_one", "web_search", "", "", ""), h("good", "web_search", envelope.PinFirstSuccess, "", envelope.MissingError)},
			err:  `handle "good" (tool web_search, strategy first_success)`,
		},
		{
			name: "on_missing error for a by_call_id of another run",
			out:  out,
			pins: []envelope.PinnedHandle{h("exact", "web_search", envelope.PinByCallID, strings.Repeat("a", 64), envelope.MissingError)},
			err:  `handle "exact" (tool web_search, strategy by_call_id)`,
		},
		{
			name: "on_missing error satisfied",
			out:  out,
			pins: []envelope.PinnedHandle{h("must", "http_request", "", "", envelope.MissingError)},
			want: map[string]string{"must": "fetch"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envelope.ResolvePins(tc.out, tc.pins)
			if tc.err != "" {
				require.ErrorIs(t, err, envelope.ErrPinMissing)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Len(t, got, len(tc.want), "every handle is in the map, no other")
			for name, key := range tc.want {
				v, ok := got[name]
				require.True(t, ok, "handle %s missing from the map", name)
				if key == "" {
					require.Nil(t, v, "handle %s", name)
					continue
				}
				require.NotNil(t, v, "handle %s", name)
				require.Equal(t, e[key].CallID, v.CallID, "handle %s", name)
			}
		})
	}
}

// TestPinTheFinalOutput: a handle on final_output selects the validated
// answer when the run has one (an envelope whose output is the value, the
// same id for the same value), and on_missing otherwise.
func TestPinTheFinalOutput(t *testing.T) {
	pin := envelope.PinnedHandle{Name: "answer", Selector: envelope.PinSelector{Tool: envelope.OutputToolName}}
	require.NoError(t, pin.Validate())
	out := envelope.NewAgentOutputs(`{"city":"Lyon"}`, nil, "")
	out.Output = json.RawMessage(`{"city":"Lyon"}`)
	got := pin.Select(out)
	require.NotNil(t, got)
	require.Equal(t, envelope.OutputToolName, got.Name)
	require.JSONEq(t, `{"city":"Lyon"}`, string(got.Output))
	require.Regexp(t, `^[0-9a-f]{64}$`, got.CallID)
	require.Equal(t, got.CallID, pin.Select(out).CallID)

	out.Output = json.RawMessage(`null`)
	require.Nil(t, pin.Select(out), "no validated answer: nothing to pin")
	pin.OnMissing = envelope.MissingError
	_, err := envelope.ResolvePins(out, []envelope.PinnedHandle{pin})
	require.ErrorIs(t, err, envelope.ErrPinMissing)
}

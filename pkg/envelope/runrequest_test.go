package envelope_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestValidateRunID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"r", true},
		{"run-2025_03_14", true},
		{"ABCxyz019", true},
		{strings.Repeat("a", 64), true},
		{"", false},
		{strings.Repeat("a", 65), false},
		{"run.1", false},   // a subject token separator
		{"run*", false},    // a wildcard
		{"run>", false},    // a wildcard
		{"run 1", false},   // whitespace
		{"run\n1", false},  // newline
		{"run/1", false},   // path separator
		{"rün", false},     // non-ASCII
		{"run$1", false},   // reserved characters
		{"1\x00", false},   // NUL
		{"run-1\n", false}, // trailing newline ($ must not match before it)
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			err := envelope.ValidateRunID(tc.id)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidRequest)
			require.ErrorContains(t, err, "run_id")
			require.ErrorContains(t, err, "must be 1-64 letters, digits, '-' or '_'")
		})
	}

	t.Run("long ids are cut in the message", func(t *testing.T) {
		err := envelope.ValidateRunID(strings.Repeat("x", 500))
		require.Error(t, err)
		require.Contains(t, err.Error(), strings.Repeat("x", 80)+"...")
		require.NotContains(t, err.Error(), strings.Repeat("x", 81))
	})
}

func TestRunRequestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(r *envelope.RunRequest)
		want   []string // fragments of the error; none: valid
	}{
		{"valid", func(*envelope.RunRequest) {}, nil},
		{"no tools, no pins, no policy", func(r *envelope.RunRequest) {
			r.Agent.EnabledTools, r.Agent.PinnedHandles, r.Agent.Policy, r.Metadata = nil, nil, envelope.Policy{}, nil
		}, nil},
		{"pin for a tool that is not enabled", func(r *envelope.RunRequest) {
			r.Agent.EnabledTools = r.Agent.EnabledTools[1:] // web_search disabled; its pins stay
		}, nil},
		{"empty run_id", func(r *envelope.RunRequest) { r.RunID = "" }, []string{`run_id "" must be 1-64 letters, digits, '-' or '_'`}},
		{"run_id with a dot", func(r *envelope.RunRequest) { r.RunID = "a.b" }, []string{`run_id "a.b" must be`}},
		{"long run_id", func(r *envelope.RunRequest) { r.RunID = strings.Repeat("r", 200) }, []string{`run_id "` + strings.Repeat("r", 80) + `..." must be`}},
		{"blank org", func(r *envelope.RunRequest) { r.Tenant.OrgID = " \t" }, []string{"tenant.org_id is required"}},
		{"missing org", func(r *envelope.RunRequest) { r.Tenant = envelope.Tenant{UserID: "u"} }, []string{"tenant.org_id is required"}},
		{"blank agent name", func(r *envelope.RunRequest) { r.Agent.Name = "  " }, []string{"agent.name is required"}},
		{"no provider", func(r *envelope.RunRequest) { r.Agent.Model.Provider = "" }, []string{"agent.model.provider is required"}},
		{"tool without version", func(r *envelope.RunRequest) { r.Agent.EnabledTools = []string{"web_search"} }, []string{`agent.enabled_tools[0]: invalid tool reference "web_search": want name@version`}},
		{"tool with bad version", func(r *envelope.RunRequest) { r.Agent.EnabledTools = []string{"a@1.0.0", "b@latest"} }, []string{`agent.enabled_tools[1]: invalid tool reference "b@latest": version must be a semantic version`}},
		{"tool with bad name", func(r *envelope.RunRequest) { r.Agent.EnabledTools = []string{"web.search@1.0.0"} }, []string{`agent.enabled_tools[0]: invalid tool reference "web.search@1.0.0": name must be 1-64 letters`}},
		{"two versions of a tool", func(r *envelope.RunRequest) { r.Agent.EnabledTools = []string{"a@1.0.0", "b@1.0.0", "a@2.0.0"} }, []string{"agent.enabled_tools: a@1.0.0 and a@2.0.0 name the same tool; enable one version"}},
		{"negative max_iterations", func(r *envelope.RunRequest) { r.Agent.Policy.MaxIterations = -1 }, []string{"agent.policy caps must not be negative"}},
		{"negative max_tool_calls", func(r *envelope.RunRequest) { r.Agent.Policy.MaxToolCalls = -5 }, []string{"agent.policy caps must not be negative"}},
		{"negative budget", func(r *envelope.RunRequest) { r.Agent.Policy.MaxBudget = -0.01 }, []string{"agent.policy caps must not be negative"}},
		{"unknown side effects", func(r *envelope.RunRequest) { r.Agent.Policy.SideEffects = "delete" }, []string{`agent.policy.side_effects "delete" is not one of none, reads, writes`}},
		{"invalid pin", func(r *envelope.RunRequest) { r.Agent.PinnedHandles[1].Selector.Strategy = "oldest" }, []string{`agent.pinned_handles[1]: invalid pinned handle "first_search": selector.strategy "oldest" is not one of latest, first_success, by_call_id`}},
		{"duplicate pin name", func(r *envelope.RunRequest) { r.Agent.PinnedHandles[3].Name = "weather_report" }, []string{`agent.pinned_handles: duplicate name "weather_report"`}},
		{"no messages", func(r *envelope.RunRequest) { r.Messages = nil }, []string{"messages must hold at least one message"}},
		{"deadline of a second", func(r *envelope.RunRequest) { r.DeadlineS = 1 }, nil},
		{"deadline of a day", func(r *envelope.RunRequest) { r.DeadlineS = envelope.MaxDeadlineS }, nil},
		{"negative deadline", func(r *envelope.RunRequest) { r.DeadlineS = -1 }, []string{"deadline_s -1 must be 1 to 86400 seconds (0: the server's default)"}},
		{"deadline past a day", func(r *envelope.RunRequest) { r.DeadlineS = envelope.MaxDeadlineS + 1 }, []string{"deadline_s 86401 must be 1 to 86400 seconds"}},
		{"unknown role", func(r *envelope.RunRequest) { r.Messages[1].Role = "robot" }, []string{`messages[1].role "robot" is not one of system, user, assistant, tool`}},
		{"empty role", func(r *envelope.RunRequest) { r.Messages[0].Role = "" }, []string{`messages[0].role "" is not one of`}},
		// Text fields: a name holds no control character of any kind, no
		// invalid UTF-8 and no invisible reordering mark; free text holds no
		// control but line breaks and tabs.
		{"NUL in agent name", func(r *envelope.RunRequest) { r.Agent.Name = "bot\x00" }, []string{"agent.name holds the control character U+0000 at byte 3"}},
		{"NUL in org id", func(r *envelope.RunRequest) { r.Tenant.OrgID = "acme\x00" }, []string{"tenant.org_id holds the control character U+0000"}},
		{"NUL in workspace id", func(r *envelope.RunRequest) { r.Tenant.WorkspaceID = "\x00" }, []string{"tenant.workspace_id holds the control character U+0000"}},
		{"newline in user id", func(r *envelope.RunRequest) { r.Tenant.UserID = "u\nforged log line" }, []string{"tenant.user_id holds the control character U+000A"}},
		{"DEL in model name", func(r *envelope.RunRequest) { r.Agent.Model.Name = "gpt\x7f" }, []string{"agent.model.name holds the control character U+007F"}},
		{"C1 control in provider", func(r *envelope.RunRequest) { r.Agent.Model.Provider = "open\u0085ai" }, []string{"agent.model.provider holds the control character U+0085"}},
		{"bidi override in agent name", func(r *envelope.RunRequest) { r.Agent.Name = "admin\u202egnp" }, []string{"agent.name holds the invisible formatting character U+202E"}},
		{"invalid UTF-8 in org id", func(r *envelope.RunRequest) { r.Tenant.OrgID = "ac\xffme" }, []string{"tenant.org_id is not valid UTF-8"}},
		{"replacement character in agent name", func(r *envelope.RunRequest) { r.Agent.Name = "bot\ufffd" }, []string{"agent.name holds U+FFFD (text that was not valid UTF-8) at byte 3"}},
		{"long agent name", func(r *envelope.RunRequest) { r.Agent.Name = strings.Repeat("a", 257) }, []string{"agent.name is 257 bytes, more than 256"}},
		{"NUL in a scope", func(r *envelope.RunRequest) { r.Agent.Policy.Scopes = []string{"mail:read\x00"} }, []string{"agent.policy.scopes[0] holds the control character U+0000"}},
		{"NUL in metadata", func(r *envelope.RunRequest) { r.Metadata = map[string]string{"k": "v\x00"} }, []string{"metadata[k] holds the control character U+0000"}},
		{"NUL in metadata key", func(r *envelope.RunRequest) { r.Metadata = map[string]string{"k\x00": "v"} }, []string{"metadata key holds the control character U+0000"}},
		{"NUL in system prompt", func(r *envelope.RunRequest) { r.Agent.SystemPrompt = "be nice\x00" }, []string{"agent.system_prompt holds the control character U+0000"}},
		{"NUL in message content", func(r *envelope.RunRequest) { r.Messages[0].Content = "hi\x00" }, []string{"messages[0].content holds the control character U+0000"}},
		{"escape in message content", func(r *envelope.RunRequest) { r.Messages[0].Content = "\x1b[2J" }, []string{"messages[0].content holds the control character U+001B"}},
		{"line breaks and tabs in content are fine", func(r *envelope.RunRequest) { r.Messages[0].Content = "line 1\r\n\tline 2" }, nil},
		{"NUL in message name", func(r *envelope.RunRequest) { r.Messages[0].Name = "\x00" }, []string{"messages[0].name holds the control character U+0000"}},
		{"every problem at once", func(r *envelope.RunRequest) {
			r.RunID = "bad id"
			r.Tenant.OrgID = ""
			r.Agent.Name = ""
			r.Messages = nil
		}, []string{"run_id \"bad id\"", "; tenant.org_id is required", "; agent.name is required", "; messages must hold at least one message"}},
	}
	s := newSchemas(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := fixtureRunRequest(t)
			tc.mutate(&r)
			err := r.Validate()
			if tc.want == nil {
				require.NoError(t, err)
				require.NoError(t, s.ValidateValue(envelope.SchemaRunRequest, r), "valid requests match the schema too")
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidRequest)
			require.True(t, strings.HasPrefix(err.Error(), "invalid run request: "), err.Error())
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestPolicyDefaults(t *testing.T) {
	var zero envelope.Policy
	require.Equal(t, envelope.DefaultMaxIterations, zero.Iterations())
	require.Equal(t, 10, zero.Iterations())
	require.Equal(t, envelope.DefaultMaxToolCalls, zero.ToolCalls())
	require.Equal(t, 25, zero.ToolCalls())
	require.Equal(t, envelope.SideEffectsWrites, zero.SideEffectCeiling())

	p := envelope.Policy{MaxIterations: 3, MaxToolCalls: 7, SideEffects: envelope.SideEffectsNone}
	require.Equal(t, 3, p.Iterations())
	require.Equal(t, 7, p.ToolCalls())
	require.Equal(t, envelope.SideEffectsNone, p.SideEffectCeiling())
}

func TestTenantID(t *testing.T) {
	require.Equal(t, "acme/research/u-42", envelope.Tenant{OrgID: "acme", WorkspaceID: "research", UserID: "u-42"}.ID())
	require.Equal(t, "acme//", envelope.Tenant{OrgID: "acme"}.ID())
	require.NotEqual(t, envelope.Tenant{OrgID: "acme", WorkspaceID: "w"}.ID(), envelope.Tenant{OrgID: "acme", UserID: "w"}.ID())
}

func TestAgentEnabledRefs(t *testing.T) {
	a := fixtureRunRequest(t).Agent
	refs, err := a.EnabledRefs()
	require.NoError(t, err)
	require.Equal(t, []envelope.ToolRef{
		{Name: "web_search", Version: "1.2.0"},
		{Name: "calculator", Version: "2.0.0"},
		{Name: "http_request", Version: "1.0.0-rc.1"},
		{Name: "plot", Version: "0.3.1"},
	}, refs)

	a.EnabledTools = nil
	refs, err = a.EnabledRefs()
	require.NoError(t, err)
	require.Empty(t, refs)

	a.EnabledTools = []string{"ok@1.0.0", "broken"}
	_, err = a.EnabledRefs()
	require.ErrorIs(t, err, envelope.ErrInvalidToolRef)
}

// A tool message may say its call failed; the run request schema accepts it.
func TestMessageIsError(t *testing.T) {
	s := newSchemas(t)
	req := fixtureRunRequest(t)
	req.Messages = append(req.Messages,
		envelope.Message{Role: envelope.RoleAssistant, ToolCalls: []envelope.ToolCall{{ID: "c1", Name: "echo", Arguments: []byte(`{}`)}}},
		envelope.Message{Role: envelope.RoleTool, ToolCallID: "c1", Name: "echo", Content: `{"error":{"code":"TIMEOUT","message":"slow"}}`, IsError: true})
	require.NoError(t, req.Validate())
	require.NoError(t, s.ValidateValue(envelope.SchemaRunRequest, req))
	b := marshal(t, req)
	require.Contains(t, string(b), `"is_error":true`)
	require.Error(t, s.Validate(envelope.SchemaRunRequest, patch(t, b, edit{"/messages/2/is_error", "yes"})))
}

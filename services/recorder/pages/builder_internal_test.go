package pages

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/auth"
)

// TestBuilderFormMakesTheRequest: what each field of the builder's form
// becomes in the run request, and what the form cannot make is a problem,
// not a guess.
func TestBuilderFormMakesTheRequest(t *testing.T) {
	producer := auth.Principal{Name: "p", Role: auth.RoleProducer, OrgID: "org1", WorkspaceID: "ws1"}
	admin := auth.Principal{Name: "a", Role: auth.RoleAdmin, OrgID: auth.AllTenants}
	base := url.Values{"name": {"a1"}, "run_id": {"r1"}, "provider": {"scripted"}, "model": {"m"}, "message": {"hi"}}
	with := func(kv ...string) url.Values {
		q := url.Values{}
		for k, v := range base {
			q[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			q.Add(kv[i], kv[i+1])
		}
		return q
	}
	for _, tc := range []struct {
		name     string
		q        url.Values
		who      auth.Principal
		check    func(t *testing.T, req envelope.RunRequest)
		problems []string
	}{
		{name: "the credential's tenant", q: base, who: producer, check: func(t *testing.T, req envelope.RunRequest) {
			require.Equal(t, envelope.Tenant{OrgID: "org1", WorkspaceID: "ws1"}, req.Tenant)
			require.Equal(t, []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}, req.Messages)
			require.Equal(t, []string{}, req.Agent.EnabledTools, "none enabled is an empty list, as the contract wants")
			require.Nil(t, req.Agent.Policy.RequireApproval)
		}},
		{name: "a tenant named by an admin of every tenant", q: with("org_id", "org9", "workspace_id", "w"), who: admin,
			check: func(t *testing.T, req envelope.RunRequest) {
				require.Equal(t, envelope.Tenant{OrgID: "org9", WorkspaceID: "w"}, req.Tenant)
			}},
		{name: "a tenant named by a producer is not its", q: with("org_id", "org9"), who: producer, check: func(t *testing.T, req envelope.RunRequest) {
			require.Equal(t, "org1", req.Tenant.OrgID)
		}},
		{name: "tools, once each, in order", q: with("tool", "b@1.0.0", "tool", "a@2.0.0", "tool", "b@1.0.0", "tool", " "), who: producer,
			check: func(t *testing.T, req envelope.RunRequest) {
				require.Equal(t, []string{"b@1.0.0", "a@2.0.0"}, req.Agent.EnabledTools)
			}},
		{name: "clear all", q: with("tool", "b@1.0.0", "approve_tool", "b", "clear", "tools"), who: producer, check: func(t *testing.T, req envelope.RunRequest) {
			require.Empty(t, req.Agent.EnabledTools)
			require.Nil(t, req.Agent.Policy.RequireApproval)
		}},
		{name: "policy", q: with("max_iterations", "6", "max_tool_calls", "4", "max_budget", "0.25", "side_effects", "reads",
			"scopes", "crm:read, email:send crm:read", "approve_writes", "true", "approve_tool", "b", "approval_timeout_s", "90"), who: producer,
			check: func(t *testing.T, req envelope.RunRequest) {
				require.Equal(t, envelope.Policy{MaxIterations: 6, MaxToolCalls: 4, MaxBudget: 0.25, SideEffects: envelope.SideEffectsReads,
					Scopes: []string{"crm:read", "email:send"}, RequireApproval: &envelope.ApprovalPolicy{Writes: true, Tools: []string{"b"}},
					ApprovalTimeoutS: 90}, req.Agent.Policy)
			}},
		{name: "numbers that are not", q: with("max_iterations", "six", "max_tool_calls", "-1", "max_budget", "lots"), who: producer,
			problems: []string{`agent.policy.max_iterations: "six" is not a whole number of 0 or more`,
				`agent.policy.max_tool_calls: "-1" is not a whole number of 0 or more`,
				`agent.policy.max_budget: "lots" is not an amount of 0 or more`}},
		{name: "options must be an object", q: with("options", "[1]"), who: producer, problems: []string{"agent.model.options: not a JSON object"}},
		{name: "options compacted", q: with("options", "{\n  \"script\": [] }"), who: producer, check: func(t *testing.T, req envelope.RunRequest) {
			require.JSONEq(t, `{"script":[]}`, string(req.Agent.Model.Options))
			require.NotContains(t, string(req.Agent.Model.Options), "\n")
		}},
		{name: "pins: rows, the call id only for by_call_id, empty rows dropped", who: producer,
			q: with("pin_name", "first", "pin_tool", "echo", "pin_strategy", "first_success", "pin_run", "", "pin_call", "abc", "pin_missing", "error",
				"pin_name", "", "pin_tool", "", "pin_strategy", "latest", "pin_run", "", "pin_call", "", "pin_missing", "null",
				"pin_name", "exact", "pin_tool", "echo", "pin_strategy", "by_call_id", "pin_run", "past", "pin_call", strings.Repeat("a", 64), "pin_missing", "null"),
			check: func(t *testing.T, req envelope.RunRequest) {
				require.Equal(t, []envelope.PinnedHandle{
					{Name: "first", Selector: envelope.PinSelector{Tool: "echo", Strategy: envelope.PinFirstSuccess}, OnMissing: envelope.MissingError},
					{Name: "exact", Selector: envelope.PinSelector{Tool: "echo", Strategy: envelope.PinByCallID, CallID: strings.Repeat("a", 64)}, OnMissing: envelope.MissingNull},
				}, req.Agent.PinnedHandles)
			}},
		{name: "the pin button adds a row with a free name", q: with("pin_name", "echo", "pin_tool", "echo", "pin", "echo"), who: producer,
			check: func(t *testing.T, req envelope.RunRequest) {
				require.Len(t, req.Agent.PinnedHandles, 2)
				require.Equal(t, "echo_2", req.Agent.PinnedHandles[1].Name)
				require.Equal(t, envelope.PinLatest, req.Agent.PinnedHandles[1].Selector.Strategy)
			}},
		{name: "remove a pin", q: with("pin_name", "a", "pin_tool", "echo", "pin_name", "b", "pin_tool", "echo", "unpin", "0"), who: producer,
			check: func(t *testing.T, req envelope.RunRequest) {
				require.Len(t, req.Agent.PinnedHandles, 1)
				require.Equal(t, "b", req.Agent.PinnedHandles[0].Name)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, problems := readBuilderForm(tc.q).request(tc.who)
			require.Equal(t, tc.problems, problems)
			if tc.check != nil {
				tc.check(t, req)
			}
		})
	}
}

// TestNewBuilderForm: a form without an agent is a new one: the defaults
// make a request that passes the contract's checks, under a fresh run id.
func TestNewBuilderForm(t *testing.T) {
	f := readBuilderForm(url.Values{})
	req, problems := f.request(auth.Principal{Role: auth.RoleProducer, OrgID: "org1"})
	require.Empty(t, problems)
	require.NoError(t, req.Validate())
	require.True(t, strings.HasPrefix(req.RunID, "builder-"), req.RunID)
	require.NotEqual(t, req.RunID, readBuilderForm(url.Values{}).RunID)
	require.Equal(t, builderProvider, req.Agent.Model.Provider)
}

// TestPinNames: a pin's default name is its tool's, made a handle name;
// a second pin of the same tool is numbered.
func TestPinNames(t *testing.T) {
	require.Equal(t, "echo_3", builderForm{Pins: []pinForm{{Name: "echo"}, {Name: "echo_2"}}}.pinName("echo"))
	for tool, want := range map[string]string{"echo": "echo", "9lives": "_9lives", "a.b": "a_b", strings.Repeat("x", 70): strings.Repeat("x", 56)} {
		name := builderForm{}.pinName(tool)
		require.Equal(t, want, name, tool)
		require.NoError(t, envelope.PinnedHandle{Name: name, Selector: envelope.PinSelector{Tool: "echo"}}.Validate(), name)
	}
}

package envelope_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestToolDefinitionRequirements(t *testing.T) {
	tests := []struct {
		name    string
		secrets []string
		scopes  []string
		err     string // "" when valid
	}{
		{name: "none"},
		{name: "secrets and scopes", secrets: []string{"OPENAI_API_KEY", "_x", "a1"}, scopes: []string{"crm:write", "web.read/all"}},
		{name: "secret starts with a digit", secrets: []string{"1KEY"},
			err: `required_secrets[0]: secret name "1KEY" must be 1-64 letters, digits or '_', not starting with a digit`},
		{name: "secret with a dash", secrets: []string{"API-KEY"}, err: `required_secrets[0]: secret name "API-KEY"`},
		{name: "empty secret name", secrets: []string{""}, err: `required_secrets[0]: secret name ""`},
		{name: "secret name too long", secrets: []string{strings.Repeat("K", 65)}, err: "required_secrets[0]: secret name"},
		{name: "secret twice", secrets: []string{"KEY", "KEY"}, err: `required_secrets[1]: "KEY" is listed twice`},
		{name: "scope with a space", scopes: []string{"crm write"},
			err: `required_scopes[0]: scope "crm write" must be 1-128 printable characters without spaces`},
		{name: "empty scope", scopes: []string{""}, err: `required_scopes[0]: scope ""`},
		{name: "scope twice", scopes: []string{"a", "b", "a"}, err: `required_scopes[2]: "a" is listed twice`},
	}
	schemas := newSchemas(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := fixtureToolDefinition()
			// A builtin: an http tool must also send each secret in a
			// header (TestHTTPConfig), which is not what this test is about.
			d.Implementation = envelope.Implementation{Kind: envelope.ImplBuiltin}
			d.RequiredSecrets, d.RequiredScopes, d.SupportsPreview = tt.secrets, tt.scopes, true
			err := d.Validate()
			schemaErr := schemas.Validate(envelope.SchemaToolDefinition, marshal(t, d))
			if tt.err == "" {
				require.NoError(t, err)
				require.NoError(t, schemaErr, "the schema accepts what Validate accepts")
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			require.ErrorContains(t, err, tt.err)
			require.ErrorIs(t, schemaErr, envelope.ErrSchemaViolation, "the schema rejects it too")
		})
	}
}

func TestToolDefinitionRequirementsJSON(t *testing.T) {
	d := fixtureToolDefinition()
	d.RequiredSecrets = []string{"SEARCH_KEY"}
	d.RequiredScopes = []string{"web:read"}
	d.SupportsPreview = true
	b := marshal(t, d)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	require.Equal(t, []any{"SEARCH_KEY"}, m["required_secrets"])
	require.Equal(t, []any{"web:read"}, m["required_scopes"])
	require.Equal(t, true, m["supports_preview"])

	// Absent when unset: definitions written before these fields are unchanged.
	plain := marshal(t, fixtureToolDefinition())
	for _, k := range []string{"required_secrets", "required_scopes", "supports_preview"} {
		require.NotContains(t, string(plain), k)
	}
}

func TestApprovalPolicyRequires(t *testing.T) {
	writes := fixtureToolDefinition()
	writes.Name, writes.Version = "send_email", "2.0.0"
	writes.Metadata = envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone}
	reads := fixtureToolDefinition() // web_search@1.2.0, reads

	tests := []struct {
		name   string
		policy *envelope.ApprovalPolicy
		def    envelope.ToolDefinition
		reason string // "" when no approval is needed
	}{
		{name: "no policy", def: writes},
		{name: "writes, a writing tool", policy: &envelope.ApprovalPolicy{Writes: true}, def: writes,
			reason: "the policy requires approval for tools that write, and send_email@2.0.0 writes"},
		{name: "writes, a reading tool", policy: &envelope.ApprovalPolicy{Writes: true}, def: reads},
		{name: "named tool, any version", policy: &envelope.ApprovalPolicy{Tools: []string{"web_search"}}, def: reads,
			reason: "the policy requires approval for tool web_search"},
		{name: "named version", policy: &envelope.ApprovalPolicy{Tools: []string{"web_search@1.2.0"}}, def: reads,
			reason: "the policy requires approval for tool web_search@1.2.0"},
		{name: "another version named", policy: &envelope.ApprovalPolicy{Tools: []string{"web_search@2.0.0"}}, def: reads},
		{name: "another tool named", policy: &envelope.ApprovalPolicy{Tools: []string{"send_email"}}, def: reads},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			need, reason := tt.policy.Requires(&tt.def)
			require.Equal(t, tt.reason != "", need)
			require.Equal(t, tt.reason, reason)
		})
	}
}

func TestPolicyApprovalTimeout(t *testing.T) {
	require.Equal(t, 15*time.Minute, envelope.Policy{}.ApprovalTimeout())
	require.Equal(t, 3*time.Second, envelope.Policy{ApprovalTimeoutS: 3}.ApprovalTimeout())
}

func TestRunRequestPolicyGuardSettings(t *testing.T) {
	tests := []struct {
		name   string
		policy envelope.Policy
		err    string // "" when valid
	}{
		{name: "approvals", policy: envelope.Policy{
			RequireApproval:  &envelope.ApprovalPolicy{Writes: true, Tools: []string{"send_email", "web_search@1.2.0"}},
			ApprovalTimeoutS: 60, Scopes: []string{"crm:write"},
		}},
		{name: "the longest timeout", policy: envelope.Policy{ApprovalTimeoutS: envelope.MaxApprovalTimeoutS}},
		{name: "timeout too long", policy: envelope.Policy{ApprovalTimeoutS: envelope.MaxApprovalTimeoutS + 1},
			err: "agent.policy.approval_timeout_s 86401 must be from 1 to 86400 (one day); 0 means 900"},
		{name: "negative timeout", policy: envelope.Policy{ApprovalTimeoutS: -1},
			err: "agent.policy.approval_timeout_s -1 must be from 1 to 86400"},
		{name: "bad tool name", policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"send email"}}},
			err: `agent.policy.require_approval.tools[0]: "send email" is neither a tool name nor name@version`},
		{name: "bad tool version", policy: envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Tools: []string{"send_email@latest"}}},
			err: "agent.policy.require_approval.tools[0]: invalid tool reference"},
		{name: "bad scope", policy: envelope.Policy{Scopes: []string{"crm write"}},
			err: `agent.policy.scopes[0]: scope "crm write" must be 1-128 printable characters without spaces`},
	}
	schemas := newSchemas(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := fixtureRunRequest(t)
			req.Agent.Policy = tt.policy
			err := req.Validate()
			if tt.err == "" {
				require.NoError(t, err)
				require.NoError(t, schemas.Validate(envelope.SchemaRunRequest, marshal(t, req)))
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidRequest)
			require.ErrorContains(t, err, tt.err)
		})
	}
	// The schema bounds the timeout too.
	req := fixtureRunRequest(t)
	req.Agent.Policy.ApprovalTimeoutS = envelope.MaxApprovalTimeoutS + 1
	require.ErrorIs(t, schemas.Validate(envelope.SchemaRunRequest, marshal(t, req)), envelope.ErrSchemaViolation)
}

// The run's deadline: Validate and the schema take the same range.
func TestRunRequestDeadline(t *testing.T) {
	schemas := newSchemas(t)
	for _, tc := range []struct {
		s  int
		ok bool
	}{{0, true}, {1, true}, {1800, true}, {envelope.MaxDeadlineS, true}, {-1, false}, {envelope.MaxDeadlineS + 1, false}} {
		req := fixtureRunRequest(t)
		req.DeadlineS = tc.s
		verr, serr := req.Validate(), schemas.Validate(envelope.SchemaRunRequest, marshal(t, req))
		if tc.ok {
			require.NoError(t, verr, tc.s)
			require.NoError(t, serr, tc.s)
			continue
		}
		require.ErrorIs(t, verr, envelope.ErrInvalidRequest, tc.s)
		require.ErrorContains(t, verr, "deadline_s")
		require.ErrorIs(t, serr, envelope.ErrSchemaViolation, tc.s)
	}
}

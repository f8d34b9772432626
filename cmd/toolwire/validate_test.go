package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

func TestValidateCommand(t *testing.T) {
	env := eventstest.Start(t)
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	def := func(name string, se envelope.SideEffects, scopes ...string) envelope.ToolDefinition {
		return envelope.ToolDefinition{Name: name, Version: "1.0.0", InputSchema: json.RawMessage(`{"type":"object"}`),
			Metadata:       envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: se, Cache: envelope.CacheNone},
			Implementation: envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(`{"url":"https://api.example/` + name + `"}`)},
			RequiredScopes: scopes}
	}
	for _, e := range []registry.Entry{
		{Definition: def("search", envelope.SideEffectsReads)},
		{Definition: def("old_search", envelope.SideEffectsReads), State: registry.StateDeprecated},
		{Definition: def("legacy_crm", envelope.SideEffectsReads), State: registry.StateDeprecated},
		{Definition: def("rm_rf", envelope.SideEffectsWrites), State: registry.StateBlocked},
		{Definition: def("send_email", envelope.SideEffectsWrites, "email:send")},
	} {
		require.NoError(t, reg.Put(t.Context(), e))
	}
	// The default queue has a live worker.
	require.NoError(t, registry.Beat(t.Context(), env.JS, registry.Worker{Queue: envelope.DefaultQueue, Instance: "w1",
		ID: "executor-1", TTL: registry.MaxWorkerTTL}, time.Now()))
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	agent := func(tools string, policy string) string {
		return `{"name":"researcher","model":{"provider":"scripted","name":"m"},"enabled_tools":[` + tools + `],"policy":{` + policy + `}}`
	}

	// Clean.
	out, err := cli(t, env.URL, "", "validate", write("ok.json", agent(`"search@1.0.0"`, "")))
	require.NoError(t, err)
	require.Equal(t, "ok: agent researcher, 1 enabled tools\n", out)

	// Every deprecated tool is warned about; exit 0.
	out, err = cli(t, env.URL, "", "validate", write("dep.json", agent(`"search@1.0.0","old_search@1.0.0","legacy_crm@1.0.0"`, "")))
	require.NoError(t, err)
	require.Equal(t, "warning: tool old_search@1.0.0 is deprecated\nwarning: tool legacy_crm@1.0.0 is deprecated\n", out)

	// Blocked and unknown tools are errors; exit non-zero.
	out, err = cli(t, env.URL, "", "validate", write("bad.json", agent(`"old_search@1.0.0","rm_rf@1.0.0","ghost@2.0.0"`, "")))
	require.ErrorIs(t, err, errFindings)
	require.ErrorContains(t, err, "2 errors, 1 warnings")
	require.Equal(t, "warning: tool old_search@1.0.0 is deprecated\nerror: tool rm_rf@1.0.0 is blocked\nerror: unknown tool ghost@2.0.0\n", out)

	// What the guard would refuse: a ceiling, missing scopes.
	out, err = cli(t, env.URL, "", "validate", write("guard.json", agent(`"send_email@1.0.0"`, `"side_effects":"reads"`)))
	require.NoError(t, err)
	require.Equal(t, "warning: tool send_email@1.0.0 has side effects \"writes\", above the agent's ceiling \"reads\": its calls will be denied\n"+
		"warning: tool send_email@1.0.0 needs scopes the policy does not grant (email:send): its calls will be denied\n", out)

	// A tool on a queue nobody serves: its calls would fail.
	upper := def("upper", envelope.SideEffectsNone)
	upper.Queue = "text"
	require.NoError(t, reg.Put(t.Context(), registry.Entry{Definition: upper}))
	out, err = cli(t, env.URL, "", "validate", write("text.json", agent(`"search@1.0.0","upper@1.0.0"`, "")))
	require.NoError(t, err)
	require.Equal(t, "warning: tool upper@1.0.0 runs on queue \"text\", which no live worker serves: its calls will fail with PROVIDER_ERROR until one starts\n", out)
	require.NoError(t, registry.Beat(t.Context(), env.JS, registry.Worker{Queue: "text", Instance: "w2",
		ID: "worker-1", TTL: registry.MaxWorkerTTL}, time.Now()))
	out, err = cli(t, env.URL, "", "validate", write("text.json", agent(`"search@1.0.0","upper@1.0.0"`, "")))
	require.NoError(t, err)
	require.Equal(t, "ok: agent researcher, 2 enabled tools\n", out)

	// A version of a web tool that declares a secret and binds only one of
	// two: its calls that send the other would be denied.
	github := envelope.ToolDefinition{Name: "http_get", Version: "1.0.0-github", InputSchema: json.RawMessage(`{"type":"object"}`),
		Metadata:           envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		Implementation:     envelope.Implementation{Kind: envelope.ImplBuiltin, Config: json.RawMessage(`{"builtin":"http_get"}`)},
		RequiredSecrets:    []string{"GITHUB_TOKEN", "GIST_TOKEN"},
		SecretDestinations: map[string]envelope.SecretBinding{"GITHUB_TOKEN": {Hosts: []string{"api.github.com"}, Headers: []string{"Authorization"}}}}
	require.NoError(t, reg.Put(t.Context(), registry.Entry{Definition: github}))
	out, err = cli(t, env.URL, "", "validate", write("web.json", agent(`"http_get@1.0.0-github"`, "")))
	require.NoError(t, err)
	require.Equal(t, "warning: tool http_get@1.0.0-github is a web tool that declares GIST_TOKEN with no secret_destinations: "+
		"a call that sends them will be denied (docs/tools.md, Secrets by name)\n", out)

	// A whole run request, in YAML, with --json.
	yml := `run_id: r1
tenant: {org_id: acme}
agent:
  name: researcher
  model: {provider: scripted, name: m}
  enabled_tools: [old_search@1.0.0]
  policy: {}
messages: [{role: user, content: hi}]
`
	out, err = cli(t, env.URL, "", "validate", "--json", write("req.yaml", yml))
	require.NoError(t, err)
	require.JSONEq(t, `{"warnings":["tool old_search@1.0.0 is deprecated"],"problems":[]}`, out)

	// An http tool stored before endpoints were checked cannot run: an
	// error, like a blocked tool.
	kv, err := env.JS.KeyValue(t.Context(), provision.BucketTools)
	require.NoError(t, err)
	legacy := def("legacy_fetch", envelope.SideEffectsReads)
	legacy.Implementation.Config = json.RawMessage(`{"url":"https://bob:pw@api.example/x"}`)
	b, err := json.Marshal(registry.Entry{Definition: legacy, State: registry.StateActive})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), registry.Key(legacy.Ref()), b)
	require.NoError(t, err)
	out, err = cli(t, env.URL, "", "validate", write("legacy.json", agent(`"search@1.0.0","legacy_fetch@1.0.0"`, "")))
	require.ErrorIs(t, err, errFindings)
	require.Equal(t, `error: tool legacy_fetch@1.0.0 cannot run: invalid tool definition legacy_fetch@1.0.0: implementation.config: `+
		`url "https://bob:xxxxx@api.example/x": credentials in the URL are not accepted: use secret_headers`+"\n", out)

	// Malformed configurations.
	for _, tc := range []struct{ content, err string }{
		{`{"name":"a","model":{"provider":"scripted","name":"m"},"enabled_tools":[],"policy":{},"colour":"red"}`, `unknown field "colour"`},
		{agent(`"search"`, ""), `agent.enabled_tools[0]: invalid tool reference "search"`},
		{agent(`"search@1.0.0"`, `"max_tool_calls":-1`), "agent.policy caps must not be negative"},
		{`[1,2]`, "not a JSON object"},
		{`{"name":"a"} {"name":"b"}`, "not a JSON object"},
		{`{"name":"a","model":{"provider":"scripted","name":"m"},"enabled_tools":[],"policy":{}}]`, "not a JSON object"},
	} {
		_, err := cli(t, env.URL, "", "validate", write("m.json", tc.content))
		require.ErrorContains(t, err, tc.err)
	}
}

// TestValidateReportsGates: validate says which of a tool's calls the gate
// matrix puts to an operator, or denies, under the agent's autonomy.
func TestValidateReportsGates(t *testing.T) {
	env := eventstest.Start(t)
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	crm := envelope.ToolDefinition{Name: "crm", Version: "1.0.0", InputSchema: json.RawMessage(`{"type":"object"}`), SupportsPreview: true,
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone},
		Implementation: envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(`{"url":"https://api.example/crm"}`)},
		Risk: &envelope.RiskPolicy{Default: envelope.RiskMedium, Field: "method",
			Actions: map[string]envelope.Risk{"GET": envelope.RiskLow, "DELETE": envelope.RiskCritical}}}
	require.NoError(t, reg.Put(t.Context(), registry.Entry{Definition: crm}))
	require.NoError(t, registry.Beat(t.Context(), env.JS, registry.Worker{Queue: envelope.DefaultQueue, Instance: "w1",
		ID: "executor-1", TTL: registry.MaxWorkerTTL}, time.Now()))
	file := filepath.Join(t.TempDir(), "agent.json")
	write := func(autonomy string) {
		require.NoError(t, os.WriteFile(file, []byte(`{"name":"a","model":{"provider":"scripted","name":"m"},"enabled_tools":["crm@1.0.0"],"policy":{`+autonomy+`}}`), 0o600))
	}
	write(`"autonomy":"supervised"`)
	out, err := cli(t, env.URL, "", "validate", file)
	require.NoError(t, err)
	require.Equal(t, "warning: tool crm@1.0.0: its calls will wait for an operator, with their dry run: supervised × medium → preview (default)\n"+
		"warning: tool crm@1.0.0 (action DELETE): its calls will be denied by the gate matrix: supervised × critical (DELETE) → deny (default)\n", out)

	write(``) // autonomous: only the critical action is put to an operator
	out, err = cli(t, env.URL, "", "validate", file)
	require.NoError(t, err)
	require.Equal(t, "warning: tool crm@1.0.0 (action DELETE): its calls will wait for an operator: autonomous × critical (DELETE) → confirm (default)\n", out)

	write(`"autonomy":"reckless"`)
	_, err = cli(t, env.URL, "", "validate", file)
	require.ErrorContains(t, err, `agent.policy.autonomy "reckless" is not one of manual, supervised, autonomous`)
}

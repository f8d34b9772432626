package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

// cli runs the CLI with stdin and args against a NATS URL ("": none).
func cli(t *testing.T, natsURL, stdin string, args ...string) (string, error) {
	t.Helper()
	if natsURL != "" {
		args = append(args, "--nats", natsURL)
	}
	stdout, stderr, err := runCLI(t, stdin, args...)
	return stdout + stderr, err
}

const weatherYAML = `# a tool definition in YAML
name: weather
version: 1.0.0
description: Current weather for a city.
input_schema:
  type: object
  required: [city]
  properties:
    city: {type: string}
metadata:
  category: api
  side_effects: reads
  cache: ttl
  cache_ttl_s: 300
required_secrets: [WEATHER_KEY]
required_scopes: ["weather:read"]
implementation:
  kind: http
  config:
    url: https://weather.example/v1
    secret_headers: {X-Api-Key: "{{secret:WEATHER_KEY}}"}
`

func TestToolsCommands(t *testing.T) {
	env := eventstest.Start(t)
	dir := t.TempDir()
	yamlFile := filepath.Join(dir, "weather.yaml")
	require.NoError(t, os.WriteFile(yamlFile, []byte(weatherYAML), 0o600))

	out, err := cli(t, env.URL, "", "tools", "register", yamlFile)
	require.NoError(t, err, out)
	require.Equal(t, "registered weather@1.0.0 (active)\n", out)
	out, err = cli(t, env.URL, "", "tools", "register", yamlFile)
	require.NoError(t, err, out)
	require.Equal(t, "weather@1.0.0 is already registered with this definition; nothing changed\n", out)

	// JSON from standard input: a second version.
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	e, err := reg.Get(t.Context(), envelope.ToolRef{Name: "weather", Version: "1.0.0"})
	require.NoError(t, err)
	require.Equal(t, []string{"WEATHER_KEY"}, e.Definition.RequiredSecrets)
	v2 := e.Definition
	v2.Version, v2.Description = "2.0.0", "Weather, with forecasts."
	b, err := json.Marshal(v2)
	require.NoError(t, err)
	out, err = cli(t, env.URL, string(b), "tools", "register", "-")
	require.NoError(t, err, out)
	require.Equal(t, "registered weather@2.0.0 (active)\n", out)

	// A changed definition under a registered version is refused.
	changed := strings.Replace(weatherYAML, "Current weather", "Weather now", 1)
	require.NoError(t, os.WriteFile(yamlFile, []byte(changed), 0o600))
	_, err = cli(t, env.URL, "", "tools", "register", yamlFile)
	require.ErrorIs(t, err, registry.ErrConflict)
	// Invalid definitions name the problem.
	bad := filepath.Join(dir, "bad.yml")
	require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(weatherYAML, "category: api", "category: weather", 1)), 0o600))
	_, err = cli(t, env.URL, "", "tools", "register", bad)
	require.ErrorIs(t, err, envelope.ErrInvalidTool)
	require.ErrorContains(t, err, "at /metadata/category")
	// http tools whose endpoint cannot be called are refused.
	for _, tc := range []struct{ from, to, err string }{
		{`url: https://weather.example/v1`, `url: ftp://weather.example/v1`, "at /implementation/config/url"},
		{`url: https://weather.example/v1`, `url: https://me:pw@weather.example/v1`, "at /implementation/config/url"},
		{`url: https://weather.example/v1`, `url: http://weather.example:70000/v1`, `port "70000" is not a number from 1 to 65535`},
		{"    url: https://weather.example/v1\n", "", "at /implementation/config: missing property 'url'"},
		{`{{secret:WEATHER_KEY}}`, `{{secret:WEATHER_TOKEN}}`, "names the secret WEATHER_TOKEN, which required_secrets does not list"},
	} {
		require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(weatherYAML, tc.from, tc.to, 1)), 0o600))
		_, err = cli(t, env.URL, "", "tools", "register", bad)
		require.ErrorIs(t, err, envelope.ErrInvalidTool, tc.to)
		require.ErrorContains(t, err, tc.err)
	}
	require.NoError(t, os.WriteFile(bad, []byte("name: [unclosed"), 0o600))
	_, err = cli(t, env.URL, "", "tools", "register", bad)
	require.ErrorContains(t, err, "not valid YAML")

	out, err = cli(t, env.URL, "", "tools", "deprecate", "weather@1.0.0")
	require.NoError(t, err)
	require.Equal(t, "weather@1.0.0 is now deprecated\n", out)
	_, err = cli(t, env.URL, "", "tools", "block", "weather@9.9.9")
	require.ErrorIs(t, err, registry.ErrNotFound)
	_, err = cli(t, env.URL, "", "tools", "block", "weather")
	require.ErrorIs(t, err, envelope.ErrInvalidToolRef)

	out, err = cli(t, env.URL, "", "tools", "list", "--search", "weather")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.Regexp(t, `^TOOL\s+STATE\s+HEALTH\s+CATEGORY\s+SIDE EFFECTS\s+SECRETS\s+QUEUE\s+WORKERS\s+DESCRIPTION$`, lines[0])
	require.Regexp(t, `^weather@1.0.0\s+deprecated\s+healthy\s+api\s+reads\s+WEATHER_KEY\s+default\s+none\s+Current weather for a city.$`, lines[1])
	require.Regexp(t, `^weather@2.0.0\s+active\s+`, lines[2])

	// Each tool's queue shows its live workers, and its health their
	// circuits: one executor's is open (degraded), then both (unavailable).
	until := time.Now().Add(time.Hour).UTC()
	beat := func(id string, open bool) {
		w := registry.Worker{Queue: envelope.DefaultQueue, Instance: id, ID: "executor-" + id, TTL: registry.MaxWorkerTTL}
		if open {
			w.Health = []registry.ToolHealth{{Tool: "weather@1.0.0", State: "open", ConsecutiveFailures: 5, OpenUntil: until, LastFailure: "TIMEOUT"}}
		}
		require.NoError(t, registry.Beat(t.Context(), env.JS, w, time.Now()))
	}
	beat("a1", true)
	beat("b2", false)
	out, err = cli(t, env.URL, "", "tools", "list", "--search", "weather")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^weather@1.0.0\s+deprecated\s+degraded until \d\d:\d\d:\d\d\s+api\s+reads\s+WEATHER_KEY\s+default\s+2\s+Current`, out)
	beat("b2", true)
	out, err = cli(t, env.URL, "", "tools", "list", "--search", "weather")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^weather@1.0.0\s+deprecated\s+unavailable until `+until.Format("15:04:05")+`\s+api`, out)

	out, err = cli(t, env.URL, "", "tools", "list", "--state", "deprecated", "--json")
	require.NoError(t, err)
	var entries []registry.Entry
	require.NoError(t, json.Unmarshal([]byte(out), &entries))
	require.Len(t, entries, 1)
	require.Equal(t, "weather", entries[0].Definition.Name)
	var listed []struct {
		Queue   string            `json:"queue"`
		Workers []registry.Worker `json:"workers"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Equal(t, envelope.DefaultQueue, listed[0].Queue)
	require.Len(t, listed[0].Workers, 2)
	require.Equal(t, "executor-a1", listed[0].Workers[0].ID)
	out, err = cli(t, env.URL, "", "tools", "list", "--state", "deprecated", "-o", "json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &entries), "-o json is --json")
	require.Len(t, entries, 1)
	_, err = cli(t, env.URL, "", "tools", "list", "-o", "xml")
	require.Equal(t, exitUsage, exitCode(err), "%v", err)
	_, err = cli(t, env.URL, "", "tools", "list", "--state", "gone")
	require.ErrorContains(t, err, `--state "gone" is not one of active, deprecated, blocked`)
	_, err = cli(t, env.URL, "", "tools", "list", "--category", "misc")
	require.ErrorContains(t, err, `--category "misc" is not one of`)

	out, err = cli(t, env.URL, "", "tools", "block", "weather@1.0.0")
	require.NoError(t, err)
	require.Equal(t, "weather@1.0.0 is now blocked\n", out)
	out, err = cli(t, env.URL, "", "tools", "show", "weather@1.0.0")
	require.NoError(t, err)
	var shown registry.Entry
	require.NoError(t, json.Unmarshal([]byte(out), &shown))
	require.Equal(t, registry.StateBlocked, shown.State)
	out, err = cli(t, env.URL, "", "tools", "activate", "weather@1.0.0")
	require.NoError(t, err)
	require.Equal(t, "weather@1.0.0 is now active\n", out)
}

const githubGetYAML = `# a version of http_get that may send GITHUB_TOKEN to api.github.com alone
name: http_get
version: 1.0.0-github
input_schema: {type: object}
metadata: {category: api, side_effects: reads, cache: none}
implementation: {kind: builtin, config: {builtin: http_get}}
required_secrets: [GITHUB_TOKEN]
secret_destinations:
  GITHUB_TOKEN:
    hosts: [api.github.com, "*.githubusercontent.com"]
    headers: [Authorization]
`

// TestToolsRegisterSecretDestinations: a web tool version binds its secret
// to destinations in YAML; a bad destination is refused with its reason.
func TestToolsRegisterSecretDestinations(t *testing.T) {
	env := eventstest.Start(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "github.yaml")
	require.NoError(t, os.WriteFile(file, []byte(githubGetYAML), 0o600))
	out, err := cli(t, env.URL, "", "tools", "register", file)
	require.NoError(t, err, out)
	require.Equal(t, "registered http_get@1.0.0-github (active)\n", out)
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	e, err := reg.Get(t.Context(), envelope.ToolRef{Name: "http_get", Version: "1.0.0-github"})
	require.NoError(t, err)
	require.Equal(t, map[string]envelope.SecretBinding{"GITHUB_TOKEN": {
		Hosts: []string{"api.github.com", "*.githubusercontent.com"}, Headers: []string{"Authorization"}}}, e.Definition.SecretDestinations)

	for _, tc := range []struct{ from, to, err string }{
		{`api.github.com,`, `"https://api.github.com@evil.net",`, "at /secret_destinations/GITHUB_TOKEN/hosts/0"},
		{`api.github.com,`, `"https://api.github.com/v3",`, "at /secret_destinations/GITHUB_TOKEN/hosts/0"},
		{`"*.githubusercontent.com"`, `"*.com"`, `secret_destinations.GITHUB_TOKEN.hosts[1]: destination "*.com": *.com would match every name under a top-level domain`},
		{`api.github.com,`, `"ftp://api.github.com",`, "at /secret_destinations/GITHUB_TOKEN/hosts/0"},
		{`api.github.com,`, `"api.github.com:99999",`, `secret_destinations.GITHUB_TOKEN.hosts[0]: destination "api.github.com:99999": port "99999" is not a number from 1 to 65535`},
		{`headers: [Authorization]`, `headers: []`, "at /secret_destinations/GITHUB_TOKEN/headers"},
		{`  GITHUB_TOKEN:`, `  GIST_TOKEN:`, "secret_destinations.GIST_TOKEN: the secret GIST_TOKEN is not listed in required_secrets"},
	} {
		bad := filepath.Join(dir, "bad.yaml")
		require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(githubGetYAML, tc.from, tc.to, 1)), 0o600))
		_, err := cli(t, env.URL, "", "tools", "register", bad)
		require.ErrorIs(t, err, envelope.ErrInvalidTool, tc.to)
		require.ErrorContains(t, err, tc.err)
	}
}

// TestToolsDraftAndPublish: a draft is listed with its state, refused by
// validate (as a run refuses it), replaced while it is a draft, and runs
// once published; each change says who made it; a published version is
// never a draft again.
func TestToolsDraftAndPublish(t *testing.T) {
	env := eventstest.Start(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "weather.yaml")
	require.NoError(t, os.WriteFile(file, []byte(weatherYAML), 0o600))
	out, err := cli(t, env.URL, "", "tools", "register", "--draft", file)
	require.NoError(t, err, out)
	require.Equal(t, "registered weather@1.0.0 (draft)\n", out)
	out, err = cli(t, env.URL, "", "tools", "list", "--state", "draft")
	require.NoError(t, err, out)
	require.Contains(t, out, "weather@1.0.0  draft")

	agent := filepath.Join(dir, "agent.json")
	require.NoError(t, os.WriteFile(agent, []byte(`{"name":"a","model":{"provider":"scripted","name":"m"},"enabled_tools":["weather@1.0.0"],"policy":{}}`), 0o600))
	out, err = cli(t, env.URL, "", "validate", agent)
	require.ErrorIs(t, err, errFindings)
	require.Contains(t, out, "error: tool weather@1.0.0 is a draft: publish it first (toolwire tools publish weather@1.0.0)")

	// Still a draft: a changed definition replaces it.
	changed := strings.Replace(weatherYAML, "Current weather", "Weather now", 1)
	require.NoError(t, os.WriteFile(file, []byte(changed), 0o600))
	out, err = cli(t, env.URL, "", "tools", "register", "--draft", file)
	require.NoError(t, err, out)
	require.Equal(t, "weather@1.0.0 is a draft with this definition now\n", out)

	out, err = cli(t, env.URL, "", "tools", "publish", "weather@1.0.0")
	require.NoError(t, err, out)
	require.Equal(t, "weather@1.0.0 is published (active)\n", out)
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	e, err := reg.Get(t.Context(), envelope.ToolRef{Name: "weather", Version: "1.0.0"})
	require.NoError(t, err)
	require.Equal(t, registry.StateActive, e.State)
	require.Equal(t, "Weather now for a city.", e.Definition.Description, "the draft's last definition is what was published")
	require.True(t, strings.HasPrefix(e.UpdatedBy, "cli"), e.UpdatedBy)
	h, err := reg.History(t.Context(), e.Definition.Ref())
	require.NoError(t, err)
	require.Equal(t, []registry.State{registry.StateDraft, registry.StateDraft, registry.StateActive}, []registry.State{h[0].State, h[1].State, h[2].State})

	// Published: fixed, and never a draft again.
	out, err = cli(t, env.URL, "", "tools", "publish", "weather@1.0.0")
	require.ErrorIs(t, err, registry.ErrNotDraft)
	require.ErrorContains(t, err, "it is active")
	_, err = cli(t, env.URL, "", "tools", "register", "--draft", file)
	require.NoError(t, err, "the same definition: nothing changes")
	require.NoError(t, os.WriteFile(file, []byte(weatherYAML), 0o600))
	_, err = cli(t, env.URL, "", "tools", "register", "--draft", file)
	require.ErrorIs(t, err, registry.ErrConflict, "a published version's definition is fixed")
	require.ErrorContains(t, reg.SetState(t.Context(), e.Definition.Ref(), registry.StateDraft), "never becomes a draft again")
	out, err = cli(t, env.URL, "", "validate", agent)
	require.NoError(t, err, out)
	require.NotContains(t, out, "draft", "published: it runs")
}

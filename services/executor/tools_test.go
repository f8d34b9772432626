package executor

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
	"github.com/toolwire/toolwire/services/executor/tools/mcp/mcptest"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// The tool families through the executor: web, http and MCP tools as the
// executor registers, configures and runs them; packages web, httptool and
// mcp test the tools themselves.

func newServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// definitionOf is the definition of the executor's tool name.
func definitionOf(t *testing.T, s *Service, name string) envelope.ToolDefinition {
	t.Helper()
	for _, def := range s.Definitions() {
		if def.Name == name {
			return def
		}
	}
	t.Fatalf("the executor has no tool %s", name)
	return envelope.ToolDefinition{}
}

func input(v map[string]any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestWebToolsThroughTheExecutor runs the web tools as the executor does:
// registered at start, the allow-list read from the environment, a refusal
// as a POLICY_DENIED envelope, the tool's timeout as TIMEOUT.
func TestWebToolsThroughTheExecutor(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-block:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"items":[{"name":"a","price":3},{"name":"b","price":30}]}`)
	})
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	d := testDeps(t, env, nil)
	d.Getenv = servicetest.Getenv(map[string]string{web.EnvAllowHosts: srv.Listener.Addr().String()})
	s, err := std.build(d, WithTools(testtools.Tools()...), func(c *Config) { c.Concurrency, c.ID = 4, "executor-web" })
	require.NoError(t, err)
	startStopping(t, s)
	names := map[string]envelope.SideEffects{}
	for _, def := range s.Definitions() {
		names[def.Name] = def.Metadata.SideEffects
	}
	require.Equal(t, envelope.SideEffectsWrites, names["http_request"])
	require.Equal(t, envelope.SideEffectsReads, names["http_get"])
	require.Equal(t, envelope.SideEffectsReads, names["web_fetch"])
	require.Equal(t, envelope.SideEffectsNone, names["json_query"])

	reg := openRegistry(t, env.JS)
	putEntry(t, reg, definitionOf(t, s, "http_get"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Version, d.TimeoutMS = "1.0.1-fast", 200
	})

	const runID = "run-web"
	w := watchRun(t, env.JS, runID)
	pub := publish.NewPublisher(env.JS)
	ok := callRequest(t, runID, 1, "http_get", "1.0.0", input(map[string]any{"url": srv.URL + "/items"}))
	denied := callRequest(t, runID, 2, "http_request", "1.0.0", input(map[string]any{"method": "POST", "url": "http://169.254.169.254/latest/api/token"}))
	slow := callRequest(t, runID, 3, "http_get", "1.0.1-fast", input(map[string]any{"url": srv.URL + "/slow"}))
	query := callRequest(t, runID, 4, "json_query", "1.0.0", `{"query":"[.items[] | select(.price < 10) | .name]","input":{"items":[{"name":"a","price":3},{"name":"b","price":30}]}}`)
	for _, r := range []events.CallRequest{ok, denied, slow, query} {
		publishApproved(t, pub, r)
	}

	e := w.envelopeOf(t, schemas, ok)
	require.Nil(t, e.Error)
	require.EqualValues(t, 200, mustMap(t, e.Output)["status"])

	e = w.envelopeOf(t, schemas, denied)
	require.NotNil(t, e.Error)
	require.Equal(t, envelope.CodePolicyDenied, e.Error.Code)
	require.Equal(t, "http_request: destination 169.254.169.254 is the cloud metadata address: refused (allow it with TOOLWIRE_HTTP_ALLOW_HOSTS)", e.Error.Message)

	e = w.envelopeOf(t, schemas, slow)
	require.NotNil(t, e.Error)
	require.Equal(t, envelope.CodeTimeout, e.Error.Code, e.Error.Message)

	e = w.envelopeOf(t, schemas, query)
	require.Nil(t, e.Error)
	require.JSONEq(t, `{"result":[["a"]]}`, string(e.Output))
}

// TestWebConfigRejected: a bad setting stops the executor from starting,
// with a message that names it.
func TestWebConfigRejected(t *testing.T) {
	env := eventstest.Start(t)
	d := testDeps(t, env, nil)
	d.Getenv = servicetest.Getenv(map[string]string{web.EnvAllowHosts: "ok.example, http://bad.example/"})
	_, err := std.build(d)
	require.ErrorContains(t, err, `TOOLWIRE_HTTP_ALLOW_HOSTS="ok.example, http://bad.example/": allow-list entry "http://bad.example/"`)

	_, err = std.build(testDeps(t, env, nil), std.withWeb(web.Config{MaxRedirects: 99}))
	require.ErrorContains(t, err, "max redirects 99")

	// The option wins over the environment.
	d.Getenv = servicetest.Getenv(map[string]string{web.EnvAllowHosts: "ok.example"})
	s, err := std.build(d, std.withWeb(web.Config{AllowHosts: []string{"127.0.0.1:9"}}))
	require.NoError(t, err)
	require.Equal(t, []string{"127.0.0.1:9"}, std.webOf(s).AllowHosts)
	require.NoError(t, err)
	require.NoError(t, s.Stop(t.Context()))
}

// TestHTTPSecretsFromTheSecretsService: an operator registers a version of
// http_get that may send GITHUB_TOKEN to one server; the executor resolves
// it from the secrets bucket, the server receives it, and it appears nowhere
// in the envelope. A call that asks for it to go to another server is
// refused with POLICY_DENIED, and that server receives nothing. The plain
// http_get declares no secret and gets none.
func TestHTTPSecretsFromTheSecretsService(t *testing.T) {
	const token = "ghp-canary-5d1e7a"
	got := make(chan string, 4)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"you_sent": r.Header.Get("Authorization")})
	})
	stolen := make(chan string, 4)
	elsewhere := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		stolen <- r.Header.Get("Authorization")
	})
	env := eventstest.Start(t)
	keys := testKeyring(t)
	s := startExecutor(t, env, Config{}, WithKeyring(keys), std.withWeb(web.Config{AllowHosts: []string{srv.Listener.Addr().String(), elsewhere.Listener.Addr().String()}}))
	store, err := secrets.Open(t.Context(), env.JS, keys)
	require.NoError(t, err)
	require.NoError(t, store.Set(t.Context(), secrets.OrgScope("acme"), "GITHUB_TOKEN", []byte(token)))
	reg := openRegistry(t, env.JS)
	putEntry(t, reg, definitionOf(t, s, "http_get"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Version, d.RequiredSecrets = "1.0.0-github", []string{"GITHUB_TOKEN"}
		d.SecretDestinations = map[string]envelope.SecretBinding{
			"GITHUB_TOKEN": {Hosts: []string{srv.URL}, Headers: []string{"Authorization"}},
		}
	})
	schemas := newEventSchemas(t)

	in := input(map[string]any{"url": srv.URL + "/user", "secret_headers": map[string]any{"Authorization": "Bearer {{secret:GITHUB_TOKEN}}"}})
	withSecret := callRequest(t, "run-http-secrets", 1, "http_get", "1.0.0-github", in)
	without := callRequest(t, "run-http-secrets", 2, "http_get", "1.0.0", in)
	w := watchRun(t, env.JS, withSecret.RunID)
	pub := publish.NewPublisher(env.JS)
	publishApproved(t, pub, withSecret)
	e := w.envelopeOf(t, schemas, withSecret)
	require.Nil(t, e.Error)
	require.Equal(t, "Bearer "+token, <-got, "the server received the secret")
	require.JSONEq(t, `{"you_sent":"Bearer [REDACTED]"}`, mustJSON(mustMap(t, e.Output)["body"]))
	raw := w.wait(t, completedSubject(t, withSecret)).Data()
	require.NotContains(t, string(raw), token, "the secret is nowhere in the completed event")

	publishApproved(t, pub, without)
	e = w.envelopeOf(t, schemas, without)
	require.NotNil(t, e.Error)
	require.Equal(t, envelope.CodeAuthRequired, e.Error.Code)
	require.Contains(t, e.Error.Message, `secret "GITHUB_TOKEN" is not available to this tool: list it in the tool's required_secrets`)
	require.Zero(t, len(got), "nothing was sent without the secret")

	// The model asks for the secret to go elsewhere: refused, nothing sent.
	away := callRequest(t, "run-http-secrets", 3, "http_get", "1.0.0-github",
		input(map[string]any{"url": elsewhere.URL + "/collect", "secret_headers": map[string]any{"Authorization": "Bearer {{secret:GITHUB_TOKEN}}"}}))
	publishApproved(t, pub, away)
	e = w.envelopeOf(t, schemas, away)
	require.NotNil(t, e.Error)
	require.Equal(t, envelope.CodePolicyDenied, e.Error.Code)
	require.Equal(t, "http_get: secret GITHUB_TOKEN may not be sent to "+elsewhere.URL+" (header Authorization): it may go only to "+srv.URL+" (header Authorization)", e.Error.Message)
	require.Zero(t, len(stolen), "the other server received nothing")
	require.NotContains(t, string(w.wait(t, completedSubject(t, away)).Data()), token)
}

func mustMap(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	return m
}

// httpDef is a registry entry of kind http: name@1.0.0 with config and
// secrets, an input schema that wants a city, and an output schema that
// wants temp_c.
func httpDef(name string, side envelope.SideEffects, config string, secrets ...string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: name, Version: "1.0.0", Description: "an HTTP endpoint",
		InputSchema:     json.RawMessage(`{"type":"object","required":["city"],"properties":{"city":{"type":"string"}}}`),
		OutputSchema:    json.RawMessage(`{"type":"object","required":["temp_c"],"properties":{"temp_c":{"type":"number"}}}`),
		Metadata:        envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: side, Cache: envelope.CacheNone},
		Implementation:  envelope.Implementation{Kind: envelope.ImplHTTP, Config: json.RawMessage(config)},
		RequiredSecrets: secrets,
	}
}

// TestHTTPToolsThroughTheExecutor runs registered http tools as the default
// queue's executors run them: the secrets resolved from the store sent as
// headers (and scrubbed from what comes back), the idempotency key on a
// writes tool, the tool's timeout, the output schema, the status mapping,
// the guard's allow-list from the executor's web configuration.
func TestHTTPToolsThroughTheExecutor(t *testing.T) {
	type seen struct {
		path, body, auth, idem string
	}
	var (
		mu    sync.Mutex
		calls []seen
	)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, seen{r.URL.Path, string(b), r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key")})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/weather":
			// Echoes the key it got: the envelope must not show it.
			_, _ = io.WriteString(w, `{"temp_c":21.5,"echo":`+mustJSON(r.Header.Get("Authorization"))+`}`)
		case "/send":
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"temp_c":0,"sent":true}`)
		case "/slow":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/warm":
			_, _ = io.WriteString(w, `{"temp_c":"warm"}`)
		case "/text":
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, `sunny`)
		case "/refuse":
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"error":"unknown city"}`)
		case "/down":
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	other := newServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"temp_c":1}`) })

	env := eventstest.Start(t)
	keys := testKeyring(t)
	startExecutor(t, env, Config{ID: "executor-http"},
		std.withWeb(web.Config{AllowHosts: []string{srv.Listener.Addr().String()}}), WithKeyring(keys))
	store, err := secrets.Open(t.Context(), env.JS, keys)
	require.NoError(t, err)
	require.NoError(t, store.Set(t.Context(), secrets.WorkspaceScope("acme", "ws"), "WEATHER_KEY", []byte(canaryValue)))

	reg := openRegistry(t, env.JS)
	for _, def := range []envelope.ToolDefinition{
		httpDef("weather", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/weather","secret_headers":{"Authorization":"Bearer {{secret:WEATHER_KEY}}"}}`, "WEATHER_KEY"),
		httpDef("send", envelope.SideEffectsWrites, `{"url":"`+srv.URL+`/send"}`),
		func() envelope.ToolDefinition {
			d := httpDef("slow", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/slow"}`)
			d.TimeoutMS = 100
			return d
		}(),
		httpDef("warm", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/warm"}`),
		httpDef("text", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/text"}`),
		httpDef("refuse", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/refuse"}`),
		httpDef("down", envelope.SideEffectsReads, `{"url":"`+srv.URL+`/down"}`),
		httpDef("elsewhere", envelope.SideEffectsReads, `{"url":"`+other.URL+`/"}`),
	} {
		created, err := reg.Register(t.Context(), def)
		require.NoError(t, err)
		require.True(t, created)
	}
	// An entry stored before configs were checked: its calls say why it
	// cannot run.
	kv, err := env.JS.KeyValue(t.Context(), provision.BucketTools)
	require.NoError(t, err)
	legacy := httpDef("legacy", envelope.SideEffectsReads, "")
	legacy.Implementation.Config = nil
	b, err := json.Marshal(registry.Entry{Definition: legacy, State: registry.StateActive, UpdatedAt: time.Now()})
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), registry.Key(legacy.Ref()), b)
	require.NoError(t, err)

	schemas := newEventSchemas(t)
	const runID = "run-http"
	w := watchRun(t, env.JS, runID)
	tests := []struct {
		tool, input string
		out         string
		code        envelope.ErrorCode
		msg         string
	}{
		{tool: "weather", input: `{"city":"Lyon"}`, out: `{"temp_c":21.5,"echo":"Bearer [REDACTED:WEATHER_KEY]"}`},
		{tool: "send", input: `{"city":"Lyon","text":"hi"}`, out: `{"temp_c":0,"sent":true}`},
		{tool: "slow", input: `{"city":"Lyon"}`, code: envelope.CodeTimeout, msg: "tool slow@1.0.0 timed out after 100ms"},
		{tool: "warm", input: `{"city":"Lyon"}`, code: envelope.CodeProviderError, msg: "output of tool warm@1.0.0 does not match its output schema"},
		{tool: "text", input: `{"city":"Lyon"}`, code: envelope.CodeProviderError, msg: "text@1.0.0: " + srv.Listener.Addr().String() + " answered a body that is not JSON (text/plain)"},
		{tool: "refuse", input: `{"city":"Atlantis"}`, code: envelope.CodeValidation, msg: "refuse@1.0.0: " + srv.Listener.Addr().String() + " refused the request: 422 Unprocessable Entity"},
		{tool: "down", input: `{"city":"Lyon"}`, code: envelope.CodeProviderError, msg: "answered 502 Bad Gateway"},
		{tool: "elsewhere", input: `{"city":"Lyon"}`, code: envelope.CodePolicyDenied, msg: "elsewhere@1.0.0: destination 127.0.0.1 is a loopback address: refused (allow it with TOOLWIRE_HTTP_ALLOW_HOSTS)"},
		{tool: "weather", input: `{"town":"Lyon"}`, code: envelope.CodeValidation, msg: "input for tool weather@1.0.0 does not match its input schema"},
		{tool: "legacy", input: `{"city":"Lyon"}`, code: envelope.CodeUnknown, msg: `tool legacy@1.0.0 cannot run: implementation.config: an http tool needs {"url": ...}`},
	}
	reqs := make([]events.CallRequest, len(tests))
	for i, tc := range tests {
		reqs[i] = callRequest(t, runID, i+1, tc.tool, "1.0.0", tc.input)
	}
	publishAllApproved(t, env.JetStream(t), reqs)
	for i, tc := range tests {
		t.Run(tc.tool+"/"+tc.input, func(t *testing.T) {
			got := w.envelopeOf(t, schemas, reqs[i])
			if tc.code == "" {
				require.Nil(t, got.Error)
				require.JSONEq(t, tc.out, string(got.Output))
				return
			}
			require.NotNil(t, got.Error)
			require.Equal(t, tc.code, got.Error.Code, got.Error.Message)
			require.Contains(t, got.Error.Message, tc.msg)
		})
	}
	require.NotContains(t, string(w.wait(t, completedSubject(t, reqs[0])).Data()), canaryValue)

	mu.Lock()
	defer mu.Unlock()
	byPath := map[string]seen{}
	for _, c := range calls {
		byPath[c.path] = c
	}
	require.Equal(t, seen{"/weather", `{"city":"Lyon"}`, "Bearer " + canaryValue, ""}, byPath["/weather"], "the secret as a header; no key on a reads tool")
	require.Equal(t, seen{"/send", `{"city":"Lyon","text":"hi"}`, "", runID + "." + reqs[1].CallID}, byPath["/send"], "the run's call as the idempotency key")
	require.Len(t, calls, 7, "weather, send, slow, warm, text, refuse, down; nothing else: %v", calls)
}

// TestMCPTools registers a real MCP server (built with the SDK) over stdio
// and over streamable HTTP, and calls its tools through the executor.
func TestMCPTools(t *testing.T) {
	for _, transport := range []mcp.Transport{mcp.Stdio, mcp.HTTP} {
		t.Run(string(transport), func(t *testing.T) {
			var srv mcp.Server
			if transport == mcp.Stdio {
				srv = mcptest.Stdio(t, "calc")
			} else {
				srv = mcptest.HTTP(t, "calc")
			}
			env := eventstest.Start(t)
			schemas := newEventSchemas(t)
			reg := openRegistry(t, env.JS)

			r, err := mcp.RegisterServer(t.Context(), reg, srv, mcp.RegisterOptions{Version: "2.0.0", TimeoutMS: 1000})
			require.NoError(t, err)
			require.Empty(t, r.Skipped)
			var names []string
			for _, d := range r.Tools {
				names = append(names, d.Ref().String())
			}
			require.Equal(t, []string{"calc_add@2.0.0", "calc_crash@2.0.0", "calc_fail@2.0.0", "calc_greet@2.0.0", "calc_hang@2.0.0", "calc_math_pi@2.0.0"}, names)

			// The registry holds them with their schemas and implementation.
			add, err := reg.Get(t.Context(), envelope.ToolRef{Name: "calc_add", Version: "2.0.0"})
			require.NoError(t, err)
			require.Equal(t, registry.StateActive, add.State)
			require.Equal(t, "Adds two numbers.", add.Definition.Description)
			require.Equal(t, envelope.SideEffectsWrites, add.Definition.Metadata.SideEffects, "no readOnlyHint: writes")
			require.Equal(t, envelope.CategoryAPI, add.Definition.Metadata.Category)
			require.Equal(t, 1000, add.Definition.TimeoutMS)
			var in map[string]any
			require.NoError(t, json.Unmarshal(add.Definition.InputSchema, &in))
			require.Equal(t, "object", in["type"])
			require.ElementsMatch(t, []any{"a", "b"}, in["required"])
			require.Contains(t, string(add.Definition.OutputSchema), `"sum"`)
			require.Equal(t, envelope.ImplMCP, add.Definition.Implementation.Kind)
			cfg, err := mcp.ParseConfig(add.Definition.Implementation.Config)
			require.NoError(t, err)
			require.Equal(t, mcp.Config{Server: "calc", Transport: transport, Command: srv.Command, Args: srv.Args, URL: srv.URL, Tool: "add"}, cfg)
			greet, err := reg.Get(t.Context(), envelope.ToolRef{Name: "calc_greet", Version: "2.0.0"})
			require.NoError(t, err)
			require.Equal(t, envelope.SideEffectsReads, greet.Definition.Metadata.SideEffects, "readOnlyHint: reads")
			require.Empty(t, greet.Definition.OutputSchema)
			pi, err := reg.Get(t.Context(), envelope.ToolRef{Name: "calc_math_pi", Version: "2.0.0"})
			require.NoError(t, err)
			require.Contains(t, string(pi.Definition.Implementation.Config), `"tool":"math.pi"`)

			// A stale entry: the server has no such tool.
			stale := add.Definition
			stale.Name = "calc_gone"
			cfg.Tool = "gone"
			stale.Implementation = mcp.Implementation(cfg)
			require.NoError(t, reg.Put(t.Context(), registry.Entry{Definition: stale}))

			startExecutor(t, env, Config{Concurrency: 8, ID: "executor-mcp"})
			runID := "run-mcp-" + string(transport)
			w := watchRun(t, env.JS, runID)
			pub := publish.NewPublisher(env.JS)
			calls := map[string]events.CallRequest{
				"add":       callRequest(t, runID, 1, "calc_add", "2.0.0", `{"a":2,"b":3}`),
				"greet":     callRequest(t, runID, 2, "calc_greet", "2.0.0", `{"name":"Ada"}`),
				"fail":      callRequest(t, runID, 3, "calc_fail", "2.0.0", `{"reason":"on purpose"}`),
				"bad input": callRequest(t, runID, 4, "calc_add", "2.0.0", `{"a":"two"}`),
				"pi":        callRequest(t, runID, 5, "calc_math_pi", "2.0.0", `{}`),
				"hang":      callRequest(t, runID, 6, "calc_hang", "2.0.0", `{}`),
				"gone":      callRequest(t, runID, 7, "calc_gone", "2.0.0", `{"a":1,"b":1}`),
			}
			for _, c := range calls {
				publishApproved(t, pub, c)
			}
			e := w.envelopeOf(t, schemas, calls["add"])
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"sum":5}`, string(e.Output), "structured content is the output")

			e = w.envelopeOf(t, schemas, calls["greet"])
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"content":[{"type":"text","text":"Hello, Ada!"}]}`, string(e.Output), "text content")

			e = w.envelopeOf(t, schemas, calls["fail"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeProviderError, e.Error.Code)
			require.Equal(t, "MCP server calc, tool fail: the tool failed: on purpose", e.Error.Message)

			e = w.envelopeOf(t, schemas, calls["bad input"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeValidation, e.Error.Code, "checked against the MCP tool's input schema before the call")

			e = w.envelopeOf(t, schemas, calls["pi"])
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"sum":3.14159}`, string(e.Output))

			e = w.envelopeOf(t, schemas, calls["hang"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeTimeout, e.Error.Code, "the tool's timeout_ms ends the call")

			e = w.envelopeOf(t, schemas, calls["gone"])
			require.NotNil(t, e.Error)
			require.Equal(t, envelope.CodeProviderError, e.Error.Code)
			require.Contains(t, e.Error.Message, `has no tool gone any more: unknown tool "gone" (register the server again)`)

			// The session survives the calls: one more call after the hang
			// still works on it.
			again := callRequest(t, runID, 8, "calc_add", "2.0.0", `{"a":10,"b":-4}`)
			publishApproved(t, pub, again)
			e = w.envelopeOf(t, schemas, again)
			require.Nil(t, e.Error)
			require.JSONEq(t, `{"sum":6}`, string(e.Output))
		})
	}
}

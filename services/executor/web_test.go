package executor

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/events/secrets"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// The web tools through the executor; package web tests the tools
// themselves.

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
	cfg, err := ConfigFromEnv(d.Getenv)
	require.NoError(t, err)
	cfg.Concurrency, cfg.ID = 4, "executor-web"
	s := startExecutorWith(t, d, cfg)
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
	pub := events.NewPublisher(env.JS)
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
	_, err := Build(d)
	require.ErrorContains(t, err, `TOOLWIRE_HTTP_ALLOW_HOSTS="ok.example, http://bad.example/": allow-list entry "http://bad.example/"`)

	_, err = Build(testDeps(t, env, nil), WithWebConfig(web.Config{MaxRedirects: 99}))
	require.ErrorContains(t, err, "max redirects 99")

	// The option wins over the environment.
	d.Getenv = servicetest.Getenv(map[string]string{web.EnvAllowHosts: "ok.example"})
	s, err := Build(d, WithWebConfig(web.Config{AllowHosts: []string{"127.0.0.1:9"}}))
	require.NoError(t, err)
	require.Equal(t, []string{"127.0.0.1:9"}, s.Config().Web.AllowHosts)
	require.NoError(t, err)
	require.NoError(t, s.Stop(t.Context()))
}

// TestHTTPSecretsFromTheSecretsService: an operator registers a version of
// http_get that may use GITHUB_TOKEN; the executor resolves it from the
// secrets bucket, the server receives it, and it appears nowhere in the
// envelope. The plain http_get declares no secret and gets none.
func TestHTTPSecretsFromTheSecretsService(t *testing.T) {
	const token = "ghp-canary-5d1e7a"
	got := make(chan string, 4)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"you_sent": r.Header.Get("Authorization")})
	})
	env := eventstest.Start(t)
	keys := testKeyring(t)
	s := startExecutor(t, env, Config{}, WithKeyring(keys), WithWebConfig(web.Config{AllowHosts: []string{srv.Listener.Addr().String()}}))
	store, err := secrets.Open(t.Context(), env.JS, keys)
	require.NoError(t, err)
	require.NoError(t, store.Set(t.Context(), secrets.OrgScope("acme"), "GITHUB_TOKEN", []byte(token)))
	reg := openRegistry(t, env.JS)
	putEntry(t, reg, definitionOf(t, s, "http_get"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Version, d.RequiredSecrets = "1.0.0-github", []string{"GITHUB_TOKEN"}
	})
	schemas := newEventSchemas(t)

	in := input(map[string]any{"url": srv.URL + "/user", "secret_headers": map[string]any{"Authorization": "Bearer {{secret:GITHUB_TOKEN}}"}})
	withSecret := callRequest(t, "run-http-secrets", 1, "http_get", "1.0.0-github", in)
	without := callRequest(t, "run-http-secrets", 2, "http_get", "1.0.0", in)
	w := watchRun(t, env.JS, withSecret.RunID)
	pub := events.NewPublisher(env.JS)
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
}

func mustMap(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	return m
}

package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/services/executor/tools/web"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/stack"
)

// readmeHTTPTool is the docs' example of an http tool definition
// (docs/tools.md, "Your HTTP endpoint as a tool").
func readmeHTTPTool(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "tools.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "```yaml\n# weather.yaml")
	require.True(t, ok, "docs/tools.md shows an http tool (```yaml # weather.yaml)")
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	return "# weather.yaml" + block
}

// TestHTTPToolRun registers the docs' http tool with `toolwire tools
// register`, stores its secret with `toolwire secrets set`, checks an agent
// with `toolwire validate`, and runs a scripted agent through the whole
// pipeline that calls it against a loopback endpoint the executor is told to
// allow (TOOLWIRE_HTTP_ALLOW_HOSTS, as an operator would).
func TestHTTPToolRun(t *testing.T) {
	type request struct {
		body, auth, version string
	}
	var (
		mu   sync.Mutex
		seen []request
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, request{string(b), r.Header.Get("Authorization"), r.Header.Get("X-Api-Version")})
		mu.Unlock()
		var in struct{ City string }
		_ = json.Unmarshal(b, &in)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/v1/weather" || in.City != "Lyon" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"error":"unknown city `+in.City+`"}`)
			return
		}
		_, _ = io.WriteString(w, `{"temp_c":21.5,"sky":"clear"}`)
	}))
	t.Cleanup(srv.Close)

	const secretValue = "wk-5d1e-value"
	t.Setenv(secrets.EnvMasterKeys, "k1:"+base64.StdEncoding.EncodeToString([]byte(strings.Repeat("K", 32))))
	t.Setenv(secrets.EnvMasterKeyID, "")
	t.Setenv(web.EnvAllowHosts, srv.Listener.Addr().String())
	st, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Stop(context.Background())) })

	dir := t.TempDir()
	def := filepath.Join(dir, "weather.yaml")
	yml := readmeHTTPTool(t)
	require.Contains(t, yml, "https://api.example.com/v1/weather")
	require.NoError(t, os.WriteFile(def, []byte(strings.Replace(yml, "https://api.example.com", srv.URL, 1)), 0o600))
	out, err := cli(t, st.URL, "", "tools", "register", def)
	require.NoError(t, err, out)
	require.Equal(t, "registered weather@1.0.0 (active)\n", out)
	out, err = cli(t, st.URL, secretValue, "secrets", "set", "WEATHER_KEY", "--scope", "org", "--org", "acme")
	require.NoError(t, err, out)

	agent := `{"name":"forecaster","model":{"provider":"scripted","name":"m"},"enabled_tools":["weather@1.0.0"],"policy":{}}`
	agentFile := filepath.Join(dir, "agent.json")
	require.NoError(t, os.WriteFile(agentFile, []byte(agent), 0o600))
	out, err = cli(t, st.URL, "", "validate", agentFile)
	require.NoError(t, err, out)
	require.Equal(t, "ok: agent forecaster, 1 enabled tools\n", out)

	req := orchestratortest.Scripted(t, "run-http-tool", []string{"weather@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("weather", map[string]any{"city": "Lyon"}),
			orchestratortest.ToolCall("weather", map[string]any{"city": "Atlantis"}),
		}},
		map[string]any{"content": "Lyon: 21.5 °C; Atlantis is not a city the service knows."},
	)
	req.Tenant.OrgID, req.Agent.Name = "acme", "forecaster" // acme holds the secret
	final := runCompleted(t, st, req)
	outs := final.Outputs
	require.Equal(t, "Lyon: 21.5 °C; Atlantis is not a city the service knows.", outs.Response)
	require.Len(t, outs.ToolOrder, 2)
	lyon, atlantis := outs.ToolsByID[outs.ToolOrder[0]], outs.ToolsByID[outs.ToolOrder[1]]
	require.Nil(t, lyon.Error)
	require.JSONEq(t, `{"temp_c":21.5,"sky":"clear"}`, string(lyon.Output))
	require.NotNil(t, atlantis.Error)
	require.Equal(t, envelope.CodeValidation, atlantis.Error.Code)
	require.Equal(t, "weather@1.0.0: "+srv.Listener.Addr().String()+" refused the request: 422 Unprocessable Entity", atlantis.Error.Message)
	require.Equal(t, map[string]any{"status": float64(422), "body": `{"error":"unknown city Atlantis"}`}, atlantis.Error.Details)
	b, err := json.Marshal(final)
	require.NoError(t, err)
	require.NotContains(t, string(b), secretValue)

	mu.Lock()
	defer mu.Unlock()
	require.ElementsMatch(t, []request{
		{`{"city":"Lyon"}`, "Bearer " + secretValue, "2"},
		{`{"city":"Atlantis"}`, "Bearer " + secretValue, "2"},
	}, seen, "the inputs as sent, the secret as a header, the config's header")
}

package api_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/api/apitest"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
)

const adminToken = "test-admin-token"

type catalogHarness struct {
	t     *testing.T
	srv   *httptest.Server
	js    jetstream.JetStream
	reg   *registry.Registry
	store *secrets.Store
}

func newCatalogHarness(t *testing.T, token string) *catalogHarness {
	t.Helper()
	env := eventstest.Start(t)
	srv := httptest.NewServer(api.New(nil, api.Options{
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), JS: env.JS, AdminToken: token,
	}))
	t.Cleanup(srv.Close)
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)
	k, err := secrets.ParseKeyring("k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32)), "")
	require.NoError(t, err)
	store, err := secrets.Open(t.Context(), env.JS, k)
	require.NoError(t, err)
	return &catalogHarness{t: t, srv: srv, js: env.JS, reg: reg, store: store}
}

func (h *catalogHarness) do(method, path, token string, body string) (int, []byte) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.srv.URL+path, rd)
	require.NoError(h.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(h.t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	require.Equal(h.t, "application/json", resp.Header.Get("Content-Type"))
	// Every answer is as openapi.yaml documents it.
	check, err := http.NewRequestWithContext(h.t.Context(), method, h.srv.URL+path, nil)
	require.NoError(h.t, err)
	apitest.CheckResponse(h.t, check, resp.StatusCode, resp.Header, b)
	return resp.StatusCode, b
}

func catalogDef(name, version string, cat envelope.Category, secretNames ...string) envelope.ToolDefinition {
	// An http tool sends each of its secrets in a header.
	cfg := map[string]any{"url": "https://" + name + ".example/"}
	if len(secretNames) > 0 {
		headers := map[string]string{}
		for i, n := range secretNames {
			headers[fmt.Sprintf("X-Key-%d", i)] = "{{secret:" + n + "}}"
		}
		cfg["secret_headers"] = headers
	}
	config, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return envelope.ToolDefinition{
		Name: name, Version: version, Description: "The " + name + " tool",
		InputSchema:     json.RawMessage(`{"type":"object"}`),
		Metadata:        envelope.ToolMetadata{Category: cat, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		Implementation:  envelope.Implementation{Kind: envelope.ImplHTTP, Config: config},
		RequiredSecrets: secretNames,
		RequiredScopes:  []string{"web:read"},
	}
}

func (h *catalogHarness) catalog(query string) apitypes.CatalogJSON {
	h.t.Helper()
	status, b := h.do(http.MethodGet, "/v1/tools"+query, "", "")
	require.Equal(h.t, http.StatusOK, status, string(b))
	var c apitypes.CatalogJSON
	require.NoError(h.t, json.Unmarshal(b, &c))
	return c
}

func refs(c apitypes.CatalogJSON) []string {
	out := []string{}
	for _, t := range c.Tools {
		out = append(out, t.Ref)
	}
	return out
}

// onQueue routes d to a worker's queue.
func onQueue(d envelope.ToolDefinition, queue string) envelope.ToolDefinition {
	d.Queue = queue
	return d
}

func TestToolCatalog(t *testing.T) {
	h := newCatalogHarness(t, "")
	ctx := t.Context()
	for _, e := range []registry.Entry{
		{Definition: catalogDef("weather", "1.0.0", envelope.CategoryAPI, "WEATHER_KEY")},
		{Definition: catalogDef("weather", "0.9.0", envelope.CategoryAPI, "WEATHER_KEY"), State: registry.StateDeprecated},
		{Definition: catalogDef("crm_sync", "2.0.0", envelope.CategoryData, "CRM_KEY", "CRM_SECRET")},
		{Definition: catalogDef("web_search", "1.0.0", envelope.CategorySearch)},
		{Definition: catalogDef("rm_rf", "1.0.0", envelope.CategoryUtility), State: registry.StateBlocked},
		{Definition: onQueue(catalogDef("ocr", "1.0.0", envelope.CategoryData), "gpu")},
	} {
		require.NoError(t, h.reg.Put(ctx, e))
	}
	require.NoError(t, h.store.Set(ctx, secrets.OrgScope("acme"), "WEATHER_KEY", []byte("org-weather")))
	require.NoError(t, h.store.Set(ctx, secrets.UserScope("acme", "u1"), "CRM_KEY", []byte("user-crm")))
	require.NoError(t, h.store.Set(ctx, secrets.WorkspaceScope("acme", "ws1"), "CRM_SECRET", []byte("ws-crm")))

	// Deprecated hidden, blocked never listed.
	require.Equal(t, []string{"crm_sync@2.0.0", "ocr@1.0.0", "weather@1.0.0", "web_search@1.0.0"}, refs(h.catalog("")))
	require.Equal(t, []string{"crm_sync@2.0.0", "ocr@1.0.0", "weather@0.9.0", "weather@1.0.0", "web_search@1.0.0"},
		refs(h.catalog("?show_deprecated=true")))
	// The kind: a tool on a queue of its own is a worker's.
	require.Equal(t, []string{"ocr@1.0.0"}, refs(h.catalog("?kind=worker")))
	require.Equal(t, []string{"crm_sync@2.0.0", "weather@1.0.0", "web_search@1.0.0"}, refs(h.catalog("?kind=http")))
	require.Equal(t, []string{}, refs(h.catalog("?kind=mcp")))
	for _, tool := range h.catalog("").Tools {
		want := map[bool]string{true: "worker", false: "http"}[tool.Name == "ocr"]
		require.Equal(t, want, tool.Kind, tool.Ref)
		require.Equal(t, map[bool]string{true: "gpu", false: "default"}[tool.Name == "ocr"], tool.Queue, tool.Ref)
	}
	// The detail: schemas, cache, timeout, and the queue's live processes.
	require.NoError(t, registry.Beat(ctx, h.js, registry.Worker{Queue: "gpu", Instance: "i-1", ID: "gpu-host-1", Remote: true,
		StartedAt: time.Now(), TTL: time.Minute}, time.Now()))
	for _, tool := range h.catalog("?search=ocr").Tools {
		require.JSONEq(t, `{"type":"object"}`, string(tool.InputSchema), tool.Ref)
		require.Equal(t, envelope.CacheNone, tool.Cache)
		require.Positive(t, tool.TimeoutMS, "the default timeout when none is set")
		require.Len(t, tool.LiveWorkers, 1)
		require.Equal(t, "gpu-host-1", tool.LiveWorkers[0].ID)
		require.True(t, tool.LiveWorkers[0].Remote)
	}
	require.Empty(t, h.catalog("?search=web_search").Tools[0].LiveWorkers, "no executor beats in this test")

	// Health, from the executors' heartbeats: one executor's open circuit
	// of two is degraded; both open, unavailable until the first reopens.
	webSearch := func() apitypes.ToolHealthJSON { return h.catalog("?search=web_search").Tools[0].Health }
	require.Equal(t, apitypes.ToolHealthJSON{Status: apitypes.HealthHealthy}, webSearch())
	now := time.Now().UTC().Truncate(time.Millisecond)
	beat := func(instance string, until time.Duration, failures uint32) {
		w := registry.Worker{Queue: "default", Instance: instance, ID: "exec-" + instance, StartedAt: now, TTL: time.Minute}
		if failures > 0 {
			state := "half_open"
			if until > 0 {
				state = "open"
			}
			w.Health = []registry.ToolHealth{{Tool: "web_search@1.0.0", State: state, ConsecutiveFailures: failures,
				OpenUntil: now.Add(until), LastFailure: "PROVIDER_ERROR"}}
		}
		require.NoError(t, registry.Beat(ctx, h.js, w, now))
	}
	beat("e1", time.Minute, 5)
	beat("e2", 0, 0)
	got := webSearch()
	require.Equal(t, apitypes.HealthDegraded, got.Status)
	require.Equal(t, uint32(5), got.ConsecutiveFailures)
	require.Equal(t, "PROVIDER_ERROR", got.LastFailure)
	beat("e2", 30*time.Second, 3)
	got = webSearch()
	require.Equal(t, apitypes.HealthUnavailable, got.Status)
	require.NotNil(t, got.OpenUntil)
	require.True(t, got.OpenUntil.Equal(now.Add(30*time.Second)), "the first circuit to let a trial call through: %v", got.OpenUntil)
	require.Equal(t, apitypes.HealthHealthy, h.catalog("?search=weather").Tools[0].Health.Status)
	require.Equal(t, []string{"weather@1.0.0"}, refs(h.catalog("?search=WEATH")))
	require.Equal(t, []string{"weather@0.9.0", "weather@1.0.0"}, refs(h.catalog("?search=weather&show_deprecated=1")))
	require.Equal(t, []string{"crm_sync@2.0.0", "ocr@1.0.0"}, refs(h.catalog("?category=data")))
	require.Equal(t, []string{}, refs(h.catalog("?search=rm_rf&show_deprecated=true")))

	c := h.catalog("?org_id=acme&workspace_id=ws1&user_id=u1&show_deprecated=true")
	byRef := map[string]apitypes.CatalogToolJSON{}
	for _, tool := range c.Tools {
		byRef[tool.Ref] = tool
	}
	require.Equal(t, apitypes.AuthStatusJSON{Status: "ready", Scope: "workspace", Secrets: []apitypes.SecretStatusJSON{
		{Name: "CRM_KEY", Status: "ready", Scope: "user"}, {Name: "CRM_SECRET", Status: "ready", Scope: "workspace"},
	}}, byRef["crm_sync@2.0.0"].Auth)
	require.Equal(t, apitypes.AuthStatusJSON{Status: "ready", Scope: "org",
		Warning: "uses an org-scoped key: no user or workspace key is set",
		Secrets: []apitypes.SecretStatusJSON{{Name: "WEATHER_KEY", Status: "ready", Scope: "org"}}}, byRef["weather@1.0.0"].Auth)
	require.Equal(t, apitypes.AuthStatusJSON{Status: "none", Secrets: []apitypes.SecretStatusJSON{}}, byRef["web_search@1.0.0"].Auth)
	require.True(t, byRef["weather@0.9.0"].Deprecated)
	require.Equal(t, []string{"web:read"}, byRef["web_search@1.0.0"].RequiredScopes)
	require.Equal(t, envelope.CategorySearch, byRef["web_search@1.0.0"].Category)

	// Another user of the workspace lacks the user-scoped CRM key.
	c = h.catalog("?org_id=acme&workspace_id=ws1&user_id=u2&category=data")
	require.Equal(t, apitypes.AuthStatusJSON{Status: "missing", Secrets: []apitypes.SecretStatusJSON{
		{Name: "CRM_KEY", Status: "missing"}, {Name: "CRM_SECRET", Status: "ready", Scope: "workspace"},
	}}, c.Tools[0].Auth)
	// No tenant: unknown.
	c = h.catalog("?category=data")
	require.Equal(t, "unknown", c.Tools[0].Auth.Status)

	// The catalog never shows a value.
	_, raw := h.do(http.MethodGet, "/v1/tools?org_id=acme&workspace_id=ws1&user_id=u1&show_deprecated=true", "", "")
	for _, v := range []string{"org-weather", "user-crm", "ws-crm"} {
		require.NotContains(t, string(raw), v)
	}

	// A change is visible at once.
	require.NoError(t, h.reg.SetState(ctx, envelope.ToolRef{Name: "web_search", Version: "1.0.0"}, registry.StateDeprecated))
	require.Equal(t, []string{"crm_sync@2.0.0", "ocr@1.0.0", "weather@1.0.0"}, refs(h.catalog("")))

	for _, bad := range []struct{ query, msg string }{
		{"?category=email", `category \"email\" is not one of api, code, data, search, utility`},
		{"?show_deprecated=maybe", `show_deprecated \"maybe\" must be true or false`},
		{"?kind=lambda", `kind \"lambda\" is not one of builtin, http, mcp, sandbox, worker`},
		{"?user_id=u1", "workspace_id and user_id need an org_id"},
	} {
		status, b := h.do(http.MethodGet, "/v1/tools"+bad.query, "", "")
		require.Equal(t, http.StatusBadRequest, status)
		require.Contains(t, string(b), bad.msg)
		require.Contains(t, string(b), `"code":"invalid_parameter"`)
	}
	status, _ := h.do(http.MethodPost, "/v1/tools", "", "{}")
	require.Equal(t, http.StatusMethodNotAllowed, status)
}

func TestToolAdminAPI(t *testing.T) {
	h := newCatalogHarness(t, adminToken)
	def := catalogDef("weather", "1.0.0", envelope.CategoryAPI, "WEATHER_KEY")
	body, err := json.Marshal(def)
	require.NoError(t, err)

	// The token guards every admin route.
	for _, tok := range []string{"", "wrong"} {
		status, b := h.do(http.MethodPost, "/v1/admin/tools", tok, string(body))
		require.Equal(t, http.StatusUnauthorized, status)
		require.Contains(t, string(b), `"code":"unauthorized"`)
	}
	status, b := h.do(http.MethodPost, "/v1/admin/tools", adminToken, string(body))
	require.Equal(t, http.StatusCreated, status, string(b))
	require.JSONEq(t, `{"ref":"weather@1.0.0","created":true}`, string(b))
	status, b = h.do(http.MethodPost, "/v1/admin/tools", adminToken, string(body))
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"ref":"weather@1.0.0","created":false}`, string(b))

	changed := def
	changed.Description = "now with forecasts"
	cb, err := json.Marshal(changed)
	require.NoError(t, err)
	status, b = h.do(http.MethodPost, "/v1/admin/tools", adminToken, string(cb))
	require.Equal(t, http.StatusConflict, status)
	require.Contains(t, string(b), "register the change as a new version")
	changed.Version = "1.1.0"
	cb, err = json.Marshal(changed)
	require.NoError(t, err)
	status, _ = h.do(http.MethodPost, "/v1/admin/tools", adminToken, string(cb))
	require.Equal(t, http.StatusCreated, status)

	status, b = h.do(http.MethodPost, "/v1/admin/tools", adminToken, `{"name":"x","version":"1.0.0"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(b), `"code":"invalid_tool"`)

	// The registry holds what the API wrote.
	e, err := h.reg.Get(t.Context(), def.Ref())
	require.NoError(t, err)
	require.Equal(t, registry.StateActive, e.State)
	require.Equal(t, []string{"WEATHER_KEY"}, e.Definition.RequiredSecrets)

	status, b = h.do(http.MethodPut, "/v1/admin/tools/weather@1.0.0/state", adminToken, `{"state":"deprecated"}`)
	require.Equal(t, http.StatusOK, status, string(b))
	var got apitypes.AdminToolJSON
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, registry.StateDeprecated, got.State)
	require.Equal(t, "admin", got.UpdatedBy, "the change says who made it")
	e, err = h.reg.Get(t.Context(), def.Ref())
	require.NoError(t, err)
	require.Equal(t, registry.StateDeprecated, e.State)
	hist, err := h.reg.History(t.Context(), def.Ref())
	require.NoError(t, err)
	require.Equal(t, "admin", hist[0].UpdatedBy, "so does the registration")

	status, b = h.do(http.MethodGet, "/v1/admin/tools?state=deprecated", adminToken, "")
	require.Equal(t, http.StatusOK, status)
	var list apitypes.AdminToolsJSON
	require.NoError(t, json.Unmarshal(b, &list))
	require.Len(t, list.Tools, 1)
	require.Equal(t, "weather@1.0.0", list.Tools[0].Ref)

	status, b = h.do(http.MethodGet, "/v1/admin/tools/weather@1.1.0", adminToken, "")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, string(b), "now with forecasts")

	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{http.MethodPut, "/v1/admin/tools/weather@1.0.0/state", `{"state":"retired"}`, http.StatusBadRequest, "invalid_parameter"},
		{http.MethodPut, "/v1/admin/tools/weather@1.0.0/state", `{"state":"blocked","x":1}`, http.StatusBadRequest, "invalid_parameter"},
		{http.MethodPut, "/v1/admin/tools/ghost@1.0.0/state", `{"state":"blocked"}`, http.StatusNotFound, "tool_not_found"},
		{http.MethodPut, "/v1/admin/tools/weather/state", `{"state":"blocked"}`, http.StatusBadRequest, "invalid_parameter"},
		{http.MethodGet, "/v1/admin/tools/ghost@1.0.0", "", http.StatusNotFound, "tool_not_found"},
		{http.MethodGet, "/v1/admin/tools?state=gone", "", http.StatusBadRequest, "invalid_parameter"},
		{http.MethodDelete, "/v1/admin/tools/weather@1.0.0", "", http.StatusMethodNotAllowed, "method_not_allowed"},
		{http.MethodPost, "/v1/admin/tools/weather@1.0.0/state", `{}`, http.StatusMethodNotAllowed, "method_not_allowed"},
	} {
		status, b := h.do(tc.method, tc.path, adminToken, tc.body)
		require.Equal(t, tc.status, status, "%s %s: %s", tc.method, tc.path, b)
		require.Contains(t, string(b), `"code":"`+tc.code+`"`)
	}
}

func TestToolAdminAPIOff(t *testing.T) {
	h := newCatalogHarness(t, "")
	status, b := h.do(http.MethodGet, "/v1/admin/tools", "", "")
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, string(b), "the registry admin API is off: set TOOLWIRE_ADMIN_TOKEN")
	// A credential presented is checked even with authentication off: one
	// that nothing issued is refused as such.
	status, b = h.do(http.MethodGet, "/v1/admin/tools", "anything", "")
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, string(b), `"code":"unauthorized"`)
}

// TestToolDraftsAPI: a draft is the admins' only: not in the catalog, not
// executable; registered again it is replaced; publish makes it active and
// listed, once; a published version never becomes a draft again.
func TestToolDraftsAPI(t *testing.T) {
	h := newCatalogHarness(t, adminToken)
	def := catalogDef("forecast", "1.0.0", envelope.CategoryAPI)
	body, err := json.Marshal(def)
	require.NoError(t, err)
	status, b := h.do(http.MethodPost, "/v1/admin/tools?draft=maybe", adminToken, string(body))
	require.Equal(t, http.StatusBadRequest, status, string(b))
	status, b = h.do(http.MethodPost, "/v1/admin/tools?draft=true", adminToken, string(body))
	require.Equal(t, http.StatusCreated, status, string(b))
	listed := func() bool {
		status, b := h.do(http.MethodGet, "/v1/tools?search=forecast&show_deprecated=true", "", "")
		require.Equal(t, http.StatusOK, status, string(b))
		return strings.Contains(string(b), "forecast@1.0.0")
	}
	require.False(t, listed(), "a draft is not in the catalog")
	status, b = h.do(http.MethodGet, "/v1/admin/tools?state=draft", adminToken, "")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, string(b), "forecast@1.0.0")

	changed := def
	changed.Description = "reviewed"
	cb, err := json.Marshal(changed)
	require.NoError(t, err)
	status, b = h.do(http.MethodPost, "/v1/admin/tools?draft=true", adminToken, string(cb))
	require.Equal(t, http.StatusOK, status, "a draft is replaced: %s", b)

	status, b = h.do(http.MethodPost, "/v1/admin/tools/forecast@1.0.0/publish", adminToken, "")
	require.Equal(t, http.StatusOK, status, string(b))
	var got apitypes.AdminToolJSON
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, registry.StateActive, got.State)
	require.Equal(t, "admin", got.UpdatedBy)
	require.Equal(t, "reviewed", got.Definition.Description)
	require.True(t, listed())

	status, b = h.do(http.MethodPost, "/v1/admin/tools/forecast@1.0.0/publish", adminToken, "")
	require.Equal(t, http.StatusConflict, status)
	require.Contains(t, string(b), "not a draft")
	status, b = h.do(http.MethodPut, "/v1/admin/tools/forecast@1.0.0/state", adminToken, `{"state":"draft"}`)
	require.Equal(t, http.StatusConflict, status)
	require.Contains(t, string(b), "never becomes a draft again")
	status, _ = h.do(http.MethodPost, "/v1/admin/tools/ghost@1.0.0/publish", adminToken, "")
	require.Equal(t, http.StatusNotFound, status)
}

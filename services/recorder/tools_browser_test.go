package recorder_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// pageTool is a registry entry for the tools page: an HTTP tool that sends
// each of its secrets in a header, on queue when one is given.
func pageTool(t *testing.T, name, version string, cat envelope.Category, queue string, secretNames ...string) envelope.ToolDefinition {
	t.Helper()
	cfg := map[string]any{"url": "https://" + strings.ReplaceAll(name, "_", "-") + ".example/"}
	if len(secretNames) > 0 {
		headers := map[string]string{}
		for i, n := range secretNames {
			headers[fmt.Sprintf("X-Key-%d", i)] = "{{secret:" + n + "}}"
		}
		cfg["secret_headers"] = headers
	}
	config, err := json.Marshal(cfg)
	require.NoError(t, err)
	return envelope.ToolDefinition{
		Name: name, Version: version, Description: "the " + strings.ReplaceAll(name, "_", " ") + " tool",
		InputSchema:     json.RawMessage(`{"type":"object"}`),
		Metadata:        envelope.ToolMetadata{Category: cat, SideEffects: envelope.SideEffectsReads, Cache: envelope.CacheNone},
		Implementation:  envelope.Implementation{Kind: envelope.ImplHTTP, Config: config},
		RequiredSecrets: secretNames, Queue: queue,
	}
}

// TestToolsPageInBrowser: a producer of tenant A signs in and opens the
// tools page: the active versions are listed (a deprecated one only once
// "Show deprecated" is checked, then with its warning; a blocked one
// never); typing into the search and choosing a category narrow the list;
// the kind cards count each kind and a click shows that kind alone; a tool
// whose key is set nowhere shows "Missing API Key", and once the key is set
// at the workspace's scope it shows "Ready" and "Using Workspace Key"; for
// tenant B it is still missing, and B may not ask about A's keys.
func TestToolsPageInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	w := newWritesEnv(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 90*time.Second)
	defer cancel()
	reg, err := registry.Open(ctx, w.env.JS)
	require.NoError(t, err)
	for _, e := range []registry.Entry{
		{Definition: pageTool(t, "weather", "1.0.0", envelope.CategoryAPI, "", "WEATHER_KEY")},
		{Definition: pageTool(t, "weather", "0.9.0", envelope.CategoryAPI, "", "WEATHER_KEY"), State: registry.StateDeprecated},
		{Definition: pageTool(t, "web_search", "1.0.0", envelope.CategorySearch, "")},
		{Definition: pageTool(t, "ocr", "1.0.0", envelope.CategoryData, "gpu")},
		{Definition: pageTool(t, "rm_rf", "1.0.0", envelope.CategoryUtility, ""), State: registry.StateBlocked},
	} {
		require.NoError(t, reg.Put(ctx, e))
	}

	require.NoError(t, registry.Beat(ctx, w.env.JS, registry.Worker{Queue: "gpu", Instance: "i-1", ID: "gpu-host-1", Remote: true,
		StartedAt: time.Now(), TTL: time.Minute}, time.Now()))
	// An executor whose circuit of web_search is open.
	require.NoError(t, registry.Beat(ctx, w.env.JS, registry.Worker{Queue: "default", Instance: "e-1", ID: "exec-1",
		StartedAt: time.Now(), TTL: time.Minute, Health: []registry.ToolHealth{{Tool: "web_search@1.0.0", State: "open",
			ConsecutiveFailures: 5, OpenUntil: time.Now().Add(time.Minute), LastFailure: "PROVIDER_ERROR"}}}, time.Now()))

	bctx := browsertest.Start(t, ctx, bin)
	page := browsertest.NewPage(t, bctx)
	listed := func() string {
		return page.Eval(`[...document.querySelectorAll(".tool-item")].map(e => e.dataset.ref).join(" ")`)
	}
	signIn(page, w, "producer A", "/tools", `.tool-list`)
	require.Equal(t, "ocr@1.0.0 weather@1.0.0 web_search@1.0.0", listed(), "active versions only")
	require.Equal(t, "Missing API Key", page.Text(`[data-ref="weather@1.0.0"] .badge.auth`))
	require.Equal(t, "No key needed", page.Text(`[data-ref="web_search@1.0.0"] .badge.auth`))
	require.Equal(t, "Unavailable", page.Text(`[data-ref="web_search@1.0.0"] .badge.health`), "the one executor's circuit is open")
	require.Equal(t, "Healthy", page.Text(`[data-ref="weather@1.0.0"] .badge.health`))
	require.Equal(t, "1", page.Text(`.kind-card[data-kind="worker"] .kind-count`))
	require.Equal(t, "2", page.Text(`.kind-card[data-kind="http"] .kind-count`), "weather and web_search; ocr is on a worker's queue")
	require.Equal(t, "0", page.Text(`.kind-card[data-kind="mcp"] .kind-count`))

	page.Do("type into the search",
		chromedp.SendKeys(chromedp.CSS(`#tool-search`), "weath"),
		chromedp.Submit(chromedp.CSS(`#tool-search`)),
		chromedp.WaitVisible(chromedp.CSS(`.tool-list`)),
	)
	page.Until("the search narrows the list", `[...document.querySelectorAll(".tool-item")].map(e => e.dataset.ref).join(" ") === "weather@1.0.0"`, 10*time.Second)

	page.Do("clear the search and choose a category",
		chromedp.WaitReady(chromedp.CSS(`#tool-category`)),
		chromedp.Clear(chromedp.CSS(`#tool-search`)),
		chromedp.SetValue(chromedp.CSS(`#tool-category`), "search"),
		chromedp.Click(chromedp.CSS(`form.filters button`)),
		chromedp.WaitVisible(chromedp.CSS(`.tool-list`)),
	)
	page.Until("the category narrows the list", `[...document.querySelectorAll(".tool-item")].map(e => e.dataset.ref).join(" ") === "web_search@1.0.0"`, 10*time.Second)

	page.Do("show every category, deprecated too",
		chromedp.SetValue(chromedp.CSS(`#tool-category`), ""),
		chromedp.Click(chromedp.CSS(`#tool-deprecated`)),
		chromedp.Click(chromedp.CSS(`form.filters button`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-ref="weather@0.9.0"]`)),
	)
	require.Equal(t, "ocr@1.0.0 weather@0.9.0 weather@1.0.0 web_search@1.0.0", listed(), "the deprecated version, never the blocked one")
	require.Contains(t, page.Text(`[data-ref="weather@0.9.0"] .tool-head`), "deprecated")
	require.NotContains(t, page.Text(`[data-ref="weather@1.0.0"] .tool-head`), "deprecated")

	page.Do("open the worker queue's card",
		chromedp.Click(chromedp.CSS(`.kind-card[data-kind="worker"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.kind-card.selected`)),
	)
	require.Equal(t, "ocr@1.0.0", listed())
	require.Contains(t, page.Text(`[data-ref="ocr@1.0.0"] .tool-head`), "Worker queue")
	page.Do("open its details", chromedp.Click(chromedp.CSS(`[data-ref="ocr@1.0.0"] summary`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-ref="ocr@1.0.0"] .input-schema`)))
	require.Equal(t, "1 live: gpu-host-1 (worker)", page.Text(`[data-ref="ocr@1.0.0"] .live-workers`))
	require.Contains(t, page.Text(`[data-ref="ocr@1.0.0"] .input-schema`), `"type": "object"`)

	k, err := secrets.ParseKeyring("k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32)), "")
	require.NoError(t, err)
	store, err := secrets.Open(ctx, w.env.JS, k)
	require.NoError(t, err)
	require.NoError(t, store.Set(ctx, secrets.WorkspaceScope(storetest.TenantA.OrgID, storetest.TenantA.WorkspaceID), "WEATHER_KEY", []byte("wk-secret-value")))
	page.Do("look again once the workspace's key is set",
		chromedp.Navigate(w.srv.URL+"/tools?search=weather"),
		chromedp.WaitVisible(chromedp.CSS(`.tool-list`)),
	)
	require.Equal(t, "Ready", page.Text(`[data-ref="weather@1.0.0"] .badge.auth`))
	require.Equal(t, "Using Workspace Key", page.Text(`[data-ref="weather@1.0.0"] .auth-scope`))
	require.NotContains(t, page.Eval(`document.body.innerHTML`), "wk-secret-value", "a key's value never reaches the page")

	if os.Getenv("TOOLWIRE_UPDATE_DOCS") != "" {
		page.Do("the page for the docs", chromedp.Navigate(w.srv.URL+"/tools?show_deprecated=true"), chromedp.WaitVisible(chromedp.CSS(`.tool-list`)))
		page.Screenshot(filepath.Join("..", "..", "docs", "images", "tools-page.png"))
	}

	// Another tenant: its own key status (A's key is A's), and no asking
	// about A's.
	signOut(page)
	signIn(page, w, "producer B", "/tools?search=weather", `.tool-list`)
	require.Equal(t, "Missing API Key", page.Text(`[data-ref="weather@1.0.0"] .badge.auth`), "tenant A's key is not tenant B's")
	page.Do("ask about tenant A's keys", chromedp.Navigate(w.srv.URL+"/tools?org_id="+storetest.TenantA.OrgID), chromedp.WaitVisible(chromedp.CSS(`main`)))
	require.Contains(t, page.Text(`main`), "no tenant "+storetest.TenantA.OrgID)
	require.Equal(t, "0", page.Eval(`String(document.querySelectorAll(".tool-item").length)`))
}

// signIn signs who in on the login page, which then opens next; waitFor is
// what that page shows once it is there.
func signIn(page browsertest.Page, w *writesEnv, who, next, waitFor string) {
	tok := w.tok[who]
	if who == "admin" {
		tok = w.admin
	}
	page.Do("sign in as "+who,
		chromedp.Navigate(w.srv.URL+"/login?next="+url.QueryEscape(next)),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SetValue(chromedp.CSS(`#token`), tok),
		chromedp.Click(chromedp.CSS(`.login-form button`)),
		chromedp.WaitVisible(chromedp.CSS(waitFor)),
	)
}

// signOut ends the session with the page's Sign out button.
func signOut(page browsertest.Page) {
	page.Do("sign out", chromedp.Click(chromedp.CSS(`form.logout button`)))
	page.Until("signed out", `location.pathname === "/login" && !document.querySelector("form.logout")`, 10*time.Second)
}

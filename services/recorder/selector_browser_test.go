package recorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
)

// hostPage serves a host's page (a workflow editor, on an origin of its
// own) that embeds the tool selector from the recorder at api, with token,
// and shows each selection event's detail in #out.
func hostPage(t *testing.T, api, token string) *httptest.Server {
	t.Helper()
	page := fmt.Sprintf(`<!doctype html><html><head><meta charset="utf-8"><title>editor</title>
<script type="module" src="%[1]s/assets/toolwire-tool-selector.js"></script></head><body>
<h1>A workflow editor</h1>
<toolwire-tool-selector api="%[1]s" token="%[2]s"></toolwire-tool-selector>
<pre id="out"></pre>
<script>document.addEventListener("toolwire-selection", (e) => { document.getElementById("out").textContent = JSON.stringify(e.detail); });</script>
</body></html>`, html.EscapeString(api), html.EscapeString(token))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestToolSelectorEmbeddedFromAnotherOrigin: a page of an origin the
// recorder lists (TOOLWIRE_RECORDER_CORS_ORIGINS) loads
// <toolwire-tool-selector> from the recorder and, with its own token, lists
// the tenant's tools by kind; a click chooses a tool, the pin icon pins its
// output, the strategy is chosen, and each change is emitted as a
// "toolwire-selection" event holding the agent's enabled_tools and
// pinned_handles (valid pins). A page of an origin not listed can neither
// load the module nor read the catalog, and no other route of the recorder
// answers the listed origin.
func TestToolSelectorEmbeddedFromAnotherOrigin(t *testing.T) {
	bin := browsertest.Chromium(t)
	// The host's origin must be known before the recorder starts: take a
	// listener's address first.
	allowed := httptest.NewUnstartedServer(nil)
	origin := "http://" + allowed.Listener.Addr().String()
	w := newWritesEnv(t, func(c *recorder.Config) { c.CORSOrigins = []string{origin} })
	ctx, cancel := context.WithTimeout(testCtx(t), 90*time.Second)
	defer cancel()
	reg, err := registry.Open(ctx, w.env.JS)
	require.NoError(t, err)
	for _, e := range []registry.Entry{
		{Definition: pageTool(t, "weather", "1.0.0", envelope.CategoryAPI, "", "WEATHER_KEY")},
		{Definition: pageTool(t, "web_search", "1.0.0", envelope.CategorySearch, "")},
		{Definition: pageTool(t, "ocr", "1.0.0", envelope.CategoryData, "gpu")},
	} {
		require.NoError(t, reg.Put(ctx, e))
	}
	host := hostPage(t, w.srv.URL, w.tok["viewer A"])
	allowed.Config = host.Config
	allowed.Start()
	t.Cleanup(allowed.Close)

	bctx := browsertest.Start(t, ctx, bin)
	page := browsertest.NewPage(t, bctx)
	shadow := func(sel string) string {
		q, _ := json.Marshal(sel)
		return fmt.Sprintf(`document.querySelector("toolwire-tool-selector").shadowRoot.querySelector(%s)`, q)
	}
	page.Do("open the host's page", chromedp.Navigate(allowed.URL))
	page.Until("the selector lists the tools", `!!document.querySelector("toolwire-tool-selector")?.shadowRoot?.querySelector("fieldset")`, 20*time.Second)
	require.Equal(t, "HTTP (2)", page.Eval(shadow(`fieldset[data-kind="http"] legend`)+`.textContent`))
	require.Equal(t, "Worker queue (1)", page.Eval(shadow(`fieldset[data-kind="worker"] legend`)+`.textContent`))
	require.Equal(t, "Missing API Key", page.Eval(shadow(`label[data-ref="weather@1.0.0"] .badge`)+`.textContent`))

	type selection struct {
		EnabledTools  []string                `json:"enabled_tools"`
		PinnedHandles []envelope.PinnedHandle `json:"pinned_handles"`
	}
	last := func() selection {
		var s selection
		require.NoError(t, json.Unmarshal([]byte(page.Eval(`document.getElementById("out").textContent`)), &s))
		return s
	}
	page.Do("choose web_search", chromedp.Click(chromedp.JSPath(shadow(`input[value="web_search@1.0.0"]`))))
	page.Until("the choice is emitted", `document.getElementById("out").textContent.includes("web_search@1.0.0")`, 10*time.Second)
	require.Equal(t, selection{EnabledTools: []string{"web_search@1.0.0"}, PinnedHandles: []envelope.PinnedHandle{}}, last())

	page.Do("pin weather's output", chromedp.Click(chromedp.JSPath(shadow(`label[data-ref="weather@1.0.0"] + .pin`))))
	page.Until("the pin is emitted", `document.getElementById("out").textContent.includes("pinned_handles\":[{")`, 10*time.Second)
	page.Do("pin its first success",
		chromedp.SetValue(chromedp.JSPath(shadow(`.pin-editor[data-ref="weather@1.0.0"] select[name=strategy]`)), "first_success"),
		chromedp.Evaluate[chromedp.Void](shadow(`.pin-editor[data-ref="weather@1.0.0"] select[name=strategy]`)+`.dispatchEvent(new Event("change"))`),
	)
	page.Until("the strategy is emitted", `document.getElementById("out").textContent.includes("first_success")`, 10*time.Second)
	got := last()
	require.Equal(t, []string{"weather@1.0.0", "web_search@1.0.0"}, got.EnabledTools, "a pinned tool is enabled")
	require.Len(t, got.PinnedHandles, 1)
	pin := got.PinnedHandles[0]
	require.Equal(t, envelope.PinnedHandle{Name: "weather", Selector: envelope.PinSelector{Tool: "weather", Strategy: envelope.PinFirstSuccess}, OnMissing: envelope.MissingNull}, pin)
	require.NoError(t, pin.Validate(), "the selector emits pins a run request takes")

	page.Do("clear all", chromedp.Click(chromedp.JSPath(shadow(`button.clear`))))
	page.Until("the empty choice is emitted", `document.getElementById("out").textContent === '{"enabled_tools":[],"pinned_handles":[]}'`, 10*time.Second)

	// Another origin: the module does not load (module scripts are read
	// with CORS), and the catalog is not readable from there.
	other := hostPage(t, w.srv.URL, w.tok["viewer A"])
	page.Do("open a page of an origin not listed", chromedp.Navigate(other.URL))
	page.Until("the page has loaded", `document.readyState === "complete"`, 10*time.Second)
	require.Equal(t, "undefined", page.Eval(`String(customElements.get("toolwire-tool-selector"))`), "the module was refused")
	read := fmt.Sprintf(`fetch(%q, {headers: {Authorization: "Bearer %s"}}).then(() => "read", () => "refused")`, w.srv.URL+"/v1/tools", w.tok["viewer A"])
	res, err := chromedp.Run(bctx, chromedp.Evaluate[string](read, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, "refused", res)

	// The listed origin reads /v1/tools only: another route gives it no
	// CORS header.
	for path, want := range map[string]string{"/v1/tools": origin, "/v1/runs": "", "/assets/app.css": "", recorder.SelectorModule: origin} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.srv.URL+path, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Authorization", "Bearer "+w.tok["viewer A"])
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, want, resp.Header.Get("Access-Control-Allow-Origin"), path)
		require.Empty(t, resp.Header.Get("Access-Control-Allow-Credentials"), path)
	}
}

package recorder_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
)

// TestRegistryPageInBrowser: an admin signs in, registers an HTTP tool
// with the create dialog (a refused one says why and keeps the form), and
// deprecates it; the registry shows who made each change and when. A
// viewer of a tenant then finds the tool on the tools page, sees no
// registry link, and is refused the registry page; a cross-site POST to it
// is refused whatever the credential.
func TestRegistryPageInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	w := newWritesEnv(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 90*time.Second)
	defer cancel()
	bctx := browsertest.Start(t, ctx, bin)
	page := browsertest.NewPage(t, bctx)

	signIn(page, w, "admin", "/admin/tools", `#register`)
	require.Contains(t, page.Text(`header nav`), "Registry", "an admin has the registry's link")
	fill := func(what, schema string) {
		page.Do(what,
			chromedp.Click(chromedp.CSS(`#register summary`)),
			chromedp.WaitVisible(chromedp.CSS(`.register-form input[name=name]`)),
			chromedp.SendKeys(chromedp.CSS(`.register-form input[name=name]`), "send_invoice"),
			chromedp.SendKeys(chromedp.CSS(`.register-form input[name=version]`), "1.0.0"),
			chromedp.SendKeys(chromedp.CSS(`.register-form input[name=description]`), "sends an invoice to a customer"),
			chromedp.SetValue(chromedp.CSS(`.register-form select[name=side_effects]`), "writes"),
			chromedp.SendKeys(chromedp.CSS(`.register-form input[name=url]`), "https://billing.example/invoices"),
			chromedp.SendKeys(chromedp.CSS(`.register-form textarea[name=secret_headers]`), "Authorization: BILLING_KEY"),
			chromedp.SetValue(chromedp.CSS(`.register-form textarea[name=input_schema]`), schema),
			chromedp.Click(chromedp.CSS(`.register-form button`)),
		)
	}
	fill("register with a schema that is not JSON", `{"type": "object",`)
	page.Until("the refusal says why", `!!document.querySelector("#problem")`, 10*time.Second)
	require.Contains(t, page.Text(`#problem`), "the input schema is not JSON")
	require.Equal(t, "send_invoice", page.Eval(`document.querySelector(".register-form input[name=name]").value`), "the form is kept")

	page.Do("mend the schema and register",
		chromedp.SetValue(chromedp.CSS(`.register-form textarea[name=input_schema]`), `{"type": "object", "required": ["customer"], "properties": {"customer": {"type": "string"}}}`),
		chromedp.SetValue(chromedp.CSS(`.register-form textarea[name=output_schema]`), `{"type": "object", "required": ["invoice_id"]}`),
		chromedp.Click(chromedp.CSS(`.register-form button`)),
	)
	page.Until("registered", `!!document.querySelector("#notice") && document.querySelector("#notice").textContent.includes("Registered send_invoice@1.0.0")`, 10*time.Second)
	require.Contains(t, page.Text(`tr[data-ref="send_invoice@1.0.0"] .last-change`), "by admin")
	reg, err := registry.Open(ctx, w.env.JS)
	require.NoError(t, err)
	e, err := reg.Get(ctx, envelope.ToolRef{Name: "send_invoice", Version: "1.0.0"})
	require.NoError(t, err)
	require.Equal(t, "admin", e.UpdatedBy)
	require.Equal(t, envelope.SideEffectsWrites, e.Definition.Metadata.SideEffects)
	require.Equal(t, []string{"BILLING_KEY"}, e.Definition.RequiredSecrets)
	require.Equal(t, envelope.ImplHTTP, e.Definition.Implementation.Kind)
	require.JSONEq(t, `{"type": "object", "required": ["invoice_id"]}`, string(e.Definition.OutputSchema))

	page.Do("deprecate it",
		chromedp.SetValue(chromedp.CSS(`tr[data-ref="send_invoice@1.0.0"] select[name=state]`), "deprecated"),
		chromedp.Click(chromedp.CSS(`tr[data-ref="send_invoice@1.0.0"] form.set-state button`)),
	)
	page.Until("deprecated", `!!document.querySelector("tr.state-deprecated[data-ref='send_invoice@1.0.0']")`, 10*time.Second)
	hist := page.Eval(`document.querySelector('tr[data-ref="send_invoice@1.0.0"] .history').textContent`)
	require.Contains(t, hist, "active")
	require.Contains(t, hist, "deprecated")
	require.Equal(t, 2, strings.Count(hist, "by admin"), "each change says who: %s", hist)
	e, err = reg.Get(ctx, envelope.ToolRef{Name: "send_invoice", Version: "1.0.0"})
	require.NoError(t, err)
	require.Equal(t, registry.StateDeprecated, e.State)

	if os.Getenv("TOOLWIRE_UPDATE_DOCS") != "" {
		page.Do("the page for the docs", chromedp.Navigate(w.srv.URL+"/admin/tools"), chromedp.WaitVisible(chromedp.CSS(`table.registry`)),
			chromedp.Click(chromedp.CSS(`#register summary`)), chromedp.WaitVisible(chromedp.CSS(`.register-form`)))
		page.Screenshot(filepath.Join("..", "..", "docs", "images", "registry-page.png"))
	}
	signOut(page)
	signIn(page, w, "viewer A", "/tools?show_deprecated=true", `.tool-list`)
	require.Contains(t, page.Text(`[data-ref="send_invoice@1.0.0"] .tool-head`), "Missing API Key", "the viewer sees the new tool")
	require.NotContains(t, page.Text(`header nav`), "Registry", "no admin controls for a viewer")
	page.Do("try the registry", chromedp.Navigate(w.srv.URL+"/admin/tools"), chromedp.WaitVisible(chromedp.CSS(`main`)))
	require.Contains(t, page.Text(`main`), "Admins only")
	require.Equal(t, "0", page.Eval(`String(document.querySelectorAll("form.register-form, form.set-state").length)`), "no registry form on the refusal")

	// A cross-site POST is refused, even with the admin's credential.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.srv.URL+"/admin/tools/send_invoice@1.0.0/state", strings.NewReader("state=active"))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+w.admin)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	e, err = reg.Get(ctx, envelope.ToolRef{Name: "send_invoice", Version: "1.0.0"})
	require.NoError(t, err)
	require.Equal(t, registry.StateDeprecated, e.State, "nothing changed")
}

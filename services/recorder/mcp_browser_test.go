package recorder_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/tools/mcp/mcptest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
)

// TestRegisterMCPServerInBrowser: an admin registers the tools of a
// streamable HTTP MCP server with the registry page's MCP dialog (a real
// SDK server; a refused form says why and keeps what was typed); a stdio
// server is refused unless the recorder allows it, and then the recorder
// starts it and registers its tools; each entry says who registered it,
// and a viewer's tools page lists them.
func TestRegisterMCPServerInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	for _, stdio := range []bool{false, true} {
		name := map[bool]string{false: "stdio off", true: "stdio on"}[stdio]
		t.Run(name, func(t *testing.T) {
			w := newWritesEnv(t, func(c *recorder.Config) { c.MCPStdio = stdio })
			ctx, cancel := context.WithTimeout(testCtx(t), 90*time.Second)
			defer cancel()
			bctx := browsertest.Start(t, ctx, bin)
			page := browsertest.NewPage(t, bctx)
			reg, err := registry.Open(ctx, w.env.JS)
			require.NoError(t, err)
			signIn(page, w, "admin", "/admin/tools", `#register-mcp`)
			open := func(what string, steps ...chromedp.Action[chromedp.Void]) {
				t.Helper()
				page.Do(what, append([]chromedp.Action[chromedp.Void]{
					chromedp.Click(chromedp.CSS(`#register-mcp summary`)),
					chromedp.WaitVisible(chromedp.CSS(`.mcp-form input[name=name]`)),
				}, steps...)...)
			}
			exe, err := os.Executable()
			require.NoError(t, err)
			stdioCommand := exe + " toolwire-test-mcp-server"

			if !stdio {
				open("a stdio server",
					chromedp.SendKeys(chromedp.CSS(`.mcp-form input[name=name]`), "calc"),
					chromedp.Click(chromedp.CSS(`.mcp-form input[value=stdio]`)),
					chromedp.SendKeys(chromedp.CSS(`.mcp-form input[name=command]`), stdioCommand),
					chromedp.Click(chromedp.CSS(`.mcp-form button`)),
				)
				page.Until("refused", `!!document.querySelector("#mcp-problem")`, 10*time.Second)
				require.Contains(t, page.Text(`#mcp-problem`), "TOOLWIRE_RECORDER_MCP_STDIO=1")
				require.Contains(t, page.Text(`#mcp-problem`), "toolwire tools mcp add calc --command")
				require.Equal(t, stdioCommand, page.Eval(`document.querySelector(".mcp-form input[name=command]").value`), "the form is kept")
				entries, err := reg.List(ctx)
				require.NoError(t, err)
				for _, e := range entries {
					require.NotEqual(t, envelope.ImplMCP, e.Definition.Implementation.Kind, "nothing registered")
				}

				// A streamable HTTP server: a bad URL first, then its own.
				srv := mcptest.HTTP(t, "calc")
				page.Do("an HTTP server with a bad URL",
					chromedp.Evaluate[chromedp.Void](`document.querySelector(".mcp-form input[name=command]").value = ""`),
					chromedp.Click(chromedp.CSS(`.mcp-form input[value=http]`)),
					chromedp.SendKeys(chromedp.CSS(`.mcp-form input[name=url]`), "ftp://nowhere.example/mcp"),
					chromedp.Click(chromedp.CSS(`.mcp-form button`)),
				)
				page.Until("refused", `!!document.querySelector("#mcp-problem") && document.querySelector("#mcp-problem").textContent.includes("scheme must be http or https")`, 10*time.Second)
				page.Do("its own URL",
					chromedp.Evaluate[chromedp.Void](`document.querySelector(".mcp-form input[name=url]").value = `+strconv.Quote(srv.URL)),
					chromedp.SetValue(chromedp.CSS(`.mcp-form select[name=side_effects]`), "reads"),
					chromedp.Click(chromedp.CSS(`.mcp-form button`)),
				)
			} else {
				open("a stdio server",
					chromedp.SendKeys(chromedp.CSS(`.mcp-form input[name=name]`), "calc"),
					chromedp.Click(chromedp.CSS(`.mcp-form input[value=stdio]`)),
					chromedp.SendKeys(chromedp.CSS(`.mcp-form input[name=command]`), stdioCommand),
					chromedp.Click(chromedp.CSS(`.mcp-form button`)),
				)
			}
			page.Until("registered", `!!document.querySelector("#notice") && document.querySelector("#notice").textContent.includes("of MCP server calc")`, 30*time.Second)
			require.Contains(t, page.Text(`#notice`), "Registered 6 tools of MCP server calc")
			require.Contains(t, page.Text(`tr[data-ref="calc_add@1.0.0"]`), "MCP")
			require.Contains(t, page.Text(`tr[data-ref="calc_add@1.0.0"] .last-change`), "by admin")
			e, err := reg.Get(ctx, envelope.ToolRef{Name: "calc_greet", Version: "1.0.0"})
			require.NoError(t, err)
			require.Equal(t, envelope.ImplMCP, e.Definition.Implementation.Kind)
			require.Equal(t, "admin", e.UpdatedBy)
			if stdio {
				require.Contains(t, string(e.Definition.Implementation.Config), `"transport":"stdio"`)
				require.Equal(t, envelope.SideEffectsReads, e.Definition.Metadata.SideEffects, "greet says readOnlyHint")
			} else {
				require.Contains(t, string(e.Definition.Implementation.Config), `"transport":"http"`)
				add, err := reg.Get(ctx, envelope.ToolRef{Name: "calc_add", Version: "1.0.0"})
				require.NoError(t, err)
				require.Equal(t, envelope.SideEffectsReads, add.Definition.Metadata.SideEffects, "the form's side effects, for all")
			}

			signOut(page)
			signIn(page, w, "viewer A", "/tools?kind=mcp", `.tool-list`)
			require.True(t, strings.Contains(page.Text(`.tool-list`), "calc_add@1.0.0"), "a viewer's catalog lists the server's tools")
		})
	}
}

package recorder_test

import (
	"context"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestTimelineShowsTheModelThinkingInBrowser: while the model of a run
// streams its answer, the live timeline shows a thinking line for the
// model call, its text growing and the tool it starts to call, before the
// turn is recorded; a discarded attempt is marked and its text goes; the
// turn event replaces the line with the turn, without a reload.
func TestTimelineShowsTheModelThinkingInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	w := newWritesEnv(t)
	nc := w.env.Connect(t)
	fx := storetest.CompletedRun(t, "browser-thinking", "weather", storetest.TenantA, time.Now())
	head, turn1, _, _ := splitRun(t, fx)
	w.env.Publish(t, head...)
	eventually(t, "the run recorded", func() (bool, string) {
		s, b := w.get("admin", "/v1/runs/"+fx.RunID)
		return s == 200, string(b)
	})

	ctx, cancel := context.WithTimeout(testCtx(t), 90*time.Second)
	defer cancel()
	page := browsertest.NewPage(t, browsertest.Start(t, ctx, bin))
	page.Do("sign in and open the run",
		chromedp.Navigate(w.srv.URL+"/login?next="+url.QueryEscape("/runs/"+fx.RunID)),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SetValue(chromedp.CSS(`#token`), w.tok["viewer A"]),
		chromedp.Click(chromedp.CSS(`.login-form button`)),
		chromedp.WaitVisible(chromedp.CSS(`#run`)),
	)
	page.Until("the page follows the run", `document.getElementById("run").dataset.connected === "true"`, 30*time.Second)
	page.Eval(`window.__notReloaded = "yes"`)

	const line = `li[data-thinking="1"]`
	text := func(sel string) string {
		return page.Eval(`(document.querySelector(` + strconv.Quote(sel) + `) || {innerText: ""}).innerText`)
	}
	eventstest.PublishDeltas(t, nc, append(textDeltas(fx.RunID, 1, 1, "Looking up ", "the <b>weather</b>"),
		events.Delta{RunID: fx.RunID, Iteration: 1, Attempt: 1, Seq: 3, ToolCall: &events.DeltaToolCall{Index: 0, ID: "tc_1", Name: "web_search"}})...)
	page.Until("the thinking line shows the text so far and the tool called",
		`(document.querySelector('`+line+` .thinking-text') || {}).textContent === "Looking up the <b>weather</b>" && `+
			`(document.querySelector('`+line+` .thinking-tools') || {}).textContent === "calling web_search"`, 30*time.Second)
	require.Empty(t, page.Eval(`document.querySelector('`+line+` b') ? "markup" : ""`), "the model's text is text, never markup")
	require.Empty(t, text(`.iteration[data-iteration="1"] .turn-meta`), "the turn is not recorded yet")

	eventstest.PublishDeltas(t, nc, events.Delta{RunID: fx.RunID, Iteration: 1, Attempt: 1, Seq: 4, Discarded: true},
		events.Delta{RunID: fx.RunID, Iteration: 1, Attempt: 2, Seq: 5, Text: "Let me search."})
	page.Until("the discarded attempt is marked, and the next one shows",
		`(document.querySelector('`+line+` .discarded') || {}).textContent === "attempt 1 discarded, retrying" && `+
			`(document.querySelector('`+line+` .thinking-text') || {}).textContent === "Let me search." && `+
			`(document.querySelector('`+line+` .thinking-tools') || {}).textContent === ""`, 30*time.Second)

	path := filepath.Join(t.ArtifactDir(), "thinking.png")
	page.Screenshot(path)
	t.Logf("screenshot of the thinking line: %s", path)

	w.env.Publish(t, turn1)
	page.Until("the turn replaces the thinking line",
		`!document.querySelector('`+line+`') && !!document.querySelector('.iteration[data-iteration="1"] .turn-meta')`, 30*time.Second)
	require.Equal(t, "yes", page.Eval(`window.__notReloaded || "reloaded"`), "the page was not reloaded")
	require.True(t, strings.Contains(text(`.iteration[data-iteration="1"]`), "web_search"), "the turn's calls are shown")
}

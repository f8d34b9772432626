package web_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
	"github.com/toolwire/toolwire/services/recorder/web/browsertest"
)

// Environment variables of the browser test.
// TestTimelineLiveInBrowser opens the timeline of a run in progress in
// headless Chromium and watches its tool calls appear as they are recorded,
// without reloading the page: an open call stays open across updates, and
// the page ends showing the run completed. A screenshot of the final page is
// kept in the test's artifacts (go test -artifacts keeps them).
func TestTimelineLiveInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	h := newHarness(t)
	fx := storetest.CompletedRun(t, "browser-run", "weather", storetest.TenantA, time.Now())
	envA, envB := fx.Envelopes[0], fx.Envelopes[1]

	// The run so far: requested, and started (its first model call is slow).
	cut := 0
	for i, o := range fx.Events {
		if o.Event.Type() == events.TypeTurnCompleted {
			cut = i
			break
		}
	}
	h.publish(fx.Events[:cut]...)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	bctx := browsertest.Start(t, ctx, bin)

	page := browsertest.NewPage(t, bctx)
	callSel := func(callID string) string { return `details.call[data-key="` + callID + `"]` }
	// liveText reads a node's text in one evaluation in the page: while the
	// run goes on, the timeline is replaced on each event, and a node found
	// by one call may be gone by the next.
	liveText := func(sel string) string {
		t.Helper()
		return page.Eval(`(document.querySelector(` + strconv.Quote(sel) + `) || {innerText: ""}).innerText`)
	}

	page.Do("open the timeline",
		chromedp.Navigate(h.srv.URL+"/runs/"+fx.RunID),
		chromedp.WaitVisible(chromedp.CSS(`.iteration.empty`)),
	)
	page.Eval(`window.__notReloaded = "yes"`)
	if n := page.Eval(`String(document.querySelectorAll("details.call").length)`); n != "0" {
		t.Fatalf("%s calls shown before any was requested", n)
	}

	// The first model turn comes: its calls appear, requested.
	turn := fx.Events[cut]
	h.publish(turn)
	rest := fx.Events[cut+1:]
	page.Do("see the turn and its calls appear",
		chromedp.WaitVisible(chromedp.CSS(`.iteration[data-iteration="1"] .turn`)),
		chromedp.WaitVisible(chromedp.CSS(callSel(envA.CallID))),
		chromedp.WaitVisible(chromedp.CSS(callSel(envB.CallID))),
	)
	pending := liveText(callSel(envA.CallID) + " summary")
	if !strings.Contains(pending, "web_search") || !strings.Contains(pending, "@1.2.0") || !strings.Contains(pending, "requested") {
		t.Fatalf("first call while running: %q", pending)
	}
	if head := liveText(`.iteration[data-iteration="1"] .iteration-head`); !strings.Contains(head, "policy: allowed") {
		t.Fatalf("turn 1's verdict: %q", head)
	}
	// Open it: its input is there, and it stays open while the page updates.
	page.Do("expand the first call",
		chromedp.Click(chromedp.CSS(callSel(envA.CallID)+" summary")),
		chromedp.WaitVisible(chromedp.CSS(callSel(envA.CallID)+" .io pre")),
	)

	// The calls are approved; the slow one is announced started: it shows
	// running, live.
	var later []events.Outgoing
	for _, o := range rest {
		switch o.Event.Type() {
		case events.TypeCallApproved, events.TypeCallStarted:
			h.publish(o)
		default:
			later = append(later, o)
		}
	}
	startedB := `(document.querySelector(` + strconv.Quote(callSel(envB.CallID)+" summary .badge.running") +
		`) || {innerText: ""}).innerText === "started"`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](startedB)); err != nil {
		t.Fatalf("browser: see the slow call running: %v", err)
	}

	// The rest of the run happens: envelopes, the second turn, the end.
	h.publish(later...)
	page.Do("see the run complete",
		chromedp.WaitVisible(chromedp.CSS(`.iteration.final`)),
		chromedp.WaitVisible(chromedp.CSS(`.run-head .status-completed`)),
		chromedp.WaitVisible(chromedp.CSS(callSel(envB.CallID)+` .badge.bad`)),
	)
	summaryA, summaryB := page.Text(callSel(envA.CallID)+" summary"), page.Text(callSel(envB.CallID)+" summary")
	output := page.Text(callSel(envA.CallID) + " .io")
	open := page.Eval(`String(document.querySelector('` + callSel(envA.CallID) + `').open)`)
	if marker := page.Eval(`window.__notReloaded || "reloaded"`); marker != "yes" {
		t.Fatalf("the page was reloaded (marker %q)", marker)
	}
	if refreshes := page.Eval(`document.getElementById("run").dataset.refreshes || "0"`); refreshes == "0" {
		t.Fatal("the timeline was never refreshed from the live stream")
	}
	for _, want := range []string{"web_search", "ok", "cached", "42 ms"} {
		if !strings.Contains(summaryA, want) {
			t.Errorf("first call %q lacks %q", summaryA, want)
		}
	}
	for _, want := range []string{"fetch_page", "@2.0.0", "TIMEOUT", "5.00 s", "$0.0020"} {
		if !strings.Contains(summaryB, want) {
			t.Errorf("second call %q lacks %q", summaryB, want)
		}
	}
	if open != "true" || !strings.Contains(output, "Paris: sunny") {
		t.Errorf("the opened call (open %s) shows %q; want it still open with its output", open, output)
	}

	// Materialize the first call from its button.
	page.Do("materialize",
		chromedp.Click(chromedp.CSS(callSel(envA.CallID)+` button[data-materialize]`)),
		chromedp.WaitVisible(chromedp.CSS(callSel(envA.CallID)+` .materialized`)),
	)
	materialized := page.Text(callSel(envA.CallID) + ` .materialized`)
	if !strings.Contains(materialized, `"kind": "tool_node"`) || !strings.Contains(materialized, `"ref": "web_search@1.2.0"`) {
		t.Errorf("materialized = %s", materialized)
	}

	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot: %v", err)
	}
	path := filepath.Join(t.ArtifactDir(), "timeline.png")
	if err := os.WriteFile(path, shot, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the timeline: %s (%d bytes)", path, len(shot))
}

package pages_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/api"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/pages"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness serves the pages and the JSON API, as the recorder does, on a
// SQLite store that the test writes to directly: what the pages show is
// what the store holds, however it got there.
type harness struct {
	t       *testing.T
	store   *sqlite.Store
	changes *api.Changes
	srv     *httptest.Server
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	st := sqlitetest.Store(t)
	log := slog.New(slog.DiscardHandler)
	h := &harness{t: t, store: st, changes: api.NewChanges()}
	done := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/v1/", api.New(st, api.Options{Log: log, Changes: h.changes, Done: done}))
	mux.Handle("/", pages.New(st, pages.Options{Log: log}))
	h.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		close(done) // ends the live streams, as a stopping recorder does
		h.srv.Close()
	})
	return h
}

// publish records events as the recorder would, and wakes the live streams.
func (h *harness) publish(outs ...events.Outgoing) {
	h.t.Helper()
	recs := storetest.Records(h.t, outs...)
	if err := h.store.Write(testCtx(h.t), recs...); err != nil {
		h.t.Fatal(err)
	}
	h.changes.Notify(recs)
}

// page fetches an HTML page and checks its status and headers.
func (h *harness) page(path string, want int) string {
	h.t.Helper()
	resp := h.get(path)
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		h.t.Fatalf("GET %s: %d %s %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return string(b)
}

func (h *harness) get(path string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequestWithContext(testCtx(h.t), http.MethodGet, h.srv.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestTimelineShowsTheDecisionApplied (issue 29): a call's approval badge
// is the decision the Policy Guard applied, as its outcome shows, and a
// later opposite decision, which it ignored, is listed as ignored; the
// call's API record says the same.
func TestTimelineShowsTheDecisionApplied(t *testing.T) {
	for _, c := range []struct {
		first, late events.DecisionKind
		badge       string
	}{
		{events.DecisionDeny, events.DecisionApprove, `<span class="badge warn">denied</span>`},
		{events.DecisionApprove, events.DecisionDeny, `<span class="badge ok">approved</span>`},
	} {
		t.Run(string(c.late)+" after "+string(c.first), func(t *testing.T) {
			h := newHarness(t)
			fx := storetest.ApprovalRun(t, "page-approval", storetest.TenantA, time.Now(), c.first, c.late)
			h.publish(fx.Events...)
			state := map[events.DecisionKind]string{events.DecisionApprove: "approved", events.DecisionDeny: "denied"}[c.first]
			run := h.page("/runs/page-approval", http.StatusOK)
			for _, want := range []string{c.badge,
				"decision: " + string(c.first) + ` <span class="muted">by ` + storetest.FirstDecider,
				"— applied</span>",
				"decision: " + string(c.late) + ` <span class="muted">by ` + storetest.LateDecider,
				"— ignored: the call was already " + state + " by " + storetest.FirstDecider + "</span>"} {
				require.Contains(t, run, want)
			}
			for _, bad := range []string{"approved", "denied"} {
				if bad != state {
					require.NotContains(t, run, `">`+bad+`</span>`, "the late decision made no badge")
				}
			}

			resp := h.get("/v1/runs/page-approval/calls/" + fx.Envelopes[0].CallID)
			defer func() { _ = resp.Body.Close() }()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			var call apitypes.CallJSON
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&call))
			require.NotNil(t, call.Approval)
			require.Equal(t, state, call.Approval.State)
			require.NotNil(t, call.Approval.Applied)
			require.Equal(t, string(c.first), call.Approval.Applied.Decision)
			require.Equal(t, storetest.FirstDecider, call.Approval.Applied.By)
			require.Len(t, call.Approval.Ignored, 1)
			require.Equal(t, string(c.late), call.Approval.Ignored[0].Decision)
			require.Equal(t, storetest.LateDecider, call.Approval.Ignored[0].By)
			require.Empty(t, call.Approval.Awaiting)
		})
	}
}

// TestTimelinePages: the runs list and a run's timeline are HTML that names
// the calls, their versions, latency, status, queue and cost, the turns with
// their verdicts, responses and costs, the slow call's start and the
// approvals.
func TestTimelinePages(t *testing.T) {
	h := newHarness(t)
	fx := storetest.CompletedRun(t, "page-run", "weather", storetest.TenantA, time.Now())
	h.publish(fx.Events...)
	h.publish(storetest.SideEvents(t, fx)...)

	list := h.page("/", http.StatusOK)
	for _, want := range []string{`href="/runs/page-run"`, "weather", "completed", "org-a / ws-1 / user-1"} {
		if !strings.Contains(list, want) {
			t.Errorf("runs page lacks %q", want)
		}
	}
	run := h.page("/runs/page-run", http.StatusOK)
	envA, envB := fx.Envelopes[0], fx.Envelopes[1]
	for _, want := range []string{
		`data-key="` + envA.CallID + `"`, `data-key="` + envB.CallID + `"`,
		"web_search", "@1.2.0", "fetch_page", "@2.0.0", "42 ms", "5.00 s", ">cached<", ">TIMEOUT<",
		"policy: allowed", "Iteration 2", "It is sunny in Paris", "approval required", "decision: approve",
		"by ops@example.com", "Materialize as tool node", "/calls/" + envA.CallID + "/materialize",
		"&#34;query&#34;: &#34;weather in Paris&#34;", // the input, indented and escaped
		"requested by the model", "allowed by policy", "to queue fetchers", "queue fetchers", "on executor-1",
		"$0.0040", // turn 1's model call
		"$0.0020", // fetch_page's cost
		"120 in · 30 out", "asked for 2 tool calls",
	} {
		if !strings.Contains(run, want) {
			t.Errorf("run page lacks %q", want)
		}
	}
	// Only the slow call was announced started (the quick one's start is in
	// its envelope).
	if n := strings.Count(run, "</time> started"); n != 1 {
		t.Errorf("run page shows %d started steps; want 1, the slow call's", n)
	}

	// A run whose outputs are in a blob: the page shows the final answer
	// from its last turn (the pages read no blobs).
	inBlob := storetest.CompletedRun(t, "page-blob", "weather", storetest.TenantA, time.Now()).WithOutputsBlob(t,
		envelope.Attachment{Kind: envelope.AttachmentBlob, URL: "/v1/blobs/page-blob.outputs"})
	h.publish(inBlob.Events...)
	if page := h.page("/runs/page-blob", http.StatusOK); !strings.Contains(page, `<li class="iteration final">`) ||
		!strings.Contains(page, "It is sunny in Paris, 21°C.") {
		t.Errorf("run page of outputs in a blob lacks the final answer: %.2000s", page)
	}

	denied := storetest.FailedRun(t, "page-denied", "weather", storetest.TenantB, time.Now(), "max_budget: the run has spent $1.00 of $1.00")
	h.publish(denied.Events...)
	page := h.page("/runs/page-denied", http.StatusOK)
	for _, want := range []string{"policy: denied · POLICY_DENIED", "max_budget: the run has spent $1.00 of $1.00", "failed"} {
		if !strings.Contains(page, want) {
			t.Errorf("denied run page lacks %q", want)
		}
	}
	frag := h.page("/runs/page-run/timeline", http.StatusOK)
	if strings.Contains(frag, "<html") || !strings.Contains(frag, `data-key="`+envA.CallID+`"`) {
		t.Errorf("timeline fragment: %.300s", frag)
	}
	h.page("/runs/nope", http.StatusNotFound)
	h.page("/runs/a.b", http.StatusBadRequest)
	h.page("/?status=bogus", http.StatusBadRequest)
	for path, ct := range map[string]string{"/assets/app.css": "text/css", "/assets/timeline.js": "text/javascript"} {
		resp := h.get(path)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), ct) {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
}

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

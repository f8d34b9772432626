// Package browsertest starts the headless Chromium that page tests drive
// (the recorder's timeline tests, the stack's approval test): found the same
// way everywhere, with the same flags, and closed when the test ends.
package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Environment variables read by Chromium.
const (
	EnvChromium    = "TOOLWIRE_CHROMIUM"     // the browser binary; default: chromium on PATH
	EnvSkipBrowser = "TOOLWIRE_SKIP_BROWSER" // 1: skip when no browser is installed (never in CI)
)

// Chromium finds the headless browser. Without one the test fails: in CI
// always, elsewhere unless EnvSkipBrowser=1 says to skip.
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium: install Debian's chromium (apt-get install chromium; .ci/run does) or set " + EnvChromium
	if os.Getenv("CI") != "true" && os.Getenv(EnvSkipBrowser) == "1" {
		t.Skip(msg + "; skipped because " + EnvSkipBrowser + "=1")
	}
	t.Fatal(msg)
	return ""
}

// Start starts headless Chromium (bin, from Chromium) within ctx and
// returns the context of its first tab. The browser ends with ctx, or when
// the test ends.
func Start(t testing.TB, ctx context.Context, bin string) context.Context { //nolint:revive // t first, as test helpers take it
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], // headless, no first run, no background networking, ...
		chromedp.ExecPath(bin),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	return bctx
}

// Page drives a tab (the context Start returns) for a test: each step that
// fails fails the test, saying what it was doing.
type Page struct {
	t   testing.TB
	ctx context.Context
}

// NewPage drives the tab of bctx.
func NewPage(t testing.TB, bctx context.Context) Page { //nolint:revive // t first, as test helpers take it
	return Page{t: t, ctx: bctx}
}

// Do runs steps; what says what they do. Steps that a navigation the page
// made itself (a form's redirect) leaves with a stale node or context
// ("No node with given id found": chromedp had not seen the new document
// yet) are run again, from the first, a few times: write steps that may run
// twice (set a value, click what submits a form once more).
func (p Page) Do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	var err error
	for attempt := range staleRetries {
		if err = chromedp.Do(p.ctx, steps...); err == nil || !stale(err) {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("browser: %s: %v", what, err)
	}
}

// staleRetries bounds Do's attempts on a stale node or context.
const staleRetries = 4

// stale says whether err is chromedp's view of a document the page has
// already left.
func stale(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "No node with given id found") || strings.Contains(msg, "Could not find node with given id") ||
		strings.Contains(msg, "Cannot find context with specified id") ||
		strings.Contains(msg, "does not belong to the document")
}

// Until evaluates the boolean expr until it is true, failing the test
// when it is not within d. An evaluation a navigation interrupts (a form's
// redirect, a live page's reload end it with "Cannot find context with
// specified id") is asked again.
func (p Page) Until(what, expr string, d time.Duration) {
	p.t.Helper()
	var last error
	for giveUp := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		ok, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](expr))
		if last = err; err == nil && ok {
			return
		}
		if time.Now().After(giveUp) {
			p.t.Fatalf("browser: %s: not within %s (last error: %v; page: %.1500s)", what, d, last, p.Eval(`document.body.innerText`))
		}
	}
}

// Eval evaluates the JavaScript expression expr, whose value is a string.
func (p Page) Eval(expr string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		p.t.Fatalf("browser: %s: %v", expr, err)
	}
	return s
}

// Text is the visible text of the node that the CSS selector sel selects,
// waiting for it up to textWait. It is read by the page's own script, not
// through a DOM node id, which a navigation the page made itself (a form's
// redirect) leaves stale ("No node with given id found").
func (p Page) Text(sel string) string {
	p.t.Helper()
	q, _ := json.Marshal(sel)
	expr := fmt.Sprintf(`(() => { const e = document.querySelector(%s); return e ? e.innerText : null })()`, q)
	var last error
	for giveUp := time.Now().Add(textWait); ; time.Sleep(20 * time.Millisecond) {
		s, err := chromedp.Run(p.ctx, chromedp.Evaluate[*string](expr))
		if last = err; err == nil && s != nil {
			return *s
		}
		if time.Now().After(giveUp) {
			p.t.Fatalf("browser: text of %s: not found within %s (last error: %v)", sel, textWait, last)
		}
	}
}

// textWait bounds how long Text waits for its node.
const textWait = 10 * time.Second

// Screenshot writes a PNG of the whole page to path (quality 100 is PNG).
func (p Page) Screenshot(path string) {
	p.t.Helper()
	b, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err == nil {
		err = os.WriteFile(path, b, 0o644) //nolint:gosec // a picture for the docs
	}
	if err != nil {
		p.t.Fatalf("browser: screenshot %s: %v", path, err)
	}
}

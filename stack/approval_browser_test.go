package stack_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/web/browsertest"
	"github.com/toolwire/toolwire/stack"
)

// TestApproveFromTheTimelineInBrowser: with authentication on, a run's call
// waits for approval. In headless Chromium a viewer of the tenant sees it
// waiting and no buttons; an approver signs in, a page of another origin
// that posts a denial with the approver's session is refused (the call
// still waits), then the approver clicks Approve with a note: the run
// completes, and the timeline shows who decided and the note.
func TestApproveFromTheTimelineInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	mail := &mailTool{}
	db := sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))
	// Every service on its own NATS identity: the recorder decides with
	// its own (the approvals bucket, the decided subject).
	st := startStack(t, stack.Options{
		Identities:  true,
		DatabaseURL: db, ExecutorOptions: []executor.Option{executor.WithTools(mail)},
		Getenv: func(k string) string {
			if k == recorder.EnvAuth {
				return "on"
			}
			return os.Getenv(k)
		},
	})
	tokens, closeTokens, err := recorder.OpenTokens(t.Context(), db, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer closeTokens()
	issue := func(name string, role auth.Role) string {
		tok, row, err := auth.NewToken(auth.TokenSpec{Name: name, OrgID: "org1", Role: role}, time.Now())
		require.NoError(t, err)
		require.NoError(t, tokens.CreateToken(t.Context(), row))
		return tok
	}
	viewer, approver := issue("viewer-1", auth.RoleViewer), issue("approver-1", auth.RoleApprover)

	const runID = "browser-approve"
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	require.NoError(t, st.Client.Submit(ctx, approvalScript(t, runID, 120, mailTurn, map[string]any{"content": "sent"})))

	bctx := browsertest.Start(t, ctx, bin)
	page := browsertest.NewPage(t, bctx)
	// poll waits until expr holds in the page, across the navigations a
	// form's submission causes (each restarts the wait, up to a bound).
	poll := func(what, expr string) {
		t.Helper()
		var err error
		for range 5 {
			if _, err = chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(60*time.Second))); err == nil {
				return
			}
			if !strings.Contains(err.Error(), "(-32000)") { // the page navigated meanwhile
				break
			}
		}
		t.Fatalf("browser: %s: %v (page: %.1500s)", what, err, page.Eval(`document.body ? document.body.innerText : ""`))
	}
	signIn := func(token string) {
		t.Helper()
		page.Do("sign in",
			chromedp.Navigate(st.HTTPURL+"/login?next="+url.QueryEscape("/runs/"+runID)),
			chromedp.WaitVisible(chromedp.CSS(`#token`)),
			chromedp.SetValue(chromedp.CSS(`#token`), token),
			chromedp.Click(chromedp.CSS(`.login-form button`)),
			chromedp.WaitVisible(chromedp.CSS(`#run`)),
		)
	}
	// waiting: the send_email call shows "approval required" and the echo
	// of its turn has completed (nothing else happens until a decision).
	waiting := `[...document.querySelectorAll("details.call")].some(d => d.innerText.includes("send_email") && d.innerText.includes("approval required")) && ` +
		`[...document.querySelectorAll("details.call")].some(d => d.innerText.includes("echo") && d.querySelector(".badge.ok"))`

	// Without a session the page asks to sign in.
	page.Do("open the run signed out", chromedp.Navigate(st.HTTPURL+"/runs/"+runID), chromedp.WaitVisible(chromedp.CSS(`.login-form`)))

	// The viewer sees the call wait, and no form to decide it.
	signIn(viewer)
	poll("the viewer sees the call wait", waiting)
	require.Equal(t, "0", page.Eval(`String(document.querySelectorAll("form.decide, button.approve").length)`), "a viewer has no buttons")
	require.Contains(t, page.Eval(`document.getElementById("who").innerText`), "viewer-1 · viewer")
	page.Do("sign out", chromedp.Click(chromedp.CSS(`form.logout button`)), chromedp.WaitVisible(chromedp.CSS(`.login-form`)))

	// The approver sees the form.
	signIn(approver)
	poll("the approver sees the call wait", waiting)
	sendSel := `details.call:has(form.decide)`
	callID := page.Eval(`document.querySelector("form.decide").dataset.decide`)
	require.Regexp(t, `^[0-9a-f]{64}$`, callID)
	require.Contains(t, page.Eval(`document.querySelector(`+strconv.Quote(sendSel+" summary")+`).innerText`), events.ShortCallID(callID),
		"the call shows its short id")

	// A page of another origin posts a denial with the approver's session:
	// refused, and the call still waits.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form method="post" action="%s/runs/%s/calls/%s/decision"><input name="decision" value="deny"></form>`+
			`<script>document.forms[0].submit()</script>`, st.HTTPURL, runID, callID)
	}))
	defer evil.Close()
	page.Do("visit a page of another origin", chromedp.Navigate(evil.URL))
	poll("the cross-origin POST answered", `location.href.startsWith(`+strconv.Quote(st.HTTPURL)+`) && document.body.innerText.includes("cross-origin request refused")`)
	_, err = events.PendingApproval(ctx, st.JS, runID, callID)
	require.NoError(t, err, "the cross-origin denial changed nothing")

	// The approver approves with a note: the run completes.
	page.Do("open the run again", chromedp.Navigate(st.HTTPURL+"/runs/"+runID), chromedp.WaitVisible(chromedp.CSS(`form.decide`)))
	poll("the approver sees the call wait", waiting)
	page.Do("approve with a note",
		chromedp.Click(chromedp.CSS(sendSel+" summary")),
		chromedp.WaitVisible(chromedp.CSS(`form.decide input[name=note]`)),
		chromedp.SetValue(chromedp.CSS(`form.decide input[name=note]`), "reviewed, fine"),
		chromedp.Click(chromedp.CSS(`form.decide button.approve`)),
	)
	poll("the run completes on the page", `!!document.querySelector(".run-head .status-completed")`)
	steps := page.Eval(`[...document.querySelectorAll("details.call .steps li")].map(li => li.textContent).join("\n")`)
	require.Contains(t, steps, "decision: approve by approver-1 — reviewed, fine", "who decided and the note, on the timeline")
	require.Regexp(t, `\d\d:\d\d:\d\d\.\d{3} decision: approve`, steps, "and when")
	require.Equal(t, []string{"all@acme.example"}, mail.sentTo(), "the approved call ran once")
	final, err := st.Client.Follow(ctx, runID, nil)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Nil(t, envelopeAt(t, final, 1).Error)
}

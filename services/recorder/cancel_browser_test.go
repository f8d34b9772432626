package recorder_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestCancelFromTheTimelineInBrowser: an approver signs in, opens a run in
// progress, gives a reason and presses Cancel run; the page comes back to
// the timeline, the run's cancel request is published by the approver's
// name, and once the run ends cancelled the live page shows it without a
// reload, the button gone.
func TestCancelFromTheTimelineInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	w := newWritesEnv(t)
	fx := storetest.StartedRun(t, "browser-cancel", "weather", storetest.TenantA, time.Now())
	w.env.Publish(t, fx.Events...)
	eventually(t, "the run recorded", func() (bool, string) {
		s, b := w.get("admin", "/v1/runs/browser-cancel")
		return s == 200, string(b)
	})

	ctx, cancel := context.WithTimeout(testCtx(t), 90*time.Second)
	defer cancel()
	bctx := browsertest.Start(t, ctx, bin)
	page := browsertest.NewPage(t, bctx)
	page.Do("sign in as the approver",
		chromedp.Navigate(w.srv.URL+"/login?next="+url.QueryEscape("/runs/browser-cancel")),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SetValue(chromedp.CSS(`#token`), w.tok["approver A"]),
		chromedp.Click(chromedp.CSS(`.login-form button`)),
		chromedp.WaitVisible(chromedp.CSS(`form.cancel-run`)),
	)
	page.Do("cancel the run",
		chromedp.SetValue(chromedp.CSS(`form.cancel-run input[name=reason]`), "wrong prompt"),
		chromedp.Click(chromedp.CSS(`form.cancel-run button`)),
		chromedp.WaitVisible(chromedp.CSS(`#run`)),
	)
	subj := events.Prefix + ".run.browser-cancel.cancel_requested"
	eventually(t, "the cancel request published", func() (bool, string) {
		return w.count(events.StreamRuns, subj) == 1, ""
	})
	runs, _ := w.env.JS.Stream(testCtx(t), events.StreamRuns)
	m, err := runs.GetLastMsgForSubject(testCtx(t), subj)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	var c events.CancelRequest
	if err == nil {
		err = events.DecodeData(ev, &c)
	}
	if err != nil || c.By != "approver A" || c.Reason != "wrong prompt" {
		t.Fatalf("the button's cancel request: %+v %v", c, err)
	}

	// The orchestrator ends the run: the live page shows it cancelled.
	end, err := events.NewRunStatus("/toolwire/orchestrator", events.RunStatus{RunID: "browser-cancel", Status: events.StatusCancelled,
		Reason: c.Said()}, "", events.RunTrace{})
	if err != nil {
		t.Fatal(err)
	}
	w.env.Publish(t, end)
	page.Until("the page shows the run cancelled",
		`!!document.querySelector(".run-head .status-cancelled") && !document.querySelector("form.cancel-run")`, 30*time.Second)
	if txt := page.Text(`.run-head`); !strings.Contains(txt, "cancelled by approver A: wrong prompt") {
		t.Fatalf("the run's head: %q", txt)
	}
}

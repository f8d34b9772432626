package web_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

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

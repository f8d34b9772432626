package stack_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// TestBuilderInBrowser: the agent node builder, in Chromium, on a stack
// with NATS identities and authentication on. A producer starts from a past
// run's timeline ("pin in the builder" on one of its calls: a by_call_id
// pin), pins a tool it leaves disabled, types a policy, shows a deprecated
// version; the page's run request is what validate accepts, with the same
// warnings, and the run it submits completes with its pins: the by_call_id
// handle holds its call, the disabled tool's handle is null. A viewer may
// not submit; a cross-site POST is refused; another tenant sees none of it.
func TestBuilderInBrowser(t *testing.T) {
	bin := browsertest.Chromium(t)
	db := sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))
	st := startStack(t, stack.Options{
		Identities: true,
		Recorder:   recorder.ForStack(db),
		Getenv: func(k string) string {
			if k == recorder.EnvAuth {
				return "on"
			}
			return os.Getenv(k)
		},
	})
	ctx := t.Context()
	tokens, closeTokens, err := recorder.OpenTokens(ctx, db, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	issue := func(name, org string, role auth.Role) string {
		tok, row, err := auth.NewToken(auth.TokenSpec{Name: name, OrgID: org, WorkspaceID: "ws1", Role: role}, time.Now())
		require.NoError(t, err)
		require.NoError(t, tokens.CreateToken(ctx, row))
		return tok
	}
	producer, viewer, other := issue("builder-1", "org1", auth.RoleProducer), issue("viewer-1", "org1", auth.RoleViewer), issue("producer-b", "org2", auth.RoleProducer)
	closeTokens()

	reg, err := registry.Open(ctx, st.JS)
	require.NoError(t, err)
	for _, e := range []struct {
		name  string
		state registry.State
	}{{"probe", registry.StateActive}, {"old_probe", registry.StateDeprecated}, {"gone_probe", registry.StateBlocked}} {
		def := probeDef("1.0.0")
		def.Name = e.name
		_, err := reg.Register(ctx, def)
		require.NoError(t, err)
		if e.state != registry.StateActive {
			require.NoError(t, reg.SetState(ctx, def.Ref(), e.state))
		}
	}

	// A past run of tenant org1/ws1: two echo calls, then an answer.
	script := []map[string]any{
		{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "first"})}},
		{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "second"})}},
		{"content": "done"},
	}
	past := orchestratortest.Scripted(t, "builder-past", []string{"echo@1.0.0"}, envelope.Policy{}, script...)
	past.Tenant = envelope.Tenant{OrgID: "org1", WorkspaceID: "ws1"}
	final := runToEnd(t, st, past)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.NotNil(t, final.Outputs)
	require.Len(t, final.Outputs.ToolOrder, 2)
	secondCall := final.Outputs.ToolOrder[1]

	bctx := browsertest.Start(t, ctx, bin)
	page := browsertest.NewPage(t, bctx)
	signIn := func(token, next, waitFor string) {
		t.Helper()
		page.Do("sign in",
			chromedp.Navigate(st.HTTPURL+"/login?next="+url.QueryEscape(next)),
			chromedp.WaitVisible(chromedp.CSS(`#token`)),
			chromedp.SetValue(chromedp.CSS(`#token`), token),
			chromedp.Click(chromedp.CSS(`.login-form button`)),
			chromedp.WaitVisible(chromedp.CSS(waitFor)),
		)
	}
	signOut := func() {
		t.Helper()
		page.Do("sign out", chromedp.Click(chromedp.CSS(`form.logout button`)))
		page.Until("signed out", `location.pathname === "/login" && !document.querySelector("form.logout")`, 10*time.Second)
	}
	count := func(sel string) int {
		t.Helper()
		q, _ := json.Marshal(sel)
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll(`+string(q)+`).length`))
		require.NoError(t, err)
		return n
	}
	// press clicks what leads to another page (a link, a button that
	// submits the builder's form) and waits for that page.
	press := func(what, sel, waitFor string) {
		t.Helper()
		page.Do(what, chromedp.Evaluate[chromedp.Void](`document.body.dataset.old = "1"`), chromedp.Click(chromedp.CSS(sel)))
		page.Until(what+": the next page", `!document.body.dataset.old && !!document.querySelector(`+jsString(waitFor)+`)`, 20*time.Second)
	}

	// The producer opens the past run's timeline and pins its second call.
	signIn(producer, "/runs/builder-past", "#timeline")
	page.Until("the past run's calls", `document.querySelectorAll("a.pin-call").length === 2`, 20*time.Second)
	page.Do("open the second call", chromedp.Click(chromedp.CSS(`#call-`+secondCall+` summary`)))
	press("pin the second call", `#call-`+secondCall+` a.pin-call`, `#builder`)
	require.Equal(t, "1", page.Text(`#selected-count`), "the past run's tool is enabled")
	require.Equal(t, "echo", page.Eval(`document.querySelector('.pin-row input[name="pin_name"]').value`))
	require.Equal(t, "by_call_id", page.Eval(`document.querySelector('.pin-row select[name="pin_strategy"]').value`))
	require.Equal(t, secondCall, page.Eval(`document.querySelector('.pin-row select[name="pin_call"]').value`),
		"the call is chosen among the past run's calls of its tool")
	require.Equal(t, 2, count(`.pin-row select[name="pin_call"] option[value]:not([value=""])`), "both echo calls of the run are offered")

	// Grouped by kind; the blocked version never listed, the deprecated
	// one only when asked for.
	require.Equal(t, 1, count(`.tool-group[data-kind="builtin"] [data-ref="probe@1.0.0"]`))
	require.Zero(t, count(`[data-ref="gone_probe@1.0.0"]`))
	require.Zero(t, count(`[data-ref="old_probe@1.0.0"]`))

	// Pin probe (left disabled), type a policy, show deprecated.
	press("pin probe", `[data-ref="probe@1.0.0"] button.pin`, `.pin-row[data-pin="probe"]`)
	require.Contains(t, page.Text(`.pin-row[data-pin="probe"] .pin-note`), "tool probe is not enabled: the handle stays and outputs null")
	page.Do("type a policy",
		chromedp.SendKeys(chromedp.CSS(`#max-iterations`), "6"),
		chromedp.SendKeys(chromedp.CSS(`#max-tool-calls`), "4"),
		chromedp.Click(chromedp.CSS(`#show-deprecated`)),
	)
	press("update the preview", `#preview`, `[data-ref="old_probe@1.0.0"]`)
	require.Contains(t, page.Text(`[data-ref="old_probe@1.0.0"]`), "deprecated")
	page.Do("enable the deprecated version", chromedp.Click(chromedp.CSS(`[data-ref="old_probe@1.0.0"] input[name="tool"]`)))
	require.Equal(t, "2", page.Text(`#selected-count`), "the summary follows the checkboxes")
	press("update the preview", `#preview`, `#findings`)

	// The run request shown is what validate accepts, with its warnings.
	shown := page.Text(`#request-json`)
	var req envelope.RunRequest
	dec := json.NewDecoder(strings.NewReader(shown))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&req), shown)
	require.NoError(t, req.Validate())
	require.Equal(t, envelope.Tenant{OrgID: "org1", WorkspaceID: "ws1"}, req.Tenant, "the credential's tenant")
	require.Equal(t, []string{"echo@1.0.0", "old_probe@1.0.0"}, req.Agent.EnabledTools)
	require.Equal(t, 6, req.Agent.Policy.MaxIterations)
	require.Equal(t, 4, req.Agent.Policy.MaxToolCalls)
	require.Equal(t, []envelope.PinnedHandle{
		{Name: "echo", Selector: envelope.PinSelector{Tool: "echo", Strategy: envelope.PinByCallID, CallID: secondCall}, OnMissing: envelope.MissingNull},
		{Name: "probe", Selector: envelope.PinSelector{Tool: "probe", Strategy: envelope.PinLatest}, OnMissing: envelope.MissingNull},
	}, req.Agent.PinnedHandles)
	var agent envelope.Agent
	require.NoError(t, json.Unmarshal([]byte(page.Text(`#agent-json`)), &agent))
	require.Equal(t, req.Agent.PinnedHandles, agent.PinnedHandles, "the agent configuration is the request's agent")
	findings, err := registry.CheckAgentNow(ctx, st.JS, req.Agent)
	require.NoError(t, err)
	require.Equal(t, []string{"tool old_probe@1.0.0 is deprecated"}, findings.Warnings)
	require.Empty(t, findings.Problems)
	want := make([]string, 0, len(findings.Warnings))
	for _, w := range findings.Warnings {
		want = append(want, "warning: "+w)
	}
	require.Equal(t, strings.Join(want, "\n"), page.Text(`#findings .finding-warning`), "the page says what validate says")
	require.Zero(t, count(`#findings .finding-error`))

	if os.Getenv("TOOLWIRE_UPDATE_DOCS") != "" {
		page.Screenshot(filepath.Join("..", "..", "docs", "images", "builder-page.png"))
	}

	// Submit: the run's timeline opens and the run completes with its pins.
	press("submit the run", `#submit-run`, `#timeline`)
	require.Equal(t, "/runs/"+req.RunID, page.Eval(`location.pathname`))
	page.Until("the run completes and shows its pins", `!!document.querySelector('#pinned [data-pin="probe"]')`, 60*time.Second)
	require.Equal(t, "null", page.Text(`#pinned [data-pin="probe"] .pin-value`), "the disabled tool's handle stays, null")
	require.Contains(t, page.Text(`#pinned [data-pin="echo"] .pin-value`), "second", "the by_call_id handle holds its call")
	pins := getJSON[apitypes.PinsJSON](t, st.HTTPURL+"/v1/runs/"+req.RunID+"/pins", producer)
	require.Equal(t, events.StatusCompleted, pins.Status)
	require.Len(t, pins.Pins, 2)
	require.NotNil(t, pins.Pins[0].Value)
	require.Equal(t, secondCall, pins.Pins[0].Value.CallID, "the same call id as the past run's: the same tool, input and place")
	require.Nil(t, pins.Pins[1].Value)
	require.Equal(t, apitypes.PinMissing, pins.Pins[1].Source)

	// A viewer sees the builder, may not submit.
	signOut()
	signIn(viewer, "/builder", "#builder")
	require.Equal(t, "true", page.Eval(`String(document.querySelector("#submit-run").disabled)`))
	require.Contains(t, page.Text(`#submit-note`), "submitting a run needs the role producer")
	status, err := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch("/builder/runs", {method: "POST", body: new FormData(document.querySelector("#builder"))}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status, "a viewer's submission is refused by the server, not only by the button")

	// A cross-site POST is refused, even with a producer's credential.
	form := url.Values{"name": {"x"}, "run_id": {"builder-cross"}, "message": {"hi"}, "provider": {"scripted"}, "model": {"demo"}}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, st.HTTPURL+"/builder/runs", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Authorization", "Bearer "+producer)
	r.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Zero(t, requestsStored(t, st.JS)["builder-cross"], "nothing was submitted")

	// Another tenant sees none of it: not the runs, not their calls.
	signOut()
	signIn(other, "/builder", "#builder")
	require.NotContains(t, page.Eval(`document.querySelector("#recent-runs").innerHTML`), "builder-", "no run of org1 is offered")
	page.Do("open org1's run in the builder", chromedp.Navigate(st.HTTPURL+"/builder?from_run=builder-past&pin_call="+secondCall))
	page.Until("refused", `document.body.innerText.includes("is not recorded")`, 10*time.Second)
	page.Do("ask for org1's calls", chromedp.Navigate(st.HTTPURL+"/builder?"+url.Values{"name": {"b"}, "run_id": {"b-1"},
		"pin_name": {"x"}, "pin_tool": {"echo"}, "pin_strategy": {"by_call_id"}, "pin_run": {"builder-past"}}.Encode()))
	page.Until("no calls", `document.body.innerText.includes("run builder-past is not recorded")`, 10*time.Second)
	require.Zero(t, count(`.pin-row select[name="pin_call"]`))
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// getJSON is a GET of u with a bearer token, decoded.
func getJSON[T any](t *testing.T, u, token string) T {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, buf.String())
	var v T
	require.NoError(t, json.Unmarshal(buf.Bytes(), &v), buf.String())
	return v
}

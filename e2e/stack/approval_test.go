package stack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/pages/browsertest"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// mailTool writes (it sends email), and can preview what it would send.
type mailTool struct {
	mu   sync.Mutex
	sent []string
}

func (m *mailTool) Definition() envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: "send_email", Version: "1.0.0", Description: "Sends an email",
		InputSchema:    json.RawMessage(`{"type":"object","required":["to","body"],"properties":{"to":{"type":"string"},"body":{"type":"string"},"api_token":{"type":"string"}}}`),
		Metadata:       envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone},
		Implementation: toolapi.BuiltinImplementation("stack_send_email"), SupportsPreview: true,
	}
}

func (m *mailTool) Execute(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in struct{ To string }
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.sent = append(m.sent, in.To)
	m.mu.Unlock()
	return json.Marshal(map[string]any{"sent": true, "to": in.To})
}

func (m *mailTool) Preview(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	var in struct{ To, Body string }
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"would_send_to": in.To, "bytes": len(in.Body)})
}

func (m *mailTool) sentTo() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.sent...)
}

// approvalRun follows one run that makes a call needing approval beside an
// echo call in the same turn; decide answers each approval request (nil: no
// decision). It returns the final status, the approval requests and the
// order in which the calls' outcomes were seen.
type approvalRun struct {
	final     *events.RunStatus
	requests  []events.ApprovalRequest
	order     []string // "echo", "send_email:<outcome event type>" in arrival order
	decidedAt []time.Time
}

func followApprovals(t *testing.T, st *stack.Stack, req envelope.RunRequest, decide func(n int, ar events.ApprovalRequest) *events.Decision) approvalRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, st.Client.Submit(ctx, req))
	pub := publish.NewPublisher(st.JS)
	var (
		res       approvalRun
		echoDone  bool
		pending   []events.ApprovalRequest
		decideNow = func() {
			for len(pending) > 0 && echoDone {
				ar := pending[0]
				pending = pending[1:]
				d := decide(len(res.requests)-len(pending), ar)
				if d == nil {
					continue
				}
				d.RunID, d.CallID = ar.RunID, ar.CorrelationID
				out, err := events.NewDecided("/toolwire/cli", *d, req.Tenant, events.RunTrace{})
				require.NoError(t, err)
				require.NoError(t, pub.Publish(ctx, out))
				res.decidedAt = append(res.decidedAt, time.Now())
			}
		}
	)
	final, err := st.Client.Follow(ctx, req.RunID, func(e client.Event) bool {
		// Follow hands a call's events over after the turn that asked for
		// the call (the two streams it reads have no order between them);
		// the envelope names its tool.
		switch e.Event.Type() {
		case events.TypeCallApprovalRequired:
			var ar events.ApprovalRequest
			require.NoError(t, events.DecodeData(e.Event, &ar))
			res.requests = append(res.requests, ar)
			pending = append(pending, ar)
		case events.TypeCallCompleted:
			var env envelope.ToolEnvelope
			require.NoError(t, events.DecodeData(e.Event, &env))
			if env.Name == "echo" {
				echoDone = true
			}
		}
		decideNow()
		return true
	})
	require.NoError(t, err)
	res.final = final
	res.order = callOrder(t, st.JS, req.RunID)
	return res
}

// callOrder lists, in the order the calls stream stored them, the echo
// call's completion and the other calls' approvals and completions ("name:verb").
func callOrder(t *testing.T, js jetstream.JetStream, runID string) []string {
	t.Helper()
	filter, err := events.CallEvents(runID)
	require.NoError(t, err)
	cons, err := js.OrderedConsumer(t.Context(), events.StreamCalls, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	require.NoError(t, err)
	info, err := cons.Info(t.Context())
	require.NoError(t, err)
	names := map[string]string{}
	for n := 1; ; n++ {
		tr, ok := turnRecord(t, js, runID, n)
		if !ok {
			break
		}
		for _, c := range tr.Calls {
			names[c.CallID] = c.Name
		}
	}
	var order []string
	for range info.NumPending {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		require.NoError(t, err)
		p, err := events.ParseSubject(m.Subject())
		require.NoError(t, err)
		switch ev.Type() {
		case events.TypeCallApproved, events.TypeCallCompleted:
			name := names[p.CallID]
			switch {
			case name == "echo" && ev.Type() == events.TypeCallCompleted:
				order = append(order, "echo")
			case name != "echo":
				order = append(order, name+":"+string(p.Verb))
			}
		}
	}
	return order
}

func approvalScript(t *testing.T, runID string, timeoutS int, turns ...map[string]any) envelope.RunRequest {
	t.Helper()
	req := scripted(t, runID, []string{"send_email@1.0.0", "echo@1.0.0"}, turns...)
	req.Agent.Policy = envelope.Policy{RequireApproval: &envelope.ApprovalPolicy{Writes: true}, ApprovalTimeoutS: timeoutS}
	return req
}

var mailTurn = map[string]any{"tool_calls": []any{
	call("send_email", map[string]any{"to": "all@acme.example", "body": "Quarterly numbers attached.", "api_token": "sk-live-0123456789abcdefXYZ"}),
	call("echo", map[string]any{"text": "meanwhile"}),
}}

// TestApprovals: a call of a policy that requires approval for writes waits
// for an operator; the other call of its turn finishes meanwhile. Approve
// runs it; deny and revise answer the model with POLICY_DENIED (revise with
// the operator's note, and the model proposes a new call); no decision in
// time is a denial.
func TestApprovals(t *testing.T) {
	mail := &mailTool{}
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(mail)}})
	done := map[string]any{"content": "done"}

	t.Run("approve", func(t *testing.T) {
		res := followApprovals(t, st, approvalScript(t, "appr-approve", 60, mailTurn, done),
			func(int, events.ApprovalRequest) *events.Decision {
				return &events.Decision{Decision: events.DecisionApprove, By: "ops"}
			})
		require.Equal(t, events.StatusCompleted, res.final.Status, res.final.Reason)
		require.Len(t, res.requests, 1)
		ar := res.requests[0]
		require.Equal(t, "send_email", ar.ToolName)
		require.Equal(t, "test-agent", ar.AgentName)
		require.Equal(t, `{"api_token":"[redacted]","body":"Quarterly numbers attached.","to":"[email]"}`, ar.ArgsSummary)
		require.Equal(t, "Calls send_email@1.0.0. Sends an email. It writes: it changes external state, and runs at most once for this call.", ar.EffectDescription)
		require.NotNil(t, ar.Preview)
		require.Empty(t, ar.Preview.Unavailable)
		require.JSONEq(t, `{"would_send_to":"all@acme.example","bytes":27}`, string(ar.Preview.Output), "the executor's dry run")

		// The echo of the same turn finished while the approval waited.
		require.Equal(t, []string{"echo", "send_email:approved", "send_email:completed"}, res.order)
		sendEnv := envelopeAt(t, res.final, 1)
		echoEnv := envelopeAt(t, res.final, 2)
		require.Equal(t, ar.CorrelationID, sendEnv.CallID)
		require.Nil(t, sendEnv.Error)
		require.JSONEq(t, `{"sent":true,"to":"all@acme.example"}`, string(sendEnv.Output))
		require.True(t, echoEnv.TEnd.Before(res.decidedAt[0]), "echo ended before the decision")
		require.False(t, sendEnv.TStart.Before(res.decidedAt[0].Add(-time.Second)), "send_email ran after the decision")
		require.Equal(t, []string{"all@acme.example"}, mail.sentTo())
	})

	t.Run("deny", func(t *testing.T) {
		res := followApprovals(t, st, approvalScript(t, "appr-deny", 60, mailTurn, done),
			func(int, events.ApprovalRequest) *events.Decision {
				return &events.Decision{Decision: events.DecisionDeny, By: "ops", Note: "not to everyone"}
			})
		require.Equal(t, events.StatusCompleted, res.final.Status, res.final.Reason)
		require.Equal(t, []string{"echo", "send_email:completed"}, res.order)
		env := envelopeAt(t, res.final, 1)
		require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied, Message: "approval denied by ops: not to everyone",
			Details: map[string]any{"approval": "deny", "by": "ops", "note": "not to everyone"}}, env.Error)
		require.Equal(t, []string{"all@acme.example"}, mail.sentTo(), "nothing more was sent")
	})

	t.Run("revise", func(t *testing.T) {
		revised := map[string]any{"tool_calls": []any{call("send_email", map[string]any{"to": "team@acme.example", "body": "Numbers."})}}
		res := followApprovals(t, st, approvalScript(t, "appr-revise", 60, mailTurn, revised, done),
			func(n int, _ events.ApprovalRequest) *events.Decision {
				if n == 1 {
					return &events.Decision{Decision: events.DecisionRevise, By: "ops", Note: "send it to the team list only"}
				}
				return &events.Decision{Decision: events.DecisionApprove, By: "ops"}
			})
		require.Equal(t, events.StatusCompleted, res.final.Status, res.final.Reason)
		require.Len(t, res.requests, 2, "the revised call asked again")
		env := envelopeAt(t, res.final, 1)
		require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
		require.Equal(t, "revision requested by ops: send it to the team list only", env.Error.Message)
		second := envelopeAt(t, res.final, 3)
		require.Nil(t, second.Error)
		require.JSONEq(t, `{"sent":true,"to":"team@acme.example"}`, string(second.Output))

		// The model was told the note as the call's result: its second turn
		// carried the first call's result, an error, whose envelope is the
		// revision with the note.
		turn, ok := turnRecord(t, st.JS, "appr-revise", 2)
		require.True(t, ok)
		require.Len(t, turn.Results, 2, "send_email's and echo's results")
		require.True(t, turn.Results[0].IsError)
		denied := res.final.Outputs.ToolsByID[turn.Results[0].CallID]
		told := orchestrator.ToolResultContent(&denied)
		require.Contains(t, told, `"code":"POLICY_DENIED"`)
		require.Contains(t, told, "revision requested by ops: send it to the team list only")
		require.Equal(t, []string{"all@acme.example", "team@acme.example"}, mail.sentTo())
	})

	t.Run("timeout", func(t *testing.T) {
		res := followApprovals(t, st, approvalScript(t, "appr-timeout", 1, mailTurn, done),
			func(int, events.ApprovalRequest) *events.Decision { return nil })
		require.Equal(t, events.StatusCompleted, res.final.Status, res.final.Reason)
		require.Equal(t, []string{"echo", "send_email:completed"}, res.order)
		env := envelopeAt(t, res.final, 1)
		require.Equal(t, envelope.CodePolicyDenied, env.Error.Code)
		require.Equal(t, "approval timed out: no decision within 1s", env.Error.Message)
		require.False(t, env.TStart.Before(res.requests[0].ExpiresAt), "denied at the deadline, not before")
		require.Len(t, mail.sentTo(), 2, "nothing more was sent")

		// A late decision changes nothing.
		d := events.Decision{RunID: "appr-timeout", CallID: res.requests[0].CorrelationID, Decision: events.DecisionApprove}
		out, err := events.NewDecided("/toolwire/cli", d, envelope.Tenant{OrgID: "org1"}, events.RunTrace{})
		require.NoError(t, err)
		require.NoError(t, publish.NewPublisher(st.JS).Publish(t.Context(), out))
		servicetest.PollUntil(t, 10*time.Second, "the guard saw the late decision and ignored it",
			func() bool {
				return servicetest.CounterSum(t, st.Metrics, "toolwire_policy_approvals_total", map[string]string{"outcome": "ignored"}) >= 1
			})
		rec := approvalRecord(t, st.JS, "appr-timeout", d.CallID)
		require.Equal(t, events.ApprovalExpired, rec.State)
		subj, err := events.ApprovedSubject("appr-timeout", d.CallID, envelope.DefaultQueue)
		require.NoError(t, err)
		s, err := st.JS.Stream(t.Context(), events.StreamCalls)
		require.NoError(t, err)
		_, err = s.GetLastMsgForSubject(t.Context(), subj)
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the call was never approved")
	})
}

// turnRecord reads turn n of a run; false when the run has no turn n.
func turnRecord(t *testing.T, js jetstream.JetStream, runID string, n int) (events.Turn, bool) {
	t.Helper()
	subj, err := events.TurnSubject(runID, n)
	require.NoError(t, err)
	var tr events.Turn
	ok := lastEventData(t, js, events.StreamRuns, subj, &tr)
	return tr, ok
}

func approvalRecord(t *testing.T, js jetstream.JetStream, runID, callID string) events.ApprovalRecord {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), events.BucketApprovals)
	require.NoError(t, err)
	key, err := events.ApprovalKey(runID, callID)
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), key)
	require.NoError(t, err)
	rec, err := events.DecodeApprovalRecord(e.Value())
	require.NoError(t, err)
	return rec
}

// TestGuardRulesEndToEnd: the side-effect ceiling and the scopes refuse calls
// of a running agent with POLICY_DENIED and the rule's reason.
func TestGuardRulesEndToEnd(t *testing.T) {
	mail := &mailTool{}
	st := startStack(t, stack.Options{ExecutorOptions: []executor.Option{executor.WithTools(mail)}})
	req := scripted(t, "guard-readonly", []string{"send_email@1.0.0", "echo@1.0.0"}, mailTurn, map[string]any{"content": "done"})
	req.Agent.Policy = envelope.Policy{SideEffects: envelope.SideEffectsReads}
	final := runToEnd(t, st, req)
	env := envelopeAt(t, final, 1)
	require.Equal(t, &envelope.ToolError{Code: envelope.CodePolicyDenied,
		Message: `tool send_email@1.0.0 has side effects "writes", above this agent's ceiling "reads"`}, env.Error)
	require.Nil(t, envelopeAt(t, final, 2).Error, "echo has no side effects")
	require.Empty(t, mail.sentTo(), "a read-only node never runs a writes tool")
}

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
		Identities: true,
		Recorder:   recorder.ForStack(db), ExecutorOptions: []executor.Option{executor.WithTools(mail)},
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
	require.Contains(t, page.Eval(`document.querySelector(`+strconv.Quote(sendSel+" summary")+`).innerText`), approvals.ShortCallID(callID),
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
	_, err = approvals.PendingApproval(ctx, st.JS, runID, callID)
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
	// The run's end and its calls' steps are recorded by separate consumers
	// (no order between them): the page shows the run completed and, on a
	// later refresh, the decision on the call.
	poll("the run completes on the page", `!!document.querySelector(".run-head .status-completed") && `+
		`[...document.querySelectorAll("details.call .steps li")].some(li => li.textContent.includes("decision: approve"))`)
	steps := page.Eval(`[...document.querySelectorAll("details.call .steps li")].map(li => li.textContent).join("\n")`)
	require.Contains(t, steps, "decision: approve by approver-1 — reviewed, fine", "who decided and the note, on the timeline")
	require.Regexp(t, `\d\d:\d\d:\d\d\.\d{3} decision: approve`, steps, "and when")
	require.Equal(t, []string{"all@acme.example"}, mail.sentTo(), "the approved call ran once")
	final, err := st.Client.Follow(ctx, runID, nil)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status, final.Reason)
	require.Nil(t, envelopeAt(t, final, 1).Error)
}

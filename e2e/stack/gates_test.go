package stack_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/web"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/stack"
)

// mediumMail is the mail tool declaring its risk medium.
type mediumMail struct{ *mailTool }

func (m mediumMail) Definition() envelope.ToolDefinition {
	d := m.mailTool.Definition()
	d.Risk = &envelope.RiskPolicy{Default: envelope.RiskMedium}
	return d
}

// TestGatesEndToEnd: an agent node at autonomy supervised, in one turn:
// its low-risk read runs at once, its medium write waits for an operator
// with its dry run (gate preview), its high one waits without (gate
// confirm: the tool has no dry run, so preview would fall back to it
// anyway), and a critical one is refused; each call's events carry the gate
// and its cell, and the timeline shows them.
func TestGatesEndToEnd(t *testing.T) {
	mail := &mailTool{}
	st := startStack(t, stack.Options{Recorder: recorder.ForStack(sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))),
		ExecutorOptions: []executor.Option{executor.WithTools(mediumMail{mail})}})
	ctx := t.Context()
	reg, err := registry.Open(ctx, st.JS)
	require.NoError(t, err)
	for name, risk := range map[string]envelope.Risk{"wire_money": envelope.RiskHigh, "drop_db": envelope.RiskCritical} {
		d := probeDef("1.0.0")
		d.Name, d.Metadata.SideEffects, d.Risk = name, envelope.SideEffectsWrites, &envelope.RiskPolicy{Default: risk}
		d.Implementation = toolapi.BuiltinImplementation("echo")
		_, err := reg.Register(ctx, d)
		require.NoError(t, err)
	}
	turn := map[string]any{"tool_calls": []any{
		call("echo", map[string]any{"text": "look first"}),
		call("send_email", map[string]any{"to": "all@acme.example", "body": "Quarterly numbers attached."}),
		call("wire_money", map[string]any{"text": "100 EUR"}),
		call("drop_db", map[string]any{"text": "prod"}),
	}}
	req := scripted(t, "gates-supervised", []string{"echo@1.0.0", "send_email@1.0.0", "wire_money@1.0.0", "drop_db@1.0.0"}, turn, map[string]any{"content": "done"})
	req.Agent.Policy = envelope.Policy{Autonomy: envelope.AutonomySupervised, ApprovalTimeoutS: 60}
	res := followApprovals(t, st, req, func(int, events.ApprovalRequest) *events.Decision {
		return &events.Decision{Decision: events.DecisionApprove, By: "ops"}
	})
	require.Equal(t, events.StatusCompleted, res.final.Status, res.final.Reason)

	gates := map[string]*envelope.GateVerdict{}
	for _, ar := range res.requests {
		gates[ar.ToolName] = ar.Gate
		if ar.ToolName == "send_email" {
			require.NotNil(t, ar.Preview, "the preview gate shows the dry run")
			require.JSONEq(t, `{"would_send_to":"all@acme.example","bytes":27}`, string(ar.Preview.Output))
		}
	}
	require.Len(t, res.requests, 2, "only the medium and the high calls wait")
	require.Equal(t, "supervised × medium → preview (default)", gates["send_email"].Cell())
	require.Equal(t, "supervised × high → confirm (default)", gates["wire_money"].Cell())
	require.Equal(t, []string{"all@acme.example"}, mail.sentTo(), "approved, it ran")

	byName := map[string]envelope.ToolEnvelope{}
	for _, id := range res.final.Outputs.ToolOrder {
		e := res.final.Outputs.ToolsByID[id]
		byName[e.Name] = e
	}
	require.Nil(t, byName["echo"].Error)
	require.Nil(t, byName["wire_money"].Error)
	require.NotNil(t, byName["drop_db"].Error)
	require.Equal(t, envelope.CodePolicyDenied, byName["drop_db"].Error.Code)
	require.Equal(t, "tool drop_db@1.0.0 is denied by the gate matrix: supervised × critical → deny (default)", byName["drop_db"].Error.Message)

	// The approved events carry the gate: auto for the read.
	var echoReq events.CallRequest
	approved, err := events.ApprovedSubject(req.RunID, byName["echo"].CallID, envelope.DefaultQueue)
	require.NoError(t, err)
	require.True(t, lastEventData(t, st.JS, events.StreamCalls, approved, &echoReq))
	require.NotNil(t, echoReq.Gate)
	require.Equal(t, "supervised × low → auto (default)", echoReq.Gate.Cell())

	// The timeline shows each call's gate (the recorder may still be
	// writing the last events: read it again, a bounded number of times).
	var page string
	servicetest.PollUntil(t, 10*time.Second, "the timeline shows the three gates", func() bool {
		code, body := get(t, st.HTTPURL+"/runs/"+req.RunID+"/timeline")
		page = string(body)
		return code == http.StatusOK && strings.Count(page, "gate: ") >= 3
	})
	require.Contains(t, page, "gate: auto")
	require.Contains(t, page, "gate: preview")
	require.Contains(t, page, "gate: confirm")
	require.Contains(t, page, "supervised × high → confirm (default)")
}

// TestPreviewGateShowsTheHTTPRequest: under a preview gate, the approval
// request of an HTTP tool's call carries the exact request it would send,
// its secret named and never its value, and nothing reaches the endpoint
// until the operator approves; then the real request goes, with the secret.
func TestPreviewGateShowsTheHTTPRequest(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization")+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"invoice_id":"inv-1"}`)
	}))
	t.Cleanup(srv.Close)
	key := "k1:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))
	st := startStack(t, stack.Options{Getenv: func(k string) string {
		switch k {
		case secrets.EnvMasterKeys:
			return key
		case web.EnvAllowHosts:
			return srv.Listener.Addr().String()
		}
		return os.Getenv(k)
	}})
	ctx := t.Context()
	k, err := secrets.ParseKeyring(key, "")
	require.NoError(t, err)
	store, err := secrets.Open(ctx, st.JS, k)
	require.NoError(t, err)
	const secret = "sk-live-0123456789abcdef"
	require.NoError(t, store.Set(ctx, secrets.WorkspaceScope("org1", "ws1"), "BILLING_KEY", []byte(secret)))
	reg, err := registry.Open(ctx, st.JS)
	require.NoError(t, err)
	cfg, err := json.Marshal(envelope.HTTPConfig{URL: srv.URL + "/invoices", SecretHeaders: map[string]string{"Authorization": "Bearer {{secret:BILLING_KEY}}"}})
	require.NoError(t, err)
	_, err = reg.Register(ctx, envelope.ToolDefinition{Name: "send_invoice", Version: "1.0.0", Description: "Sends an invoice",
		InputSchema:     json.RawMessage(`{"type":"object","required":["customer"],"properties":{"customer":{"type":"string"}}}`),
		Metadata:        envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone},
		Implementation:  envelope.Implementation{Kind: envelope.ImplHTTP, Config: cfg},
		RequiredSecrets: []string{"BILLING_KEY"}, SupportsPreview: true})
	require.NoError(t, err)

	turn := map[string]any{"tool_calls": []any{
		call("echo", map[string]any{"text": "first"}),
		call("send_invoice", map[string]any{"customer": "c-42"}),
	}}
	req := scripted(t, "gates-preview-http", []string{"echo@1.0.0", "send_invoice@1.0.0"}, turn, map[string]any{"content": "done"})
	req.Tenant = envelope.Tenant{OrgID: "org1", WorkspaceID: "ws1"}
	req.Agent.Policy = envelope.Policy{Autonomy: envelope.AutonomySupervised, ApprovalTimeoutS: 60}
	var before int
	res := followApprovals(t, st, req, func(_ int, ar events.ApprovalRequest) *events.Decision {
		mu.Lock()
		before = len(seen)
		mu.Unlock()
		return &events.Decision{Decision: events.DecisionApprove, By: "ops"}
	})
	require.Equal(t, events.StatusCompleted, res.final.Status, res.final.Reason)
	require.Len(t, res.requests, 1)
	ar := res.requests[0]
	require.Equal(t, envelope.GatePreview, ar.Gate.Gate)
	require.NotNil(t, ar.Preview)
	require.Empty(t, ar.Preview.Unavailable)
	require.NotContains(t, string(ar.Preview.Output), secret, "the preview never holds the secret")
	var p web.RequestPreview
	require.NoError(t, json.Unmarshal(ar.Preview.Output, &p))
	require.Equal(t, "POST", p.Method)
	require.Equal(t, srv.URL+"/invoices", p.URL)
	require.Equal(t, "Bearer [secret BILLING_KEY]", p.Headers["Authorization"])
	require.Equal(t, `{"customer":"c-42"}`, p.Body)
	require.Zero(t, before, "nothing reached the endpoint before the approval")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"Bearer " + secret + ` {"customer":"c-42"}`}, seen, "approved, the real request went once")
}

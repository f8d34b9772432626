package stack_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/toolapi"
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

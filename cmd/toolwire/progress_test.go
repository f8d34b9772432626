package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// TestProgressPrinter: `toolwire run` prints each step of a v2 run: its
// turns (a denied one with the loop rules' reason, which rides on the failed
// event), a slow call's start, a call waiting for an operator, each call's
// result and the end.
func TestProgressPrinter(t *testing.T) {
	const runID = "progress"
	input := json.RawMessage(`{"text":"hi"}`)
	callID, err := envelope.CallID("echo", "1.0.0", input, 1)
	require.NoError(t, err)
	now := time.Now()
	tenant := envelope.Tenant{OrgID: "o"}
	var evs []events.Outgoing
	add := func(o events.Outgoing, err error) {
		t.Helper()
		require.NoError(t, err)
		evs = append(evs, o)
	}
	turn := events.Turn{RunID: runID, Iteration: 1, Tenant: tenant, Agent: "a", Verdict: events.LoopVerdict{Allowed: true},
		Response: &envelope.ModelResponse{ToolCalls: []envelope.ToolCall{{ID: "c1", Name: "echo", Arguments: input}}},
		Cost:     0.0012, TStart: now, TEnd: now, Warnings: []string{"echo@1.0.0 is deprecated"},
		Calls: []events.TurnCall{{CallID: callID, Seq: 1, Name: "echo", Version: "1.0.0", Input: input}}}
	add(events.NewTurnCompleted("/test", turn, events.RunTrace{}))
	add(events.NewApprovalRequired("/test", events.ApprovalRequest{RunID: runID, CorrelationID: callID, ToolName: "echo",
		ToolVersion: "1.0.0", Tenant: tenant, Reason: "echo needs an operator", ExpiresAt: now.Add(time.Hour)}, events.RunTrace{}))
	add(events.NewCallStarted("/test", events.CallStarted{RunID: runID, CallID: callID, Name: "echo", Version: "1.0.0", TStart: now},
		tenant, events.RunTrace{}))
	add(events.NewCallCompleted("/test", runID, envelope.ToolEnvelope{CallID: callID, Name: "echo", Version: "1.0.0", Input: input,
		Output: input, TStart: now, TEnd: now.Add(3 * time.Millisecond)}, tenant, events.RunTrace{}))
	denied := events.Turn{RunID: runID, Iteration: 2, Tenant: tenant, Agent: "a",
		Verdict: events.LoopVerdict{Code: envelope.CodePolicyDenied, Reason: "max_iterations (1) reached"}}
	add(events.NewRunStatus("/test", events.RunStatus{RunID: runID, Status: events.StatusFailed, Tenant: tenant,
		Reason: "max_iterations (1) reached", Code: envelope.CodePolicyDenied, Turn: &denied}, "", events.RunTrace{}))

	var out bytes.Buffer
	print := progressPrinter(&out)
	for _, o := range evs {
		p, err := events.ParseSubject(o.Subject)
		require.NoError(t, err)
		require.True(t, print(client.Event{Subject: p, Event: &o.Event}))
	}
	short := callID[:12]
	for _, want := range []string{
		"  model turn 1: 1 tool call(s), cost 0.0012\n",
		"  warning: echo@1.0.0 is deprecated\n",
		"    ?  echo@1.0.0               " + short + " waits for an operator: echo needs an operator\n",
		"       decide with: toolwire approve progress " + callID + "   (or deny, or revise --note ...)\n",
		"    -> echo@1.0.0               " + short + " started\n",
		"    ok echo@1.0.0               " + short + " 3ms {\"text\":\"hi\"}\n",
		"  model turn 2 denied by the loop rules: POLICY_DENIED max_iterations (1) reached\n",
		"run progress failed max_iterations (1) reached\n",
	} {
		require.Contains(t, out.String(), want)
	}
	require.Equal(t, 1, strings.Count(out.String(), "model turn 1"))
}

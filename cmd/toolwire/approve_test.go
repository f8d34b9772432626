package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/approvals"
)

// TestDecisionCommands: approve, deny and revise publish the decision for a
// pending call, and refuse an unknown or already decided one.
func TestDecisionCommands(t *testing.T) {
	env := eventstest.Start(t)
	kv, err := env.JS.KeyValue(t.Context(), events.BucketApprovals)
	require.NoError(t, err)
	tenant := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws", UserID: "u1"}
	pending := func(runID string, deadline time.Time) string {
		t.Helper()
		input := json.RawMessage(`{"to":"x@example.com"}`)
		callID, err := envelope.CallID("send_email", "1.0.0", input, 1)
		require.NoError(t, err)
		rec := events.ApprovalRecord{State: events.ApprovalPending, Deadline: deadline,
			Call: events.CallRequest{RunID: runID, CallID: callID, Seq: 1, Iteration: 1, Name: "send_email", Version: "1.0.0",
				Input: input, Tenant: tenant, Agent: "mailer"},
			Request: events.ApprovalRequest{RunID: runID, CorrelationID: callID, ToolName: "send_email", ToolVersion: "1.0.0",
				AgentName: "mailer", Tenant: tenant, ArgsSummary: `{"to":"x@example.com"}`, ExpiresAt: deadline}}
		b, err := json.Marshal(rec)
		require.NoError(t, err)
		key, err := events.ApprovalKey(runID, callID)
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), key, b)
		require.NoError(t, err)
		return callID
	}
	decided := func(runID, callID string) events.Decision {
		t.Helper()
		s, err := env.JS.Stream(t.Context(), events.StreamCalls)
		require.NoError(t, err)
		subj, err := events.CallSubject(runID, callID, "decided")
		require.NoError(t, err)
		m, err := s.GetLastMsgForSubject(t.Context(), subj)
		require.NoError(t, err)
		ev, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		require.NoError(t, err)
		require.Equal(t, events.TypeCallDecided, ev.Type())
		require.Equal(t, tenant.ID(), events.Ext(ev, events.ExtTenantID))
		var d events.Decision
		require.NoError(t, events.DecodeData(ev, &d))
		return d
	}
	later := time.Now().Add(time.Hour)

	for _, tc := range []struct {
		verb, note, printed string
		want                events.DecisionKind
	}{
		{"approve", "", "approved", events.DecisionApprove},
		{"deny", "too broad", "denied", events.DecisionDeny},
		{"revise", "one recipient only", "revision requested", events.DecisionRevise},
	} {
		runID := "cli-" + tc.verb
		callID := pending(runID, later)
		args := []string{tc.verb, runID, callID, "--by", "alice"}
		if tc.note != "" {
			args = append(args, "--note", tc.note)
		}
		out, err := cli(t, env.URL, "", args...)
		require.NoError(t, err, out)
		require.Equal(t, tc.printed+": call "+callID+" of run "+runID+" (send_email@1.0.0, agent mailer)\n", out)
		require.Equal(t, events.Decision{RunID: runID, CallID: callID, Decision: tc.want, Note: tc.note, By: "alice"}, decided(runID, callID))

		// Published once: a second decision for the call is refused.
		_, err = cli(t, env.URL, "", "approve", runID, callID)
		require.ErrorIs(t, err, errAlreadyDecided)
		require.ErrorContains(t, err, "a decision for call "+callID+" of run "+runID+" was already published")
	}

	// Unknown calls, decided calls, expired calls and bad input.
	_, err = cli(t, env.URL, "", "approve", "cli-none", strings.Repeat("ab", 32))
	require.ErrorIs(t, err, errNoApproval)
	require.ErrorContains(t, err, "is unknown, or needed no approval")

	callID := pending("cli-decided", later)
	key, err := events.ApprovalKey("cli-decided", callID)
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), key)
	require.NoError(t, err)
	rec, err := events.DecodeApprovalRecord(e.Value())
	require.NoError(t, err)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec.State, rec.Decision, rec.DecidedAt = events.ApprovalDenied, &events.Decision{By: "bob"}, &at
	b, err := json.Marshal(rec)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), key, b)
	require.NoError(t, err)
	_, err = cli(t, env.URL, "", "deny", "cli-decided", callID)
	require.ErrorIs(t, err, errAlreadyDecided)
	require.ErrorContains(t, err, "was denied by bob at 2026-01-02T03:04:05Z")

	expired := pending("cli-expired", time.Now().Add(-time.Second))
	_, err = cli(t, env.URL, "", "approve", "cli-expired", expired)
	require.ErrorIs(t, err, errAlreadyDecided)
	require.ErrorContains(t, err, "timed out")

	_, err = cli(t, env.URL, "", "revise", "cli-x", strings.Repeat("ab", 32))
	require.ErrorIs(t, err, events.ErrInvalidDecision)
	require.ErrorContains(t, err, "a revise decision needs a note")
	_, err = cli(t, env.URL, "", "approve", "bad.run", "ab")
	require.ErrorContains(t, err, `run_id "bad.run" must be`)

	// A short call id is accepted when it names one call of the run, as
	// approvals and the timeline page show it.
	short := pending("cli-short", later)
	out, err := cli(t, env.URL, "", "approve", "cli-short", approvals.ShortCallID(short), "--by", "carol")
	require.NoError(t, err, out)
	require.Equal(t, "approved: call "+short+" of run cli-short (send_email@1.0.0, agent mailer)\n", out)
	require.Equal(t, short, decided("cli-short", short).CallID)
	for _, id := range []string{"abcdef0123", "abcdef0456"} {
		k, err := events.ApprovalKey("cli-twins", id)
		require.NoError(t, err)
		b, err := json.Marshal(events.ApprovalRecord{State: events.ApprovalPending, Deadline: later,
			Call: events.CallRequest{RunID: "cli-twins", CallID: id, Tenant: tenant}})
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), k, b)
		require.NoError(t, err)
	}
	_, err = cli(t, env.URL, "", "approve", "cli-twins", "abcdef0")
	require.ErrorIs(t, err, approvals.ErrAmbiguousCall)
	require.ErrorContains(t, err, "abcdef0123, abcdef0456")
	_, err = cli(t, env.URL, "", "approve", "cli-twins", "abcd")
	require.ErrorIs(t, err, errNoApproval)
	require.ErrorContains(t, err, "at least 6")
	out, err = cli(t, env.URL, "", "deny", "cli-twins", "ABCDEF04")
	require.NoError(t, err, out)
	require.Equal(t, "abcdef0456", decided("cli-twins", "abcdef0456").CallID)

	// approvals lists what waits (here no guard runs: the published
	// decisions are not applied, and those calls still wait).
	out, err = cli(t, env.URL, "", "approvals")
	require.NoError(t, err)
	require.Contains(t, out, approvals.ShortCallID(callID)+" ", "approvals shows the short call id")
	require.Contains(t, out, "cli-approve")
	require.NotContains(t, out, "cli-decided", "a decided call does not wait")
	require.NotContains(t, out, "cli-expired", "nor does an expired one")
	out, err = cli(t, env.URL, "", "approvals", "--all")
	require.NoError(t, err)
	require.Contains(t, out, "cli-decided")
	require.Contains(t, out, "cli-expired")
	require.Regexp(t, `RUN\s+CALL\s+TOOL\s+AGENT\s+STATE\s+DEADLINE\s+ARGUMENTS`, out)
	for _, format := range [][]string{{"--json"}, {"-o", "json"}} {
		out, err = cli(t, env.URL, "", append([]string{"approvals"}, format...)...)
		require.NoError(t, err)
		var recs []events.ApprovalRecord
		require.NoError(t, json.Unmarshal([]byte(out), &recs), out)
		runs := map[string]bool{}
		for _, r := range recs {
			runs[r.Call.RunID] = true
			require.Equal(t, events.ApprovalPending, r.State)
		}
		require.True(t, runs["cli-approve"], out)
		require.False(t, runs["cli-decided"], "a decided call does not wait")
	}
}

package orchestratortest

import (
	"context"
	"encoding/json"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Guard plays the parts of the Policy Guard (as its approvals feature
// behaves: it decides each call of a turn itself) and of the executor
// (Complete), by publishing the events they would.
type Guard struct {
	H   *Harness
	Ctx context.Context
}

// Turn waits for turn n of a run and returns it.
func (g Guard) Turn(runID string, n int) events.Turn {
	g.H.T.Helper()
	subj, err := events.TurnSubject(runID, n)
	require.NoError(g.H.T, err)
	e := g.H.Next(g.Ctx, events.StreamRuns, subj)
	var t events.Turn
	require.NoError(g.H.T, json.Unmarshal(e.Data, &t))
	return t
}

// Request waits for the turn that makes call #seq of a run to tool@1.0.0
// with input, and returns the call as the guard would approve it.
func (g Guard) Request(runID, tool string, input any, seq int) events.CallRequest {
	g.H.T.Helper()
	b, err := json.Marshal(input)
	require.NoError(g.H.T, err)
	id, err := envelope.CallID(tool, "1.0.0", b, seq)
	require.NoError(g.H.T, err)
	for n := 1; n <= 16; n++ {
		t := g.Turn(runID, n)
		for _, c := range t.Calls {
			if c.CallID == id {
				return events.CallRequest{RunID: runID, CallID: c.CallID, Seq: c.Seq, Iteration: t.Iteration, Name: c.Name,
					Version: c.Version, Input: c.Input, ProviderCallID: c.ProviderCallID, Tenant: t.Tenant, Agent: t.Agent,
					Queue: envelope.DefaultQueue}
			}
		}
	}
	g.H.T.Fatalf("no turn of run %s made call #%d of %s", runID, seq, tool)
	return events.CallRequest{}
}

// Publish publishes an event built by one of the events.New* functions.
func (g Guard) Publish(o events.Outgoing, err error) {
	g.H.T.Helper()
	require.NoError(g.H.T, err)
	require.NoError(g.H.T, g.H.Pub.Publish(g.Ctx, o))
}

// ApprovalRequired holds a call for an operator's decision.
func (g Guard) ApprovalRequired(c events.CallRequest) {
	g.Publish(events.NewApprovalRequired("/toolwire/policy", events.ApprovalRequest{
		RunID: c.RunID, CorrelationID: c.CallID, ToolName: c.Name, ToolVersion: c.Version, AgentName: c.Agent,
		Tenant: c.Tenant, ArgsSummary: string(c.Input), EffectDescription: "Writes.", Reason: "the policy requires approval",
		ExpiresAt: time.Now().Add(time.Hour),
	}, events.RunTrace{}))
}

// Approve publishes the guard's own approval of a call.
func (g Guard) Approve(c events.CallRequest) {
	g.Publish(events.NewCallApproved("/toolwire/policy", c, events.RunTrace{}))
}

// OperatorApprove does what the guard does once an operator approves a call
// that waited: it publishes the call as approved, then marks its approval
// record approved and settled (which the orchestrator watches).
func (g Guard) OperatorApprove(c events.CallRequest) {
	g.H.T.Helper()
	c.OperatorApproved = true
	g.Approve(c)
	g.SettleApproval(c)
}

// SettleApproval marks a call's approval record approved and settled.
func (g Guard) SettleApproval(c events.CallRequest) {
	g.H.T.Helper()
	kv, err := g.H.Env.JS.KeyValue(g.Ctx, events.BucketApprovals)
	require.NoError(g.H.T, err)
	key, err := events.ApprovalKey(c.RunID, c.CallID)
	require.NoError(g.H.T, err)
	rec, err := json.Marshal(events.ApprovalRecord{State: events.ApprovalApproved, Call: c, Settled: true, Deadline: time.Now().Add(time.Hour)})
	require.NoError(g.H.T, err)
	_, err = kv.Put(g.Ctx, key, rec)
	require.NoError(g.H.T, err)
}

// Complete publishes a call's envelope with its output, as the executor
// would.
func (g Guard) Complete(c events.CallRequest, output json.RawMessage) {
	g.H.T.Helper()
	now := time.Now().UTC()
	g.Publish(events.NewCallCompleted("/toolwire/executor", c.RunID, envelope.ToolEnvelope{
		CallID: c.CallID, Name: c.Name, Version: c.Version, Input: c.Input, Output: output, TStart: now, TEnd: now,
	}, c.Tenant, events.RunTrace{}))
}

package orchestratortest

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Guard plays the parts of the Policy Guard (as its approvals feature
// behaves: it allows iterations and decides each call itself) and of the
// executor (Complete), by publishing the events they would.
type Guard struct {
	H   *Harness
	Ctx context.Context
}

// AllowIteration waits for the check of iteration n of a run and allows it.
func (g Guard) AllowIteration(runID string, n int) {
	g.H.T.Helper()
	g.H.Next(g.Ctx, events.StreamRuns, "toolwire.run."+runID+".iteration."+strconv.Itoa(n)+".requested")
	out, err := events.NewVerdict("/toolwire/policy", events.Verdict{RunID: runID, Iteration: n, Allowed: true}, envelope.Tenant{OrgID: "org1"}, events.RunTrace{})
	g.Publish(out, err)
}

// Request waits for the request of the call #seq of a run to tool@1.0.0, its
// id computed as the orchestrator computes it.
func (g Guard) Request(runID, tool string, input any, seq int) events.CallRequest {
	g.H.T.Helper()
	b, err := json.Marshal(input)
	require.NoError(g.H.T, err)
	id, err := envelope.CallID(tool, "1.0.0", b, seq)
	require.NoError(g.H.T, err)
	e := g.H.Next(g.Ctx, events.StreamCalls, "toolwire.call."+runID+"."+id+".requested")
	var r events.CallRequest
	require.NoError(g.H.T, json.Unmarshal(e.Data, &r))
	return r
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
	g.Publish(events.NewCallRequest("/toolwire/policy", "approved", c, events.RunTrace{}))
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

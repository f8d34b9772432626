package orchestrator_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

// cancel publishes a cancel request of the run, as an operator would.
func cancel(ctx context.Context, t *testing.T, h *orchestratortest.Harness, runID string, tenant envelope.Tenant, reason string) {
	t.Helper()
	out, err := events.NewCancelRequested("/toolwire/test", events.CancelRequest{RunID: runID, Tenant: tenant, Reason: reason, By: "ops"}, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, h.Pub.Publish(ctx, out))
}

// countingModel is the scripted model, counting its calls.
func countingModel(n *atomic.Int32) orchestrator.Providers {
	return orchestrator.Providers{scripted.Name: provider.Func(func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
		n.Add(1)
		return scripted.Provider{}.Complete(ctx, r)
	})}
}

// requireOneEnd checks that the run ended once, as cancelled, and that
// nothing of it followed its end.
func requireOneEnd(ctx context.Context, t *testing.T, h *orchestratortest.Harness, runID string) {
	t.Helper()
	evs := h.StreamEvents(ctx)[runID]
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunCancelled), 1, "%v", orchestratortest.CountBySubject(evs))
	require.Empty(t, orchestratortest.OfType(evs, events.TypeRunCompleted))
	require.Empty(t, orchestratortest.OfType(evs, events.TypeRunFailed))
	broken, err := eventstest.AfterEnd(ctx, h.Env.JS)
	require.NoError(t, err)
	for _, b := range broken {
		require.NotEqual(t, runID, b.RunID, "nothing of the run follows its end: %+v", b)
	}
}

// A run cancelled while it awaits its calls calls its model no more: it
// ends cancelled once its last call has its envelope (here the executor's,
// saying it was cut short), and its outputs hold every envelope, the one
// that completed before and the one cut short. Cancelling it again changes
// nothing.
func TestCancelWhileAwaitingCalls(t *testing.T) {
	h, ctx, g := newGuarded(t)
	var models atomic.Int32
	h.Start("o1", orchestrator.Config{Providers: countingModel(&models), TimerAfter: 10 * time.Millisecond})
	req := orchestratortest.Scripted(t, "cancel-awaiting", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{
			orchestratortest.ToolCall("echo", map[string]any{"text": "quick"}),
			orchestratortest.ToolCall("echo", map[string]any{"text": "slow"}),
		}},
		map[string]any{"content": "never asked"},
	)
	h.Submit(ctx, req)
	quick := g.Request(req.RunID, "echo", map[string]any{"text": "quick"}, 1)
	slow := g.Request(req.RunID, "echo", map[string]any{"text": "slow"}, 2)
	g.Complete(quick, json.RawMessage(`{"text":"quick"}`))
	time.Sleep(50 * time.Millisecond)
	cancel(ctx, t, h, req.RunID, req.Tenant, "runaway")

	// The executor stops the slow call and says so.
	now := time.Now().UTC()
	g.Publish(events.NewCallCompleted("/toolwire/executor", req.RunID, envelope.ToolEnvelope{
		CallID: slow.CallID, Name: slow.Name, Version: slow.Version, Input: slow.Input, TStart: now, TEnd: now,
		Error: events.CancelledCallError(true, "cancelled by ops: runaway"),
	}, slow.Tenant, events.RunTrace{}))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCancelled, final.Status)
	require.Equal(t, "cancelled by ops: runaway", final.Reason)
	require.NotNil(t, final.Outputs)
	require.Len(t, final.Outputs.ToolOrder, 2)
	require.Nil(t, final.Outputs.ToolsByID[quick.CallID].Error)
	cut := final.Outputs.ToolsByID[slow.CallID].Error
	require.True(t, events.IsCancelledCall(cut), "%+v", cut)
	require.EqualValues(t, 1, models.Load(), "no model call after the cancel")

	cancel(ctx, t, h, req.RunID, req.Tenant, "again") // a second ask, stored after the first
	time.Sleep(300 * time.Millisecond)
	requireOneEnd(ctx, t, h, req.RunID)
}

// A cancel during a model call stops the call (its context is cancelled),
// drops its answer, and ends the run with no turn.
func TestCancelDuringTheModelCall(t *testing.T) {
	h, ctx, _ := newGuarded(t)
	stopped := make(chan time.Duration, 1)
	started := make(chan struct{}, 1)
	h.Start("o1", orchestrator.Config{Providers: orchestrator.Providers{scripted.Name: provider.Func(
		func(ctx context.Context, r provider.Request) (envelope.ModelResponse, error) {
			started <- struct{}{}
			t0 := time.Now()
			select {
			case <-ctx.Done():
				stopped <- time.Since(t0)
				return envelope.ModelResponse{}, ctx.Err()
			case <-time.After(30 * time.Second):
				return envelope.ModelResponse{Content: "too late"}, nil
			}
		})}})
	req := orchestratortest.Scripted(t, "cancel-thinking", nil, envelope.Policy{}, map[string]any{"content": "x"})
	h.Submit(ctx, req)
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the model was never called")
	}
	asked := time.Now()
	cancel(ctx, t, h, req.RunID, req.Tenant, "")
	select {
	case d := <-stopped:
		t.Logf("model call stopped %s after the cancel", time.Since(asked).Round(time.Millisecond))
		require.Less(t, d, 10*time.Second)
	case <-ctx.Done():
		t.Fatal("the model call was not stopped")
	}
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCancelled, final.Status)
	require.Equal(t, "cancelled by ops", final.Reason)
	require.NotNil(t, final.Outputs)
	require.Empty(t, final.Outputs.ToolOrder)
	require.Empty(t, orchestratortest.Turns(t, h.StreamEvents(ctx)[req.RunID]), "the dropped answer made no turn")
	requireOneEnd(ctx, t, h, req.RunID)
}

// A cancelled run whose call nobody answers ends when its grace has passed:
// the orchestrator answers the call itself (TIMEOUT, cancelled), and that
// answer ends the run.
func TestCancelledRunEndsAfterItsGrace(t *testing.T) {
	h, ctx, g := newGuarded(t)
	h.Start("o1", orchestrator.Config{CancelGrace: time.Second, TimerAfter: 10 * time.Millisecond})
	req := orchestratortest.Scripted(t, "cancel-grace", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "lost"})}},
		map[string]any{"content": "never"},
	)
	h.Submit(ctx, req)
	lost := g.Request(req.RunID, "echo", map[string]any{"text": "lost"}, 1)
	time.Sleep(50 * time.Millisecond)
	asked := time.Now()
	cancel(ctx, t, h, req.RunID, req.Tenant, "stuck")
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	t.Logf("ended %s after the cancel", time.Since(asked).Round(time.Millisecond))
	require.Equal(t, events.StatusCancelled, final.Status)
	env := final.Outputs.ToolsByID[lost.CallID]
	require.NotNil(t, env.Error)
	require.Equal(t, envelope.CodeTimeout, env.Error.Code)
	require.Contains(t, env.Error.Message, "no outcome was reported within 1s of the run's cancellation")
	require.True(t, events.IsCancelledCall(env.Error))
	requireOneEnd(ctx, t, h, req.RunID)
}

// A cancel of a run that has ended changes nothing: the run keeps its end.
func TestCancelOfAnEndedRun(t *testing.T) {
	h, ctx, _ := newGuarded(t)
	h.Start("o1", orchestrator.Config{})
	req := orchestratortest.Scripted(t, "cancel-ended", nil, envelope.Policy{}, map[string]any{"content": "done"})
	final := h.Run(req, time.Minute)
	require.Equal(t, events.StatusCompleted, final.Status)
	cancel(ctx, t, h, req.RunID, req.Tenant, "too late")
	time.Sleep(300 * time.Millisecond)
	evs := h.StreamEvents(ctx)[req.RunID]
	require.Len(t, orchestratortest.OfType(evs, events.TypeRunCompleted), 1)
	require.Empty(t, orchestratortest.OfType(evs, events.TypeRunCancelled))
}

// A tenant producer cancels its own run on its intake; a cancel of another
// tenant's run there is refused (dead-lettered) and the run goes on.
func TestCancelOnTheIntake(t *testing.T) {
	h, ctx, g := newGuarded(t)
	h.Start("o1", orchestrator.Config{TimerAfter: 10 * time.Millisecond})
	acme := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws1"}
	globex := envelope.Tenant{OrgID: "globex"}
	req := orchestratortest.Scripted(t, "cancel-intake", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "a"})}},
		map[string]any{"content": "done"},
	)
	req.Tenant = acme
	intake(ctx, t, h, acme, req)
	call := g.Request(req.RunID, "echo", map[string]any{"text": "a"}, 1)

	onIntake := func(tenant envelope.Tenant, reason string) string {
		out, err := events.NewCancelRequested("/tenant/"+tenant.OrgID, events.CancelRequest{RunID: req.RunID, Tenant: tenant, Reason: reason}, events.RunTrace{})
		require.NoError(t, err)
		out.Subject, err = events.IntakeSubject(tenant, req.RunID)
		require.NoError(t, err)
		out.MsgID = out.Subject + "/cancel/" + reason
		require.NoError(t, h.Pub.Publish(ctx, out))
		return out.Subject
	}
	// globex names acme in its cancel; its subject says globex.
	subj := onIntake(globex, "forged")
	dl := deadLetter(ctx, t, h, subj)
	require.Contains(t, dl.Error, "run cancel-intake is another tenant's")
	runs, err := h.Env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	_, err = runs.GetLastMsgForSubject(ctx, "toolwire.run."+req.RunID+".cancel_requested")
	require.Error(t, err, "no cancel was handed over")

	onIntake(acme, "mine")
	time.Sleep(100 * time.Millisecond)
	now := time.Now().UTC()
	g.Publish(events.NewCallCompleted("/toolwire/executor", req.RunID, envelope.ToolEnvelope{
		CallID: call.CallID, Name: call.Name, Version: call.Version, Input: call.Input, TStart: now, TEnd: now,
		Error: events.CancelledCallError(true, "cancelled"),
	}, call.Tenant, events.RunTrace{}))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCancelled, final.Status)
	require.Equal(t, "cancelled by tenant "+acme.ID()+": mine", final.Reason)
	requireOneEnd(ctx, t, h, req.RunID)
}

// The envelope of a call its run's cancel cut short can come before the
// cancel request is handled (they are on different streams): the run stops
// on it all the same, with no model call after it.
func TestCutEnvelopeBeforeItsCancel(t *testing.T) {
	h, ctx, g := newGuarded(t)
	var models atomic.Int32
	h.Start("o1", orchestrator.Config{Providers: countingModel(&models), TimerAfter: 10 * time.Millisecond})
	req := orchestratortest.Scripted(t, "cut-first", []string{"echo@1.0.0"}, envelope.Policy{},
		map[string]any{"tool_calls": []any{orchestratortest.ToolCall("echo", map[string]any{"text": "cut"})}},
		map[string]any{"content": "never asked"},
	)
	h.Submit(ctx, req)
	cut := g.Request(req.RunID, "echo", map[string]any{"text": "cut"}, 1)
	now := time.Now().UTC()
	g.Publish(events.NewCallCompleted("/toolwire/executor", req.RunID, envelope.ToolEnvelope{
		CallID: cut.CallID, Name: cut.Name, Version: cut.Version, Input: cut.Input, TStart: now, TEnd: now,
		Error: events.CancelledCallError(true, "cancelled by ops: runaway"),
	}, cut.Tenant, events.RunTrace{}))
	final, err := h.Wait(ctx, req.RunID)
	require.NoError(t, err)
	require.Equal(t, events.StatusCancelled, final.Status)
	require.Equal(t, "cancelled by ops: runaway", final.Reason)
	require.EqualValues(t, 1, models.Load(), "no model call after the cut")
	cancel(ctx, t, h, req.RunID, req.Tenant, "runaway") // the cancel, late
	time.Sleep(300 * time.Millisecond)
	requireOneEnd(ctx, t, h, req.RunID)
}

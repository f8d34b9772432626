package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
)

func request(runID string) envelope.RunRequest {
	return envelope.RunRequest{RunID: runID, Tenant: envelope.Tenant{OrgID: "org-c"},
		Agent: envelope.Agent{Name: "client-agent", Model: envelope.Model{Provider: "scripted", Name: "s"},
			EnabledTools: []string{"echo@1.0.0"}, Policy: envelope.Policy{MaxIterations: 3}},
		Messages: []envelope.Message{{Role: envelope.RoleUser, Content: "hi"}}}
}

// runEvents are a one-call run's events after its request, as the pipeline
// publishes them (contract v2): turn 1 with the call, its approval and
// completion, and the end, done, carrying turn 2's answer.
func runEvents(t *testing.T, req envelope.RunRequest, done events.RunStatus) []events.Outgoing {
	t.Helper()
	input := json.RawMessage(`{"text":"hi"}`)
	callID, err := envelope.CallID("echo", "1.0.0", input, 1)
	require.NoError(t, err)
	now := time.Now()
	turn := func(n int, resp *envelope.ModelResponse, calls ...events.TurnCall) events.Turn {
		return events.Turn{RunID: req.RunID, Iteration: n, Tenant: req.Tenant, Agent: req.Agent.Name,
			Verdict: events.LoopVerdict{Allowed: true}, Model: events.ModelRef{Provider: "scripted", Name: "s"},
			Response: resp, TStart: now, TEnd: now, Policy: req.Agent.Policy, EnabledTools: req.Agent.EnabledTools, Calls: calls}
	}
	var outs []events.Outgoing
	add := func(o events.Outgoing, err error) {
		t.Helper()
		require.NoError(t, err)
		outs = append(outs, o)
	}
	add(events.NewTurnCompleted("/test", turn(1, &envelope.ModelResponse{ToolCalls: []envelope.ToolCall{{ID: "c1", Name: "echo", Arguments: input}}},
		events.TurnCall{CallID: callID, Seq: 1, Name: "echo", Version: "1.0.0", Input: input, Queue: envelope.DefaultQueue}), events.RunTrace{}))
	add(events.NewCallApproved("/test", events.CallRequest{RunID: req.RunID, CallID: callID, Seq: 1, Iteration: 1, Name: "echo",
		Version: "1.0.0", Input: input, Tenant: req.Tenant, Agent: req.Agent.Name, Queue: envelope.DefaultQueue}, events.RunTrace{}))
	env := envelope.ToolEnvelope{CallID: callID, Name: "echo", Version: "1.0.0", Input: input, Output: input, TStart: now, TEnd: now}
	add(events.NewCallCompleted("/test", req.RunID, env, req.Tenant, events.RunTrace{}))
	final := turn(2, &envelope.ModelResponse{Content: "said hi"})
	done.RunID, done.Tenant, done.Status, done.Turn = req.RunID, req.Tenant, events.StatusCompleted, &final
	add(events.NewRunStatus("/test", done, "", events.RunTrace{}))
	return outs
}

func outputsOf(t *testing.T, resp string) *envelope.AgentOutputs {
	t.Helper()
	out := envelope.NewAgentOutputs(resp, nil, "")
	// As it reads back: output is always written, null without a schema.
	out.Output = json.RawMessage("null")
	return &out
}

// TestRunReturnsTheOutputsInlineOrFromTheirBlob: Run and Follow return a
// completed run's outputs whether its event carried them or named their blob,
// and Follow delivers every event of the run on the way, in order per stream.
func TestRunReturnsTheOutputsInlineOrFromTheirBlob(t *testing.T) {
	env := eventstest.Start(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()

	t.Run("inline", func(t *testing.T) {
		req := request("client-inline")
		outputs := outputsOf(t, "said hi")
		// The run's events may come before its request: Follow reads each
		// stream from its first event of the run.
		env.Publish(t, runEvents(t, req, events.RunStatus{Outputs: outputs})...)
		final, err := c.Run(ctx, req, time.Minute)
		require.NoError(t, err)
		require.Equal(t, events.StatusCompleted, final.Status)
		require.Equal(t, outputs, final.Outputs)
		doc, err := c.Outputs(ctx, final)
		require.NoError(t, err)
		require.Equal(t, outputs, doc.Outputs)
	})

	t.Run("in a blob", func(t *testing.T) {
		req := request("client-blob")
		require.NoError(t, c.Submit(ctx, req))
		outputs := outputsOf(t, "said hi at length")
		pinned := map[string]*envelope.ToolEnvelope{"p": nil}
		doc, err := json.Marshal(events.OutputsDocument{Outputs: outputs, Pinned: pinned})
		require.NoError(t, err)
		att, err := blobs.Put(ctx, env.JS, req.RunID+".outputs", doc, "application/json")
		require.NoError(t, err)
		env.Publish(t, runEvents(t, req, events.RunStatus{OutputsBlob: &att})...)
		var types []string
		final, err := c.Follow(ctx, req.RunID, func(e client.Event) bool {
			types = append(types, e.Event.Type())
			return true
		})
		require.NoError(t, err)
		require.Equal(t, outputs, final.Outputs)
		require.Equal(t, pinned, final.Pinned)
		require.Equal(t, &att, final.OutputsBlob)
		// Follow saw the run's events in order on the runs stream, and its
		// call's in order on the calls stream (the two streams have no order
		// between them, but the call's come before Follow returns).
		isCall := func(s string) bool { return s == events.TypeCallApproved || s == events.TypeCallCompleted }
		runs := slices.DeleteFunc(slices.Clone(types), isCall)
		require.Equal(t, []string{events.TypeRunRequested, events.TypeTurnCompleted, events.TypeRunCompleted}, runs)
		calls := slices.DeleteFunc(slices.Clone(types), func(s string) bool { return !isCall(s) })
		require.Equal(t, []string{events.TypeCallApproved, events.TypeCallCompleted}, calls)
		require.NotNil(t, final.Turn, "the final answer rides on the end")
		require.Equal(t, "said hi", final.Turn.Response.Content)
	})

	t.Run("a blob that is gone", func(t *testing.T) {
		req := request("client-blob-gone")
		require.NoError(t, c.Submit(ctx, req))
		att := envelope.Attachment{Kind: envelope.AttachmentBlob, URL: blobs.URL(req.RunID + ".outputs")}
		env.Publish(t, runEvents(t, req, events.RunStatus{OutputsBlob: &att})...)
		final, err := c.Wait(ctx, req.RunID)
		require.ErrorIs(t, err, client.ErrOutputsUnreadable)
		require.True(t, errors.Is(err, blobs.ErrNotFound), "%v", err)
		require.NotNil(t, final, "the run's status comes with the error")
		require.Equal(t, events.StatusCompleted, final.Status)
		require.Nil(t, final.Outputs)
	})
}

// A run id names one run: Submit stores a request only where its run has
// none, with that condition on the stored request (the orchestrator then
// need not look for an earlier run). The same request again is a retry and
// no error; another request under the run id is refused with ErrRunExists
// and not stored.
func TestSubmitOneRequestPerRunID(t *testing.T) {
	env := eventstest.Start(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()
	req := request("client-once")
	require.NoError(t, c.Submit(ctx, req))
	require.NoError(t, c.Submit(ctx, req), "a retry")

	other := req
	other.Messages = []envelope.Message{{Role: envelope.RoleUser, Content: "something else"}}
	runs, err := env.JS.Stream(ctx, events.StreamRuns)
	require.NoError(t, err)
	// Another request of the same run id under another event id: refused.
	out, err := events.NewRunRequested("/test/other", other, events.RunTrace{})
	require.NoError(t, err)
	out.Event.SetID(req.RunID + "/requested-again")
	stored, err := publish.NewPublisher(env.JS).PublishFirst(ctx, out)
	require.NoError(t, err)
	require.False(t, stored)

	m, err := runs.GetLastMsgForSubject(ctx, "toolwire.run.client-once.requested")
	require.NoError(t, err)
	require.True(t, publish.FirstOnSubject(m.Header), "the condition is stored with the request")
	info, err := runs.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "one request stored")

	// A run id whose stored request is another publisher's: Submit says so.
	require.NoError(t, runs.Purge(ctx))
	_, err = env.JS.PublishMsg(ctx, &nats.Msg{Subject: "toolwire.run.client-once.requested", Data: []byte(`{}`),
		Header: nats.Header{events.HeaderMsgID: {"someone-else"}}})
	require.NoError(t, err)
	err = c.Submit(ctx, req)
	require.ErrorIs(t, err, client.ErrRunExists)
	require.ErrorContains(t, err, "someone-else")
}

// A request whose stored twin differs is another request, though both
// have the run's id: Submit refuses it.
func TestSubmitRefusesAnotherRequestOfTheRunsID(t *testing.T) {
	env := eventstest.Start(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()
	req := request("client-twin")
	require.NoError(t, c.Submit(ctx, req))
	other := req
	other.Messages = []envelope.Message{{Role: envelope.RoleUser, Content: "something else"}}
	require.ErrorIs(t, c.Submit(ctx, other), client.ErrRunExists)
}

// TestSubmitToIntakeCannotBeSquatted (issue 29): every producer chooses the
// Nats-Msg-Id of what it hands in, and the intake stream dedupes on it
// across tenants. A tenant that hands in its own request under the
// Nats-Msg-Id another tenant's request would have had (its subject) does
// not make the other's a duplicate: SubmitToIntake adds a nonce.
func TestSubmitToIntakeCannotBeSquatted(t *testing.T) {
	env := eventstest.Start(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()
	victim := request("intake-victim")
	victim.Tenant = envelope.Tenant{OrgID: "globex"}
	victimSubject, err := events.IntakeSubject(victim.Tenant, victim.RunID)
	require.NoError(t, err)

	squat := request("intake-squat")
	squat.Tenant = envelope.Tenant{OrgID: "acme"}
	out, err := events.NewRunIntake("/test/acme", squat, events.RunTrace{})
	require.NoError(t, err)
	out.MsgID = victimSubject
	require.NoError(t, publish.NewPublisher(env.JS).Publish(ctx, out))

	require.NoError(t, c.SubmitToIntake(ctx, victim))
	intake, err := env.JS.Stream(ctx, events.StreamIntake)
	require.NoError(t, err)
	m, err := intake.GetLastMsgForSubject(ctx, victimSubject)
	require.NoError(t, err, "the victim's request is stored")
	require.Equal(t, events.RunRequestedID(victim.RunID), m.Header.Get("ce-id"))
	require.True(t, strings.HasPrefix(m.Header.Get(events.HeaderMsgID), victimSubject+"/"), m.Header.Get(events.HeaderMsgID))
}

// TestFollowDeliversEveryCallEventBeforeTheEnd: Follow reads the runs and the
// calls streams side by side, and the run's end may come first (followed
// after the run, the runs stream has a handful of events where the calls
// stream has hundreds). Whoever follows with fn still sees every call event
// stored before the end, before Follow returns.
func TestFollowDeliversEveryCallEventBeforeTheEnd(t *testing.T) {
	env := eventstest.Start(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()
	req := request("client-many-calls")
	require.NoError(t, c.Submit(ctx, req))
	const calls = 150
	var outs []events.Outgoing
	for i := range calls {
		_, evs := echoCall(t, req, i+1)
		outs = append(outs, evs...)
	}
	env.Publish(t, outs...)
	env.Publish(t, runEvents(t, req, events.RunStatus{Outputs: outputsOf(t, "said hi")})...)

	for range 5 { // each Follow starts afresh; the race it guards against is likelier than not
		seen := 0
		var last string
		final, err := c.Follow(ctx, req.RunID, func(e client.Event) bool {
			if e.Subject.Kind == "call" {
				seen++
			}
			last = e.Event.Type()
			return true
		})
		require.NoError(t, err)
		require.Equal(t, events.StatusCompleted, final.Status)
		require.Equal(t, 2*calls+2, seen, "every call event of the run, its scripted call's two included")
		require.Equal(t, events.TypeRunCompleted, last, "the end comes last")
	}
}

// TestFollowDeliversACallAfterItsTurn: call events stored before the turn
// that asked for them (a quicker pipeline, or a reader of the calls stream
// ahead of the runs stream's) reach fn after that turn, in their own order.
func TestFollowDeliversACallAfterItsTurn(t *testing.T) {
	env := eventstest.Start(t)
	c := client.New(env.JS, "/test/client")
	ctx := t.Context()
	req := request("client-call-order")
	now := time.Now()
	var (
		turnCalls []events.TurnCall
		callOuts  []events.Outgoing
	)
	for i := range 20 {
		call, evs := echoCall(t, req, i+1)
		turnCalls = append(turnCalls, call)
		callOuts = append(callOuts, evs...)
	}
	env.Publish(t, callOuts...) // the calls first
	require.NoError(t, c.Submit(ctx, req))
	turn, err := events.NewTurnCompleted("/test", events.Turn{RunID: req.RunID, Iteration: 1, Tenant: req.Tenant, Agent: req.Agent.Name,
		Verdict: events.LoopVerdict{Allowed: true}, Model: events.ModelRef{Provider: "scripted", Name: "s"}, Response: &envelope.ModelResponse{},
		TStart: now, TEnd: now, Policy: req.Agent.Policy, EnabledTools: req.Agent.EnabledTools, Calls: turnCalls}, events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, turn)
	end, err := events.NewRunStatus("/test", events.RunStatus{RunID: req.RunID, Tenant: req.Tenant, Status: events.StatusCompleted,
		Outputs: outputsOf(t, "done")}, "", events.RunTrace{})
	require.NoError(t, err)
	env.Publish(t, end)

	var got []string
	_, err = c.Follow(ctx, req.RunID, func(e client.Event) bool {
		got = append(got, e.Event.Type()+" "+e.Subject.CallID)
		return true
	})
	require.NoError(t, err)
	want := []string{events.TypeRunRequested + " ", events.TypeTurnCompleted + " "}
	for i := 0; i < len(callOuts); i += 2 {
		id := turnCalls[i/2].CallID
		want = append(want, events.TypeCallApproved+" "+id, events.TypeCallCompleted+" "+id)
	}
	want = append(want, events.TypeRunCompleted+" ")
	require.Equal(t, want, got)
}

// TestFollowBoundsItsWaitForCallEvents: call events the end says were stored
// but that never come (deleted meanwhile) hold Follow for FollowDrain at most;
// it returns the status with ErrEventsMissed. A failure to read the last call
// event returns the status with that error.
func TestFollowBoundsItsWaitForCallEvents(t *testing.T) {
	env := eventstest.Start(t)
	ctx := t.Context()
	req := request("client-drain")
	require.NoError(t, client.New(env.JS, "/test/client").Submit(ctx, req))
	env.Publish(t, runEvents(t, req, events.RunStatus{Outputs: outputsOf(t, "said hi")})...)

	c := client.New(env.JS, "/test/client")
	client.WithFollowDrain(c, 300*time.Millisecond, func(context.Context, string) (uint64, error) { return 1 << 40, nil })
	final, err := c.Follow(ctx, req.RunID, func(client.Event) bool { return true })
	require.ErrorIs(t, err, client.ErrEventsMissed)
	require.NotNil(t, final)
	require.Equal(t, events.StatusCompleted, final.Status)

	broken := errors.New("stream unreachable")
	client.WithFollowDrain(c, time.Minute, func(context.Context, string) (uint64, error) { return 0, broken })
	final, err = c.Follow(ctx, req.RunID, func(client.Event) bool { return true })
	require.ErrorIs(t, err, broken)
	require.Equal(t, events.StatusCompleted, final.Status)

	// Without fn there is nothing to deliver: the end is returned at once.
	final, err = c.Follow(ctx, req.RunID, nil)
	require.NoError(t, err)
	require.Equal(t, events.StatusCompleted, final.Status)
}

// echoCall returns call seq of turn 1 of req's run (echo of seq) and its
// approved and completed events.
func echoCall(t *testing.T, req envelope.RunRequest, seq int) (events.TurnCall, []events.Outgoing) {
	t.Helper()
	input := json.RawMessage(`{"text":"` + strconv.Itoa(seq) + `"}`)
	callID, err := envelope.CallID("echo", "1.0.0", input, seq)
	require.NoError(t, err)
	call := events.TurnCall{CallID: callID, Seq: seq, Name: "echo", Version: "1.0.0", Input: input, Queue: envelope.DefaultQueue}
	approved, err := events.NewCallApproved("/test", events.CallRequest{RunID: req.RunID, CallID: callID, Seq: seq, Iteration: 1,
		Name: "echo", Version: "1.0.0", Input: input, Tenant: req.Tenant, Agent: req.Agent.Name, Queue: envelope.DefaultQueue}, events.RunTrace{})
	require.NoError(t, err)
	now := time.Now()
	completed, err := events.NewCallCompleted("/test", req.RunID, envelope.ToolEnvelope{CallID: callID, Name: "echo", Version: "1.0.0",
		Input: input, Output: input, TStart: now, TEnd: now}, req.Tenant, events.RunTrace{})
	require.NoError(t, err)
	return call, []events.Outgoing{approved, completed}
}

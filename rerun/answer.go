package rerun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/toolwire/toolwire/client"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// The answerer stands in for everything around the orchestrator: it reads
// the run's model turns as the orchestrator publishes them (contract v2: turn
// events, and the turn that ended the run on its completed or failed event),
// checks each turn's loop verdict and calls against the recording, plays the
// Policy Guard and the tools by answering each call with its recorded
// envelope (or, live, hands it to the executor's queue), and watches the
// run's outcome.

// Durables of the answerer's consumers in the replay's own NATS.
const (
	durableRuns  = "replay-runs"
	durableCalls = "replay-calls"
)

// Start implements service.Component: it starts the answerer's consumers.
func (e *engine) Start(ctx context.Context) error {
	forRun := func(fs ...events.Filter) ([]string, error) {
		out := make([]string, len(fs))
		for i, f := range fs {
			s, err := f.ForRun(e.b.RunID)
			if err != nil {
				return nil, err
			}
			out[i] = s
		}
		return out, nil
	}
	runFilters, err := forRun(events.FilterTurnCompleted, events.FilterRunCompleted, events.FilterRunFailed)
	if err != nil {
		return err
	}
	callFilters, err := forRun(events.FilterCallCompleted)
	if err != nil {
		return err
	}
	specs := []consume.RunnerConfig{
		{Spec: provision.ConsumerSpec{Stream: events.StreamRuns, Durable: durableRuns, Filters: runFilters}, Handler: e.onRun},
		{Spec: provision.ConsumerSpec{Stream: events.StreamCalls, Durable: durableCalls, Filters: callFilters}, Handler: e.onCall},
	}
	for _, rc := range specs {
		rc.Concurrency = 1 // in order: the replay compares steps in the order they happen
		r, err := consume.NewRunner(e.js, rc)
		if err == nil {
			err = r.Start(ctx)
		}
		if err != nil {
			return errors.Join(err, e.Stop(ctx))
		}
		e.runners = append(e.runners, r)
	}
	return nil
}

// Stop implements service.Component.
func (e *engine) Stop(ctx context.Context) error {
	var errs []error
	for _, r := range e.runners {
		errs = append(errs, r.Stop(ctx))
	}
	e.runners = nil
	return errors.Join(errs...)
}

func (e *engine) onRun(ctx context.Context, d *consume.Delivery) error {
	switch d.Event.Type() {
	case events.TypeTurnCompleted:
		var t events.Turn
		if err := events.DecodeData(d.Event, &t); err != nil {
			return consume.Permanent(err)
		}
		return e.pub.PublishAll(ctx, e.onTurn(t, events.TraceOf(d.Event)))
	case events.TypeRunCompleted, events.TypeRunFailed, events.TypeRunCancelled:
		var s events.RunStatus
		if err := events.DecodeData(d.Event, &s); err != nil {
			return consume.Permanent(err)
		}
		if s.Turn != nil {
			// The turn that ended the run (the final answer, or a model call
			// the loop rules denied) rides on its end: checked like any turn.
			if err := e.pub.PublishAll(ctx, e.onTurn(*s.Turn, events.TraceOf(d.Event))); err != nil {
				return err
			}
		}
		var outputsErr error
		if s.Outputs == nil && s.OutputsBlob != nil {
			// Too large for the event: the replay's object store has them.
			doc, err := client.New(e.js, Source).Outputs(ctx, &s)
			s.Outputs, outputsErr = doc.Outputs, err
		}
		e.onOutcome(s, outputsErr)
	}
	return nil
}

func (e *engine) onCall(_ context.Context, d *consume.Delivery) error {
	if d.Event.Type() != events.TypeCallCompleted || d.Event.Source() == Source {
		return nil // the answerer's own answer
	}
	var env envelope.ToolEnvelope
	if err := events.DecodeData(d.Event, &env); err != nil {
		return consume.Permanent(err)
	}
	e.onEnvelope(env)
	return nil
}

// describe names a call for a divergence report.
func describe(name, version string, input json.RawMessage, callID string) string {
	ref := name
	if version != "" {
		ref += "@" + version
	}
	in := string(input)
	if c, err := envelope.Canonicalize(input); err == nil {
		in = string(c)
	}
	return fmt.Sprintf("%s %s (call_id %s)", ref, truncate(in, 300), callID)
}

func (e *engine) recordedCall(callID string) string {
	env, ok := e.recorded[callID]
	if !ok {
		return "call_id " + callID
	}
	return describe(env.Name, env.Version, env.Input, callID)
}

// requestedCall is a call of a replayed turn that the answerer answers.
type requestedCall struct {
	events.TurnCall
	iteration int
}

// onTurn checks a replayed model turn against the recording - the loop
// rules' verdict, then each call in order - and returns the events that
// answer its calls.
func (e *engine) onTurn(t events.Turn, trace events.RunTrace) []events.Outgoing {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.touch()
	if !e.checkVerdict(t) {
		return nil
	}
	var outs []events.Outgoing
	for _, c := range t.Calls {
		if out, ok := e.answerFor(t, c, trace); ok {
			outs = append(outs, out)
		}
	}
	return outs
}

// checkVerdict compares a replayed turn's verdict with the recorded verdict
// of its iteration (by outcome and code: the reason's wording may change);
// false when they differ. A turn of an iteration the recording has no
// verdict for is allowed as long as it has the turn.
func (e *engine) checkVerdict(t events.Turn) bool {
	got := t.Verdict
	rec, haveRec := e.verdicts[t.Iteration]
	if !haveRec {
		rec = envelope.IterationVerdict{Iteration: t.Iteration, Allowed: t.Iteration <= len(e.b.Turns)}
	}
	if rec.Allowed == got.Allowed && (got.Allowed || rec.Code == "" || rec.Code == got.Code) {
		return true
	}
	i, ok := e.turnStep[t.Iteration]
	if !ok {
		i = len(e.steps) - 1 // the outcome: the recorded run ended by this verdict
	}
	e.diverge(i, nil, fmt.Sprintf("the loop rules' verdict on iteration %d differs", t.Iteration),
		verdictText(rec.Allowed, rec.Code, rec.Reason), verdictText(got.Allowed, got.Code, got.Reason))
	return false
}

func verdictText(allowed bool, code envelope.ErrorCode, reason string) string {
	if allowed {
		return "allowed"
	}
	return strings.TrimSpace("denied " + string(code) + reasonOf(reason))
}

// answerFor checks one call of a replayed turn and returns the event that
// answers it: its recorded envelope, or (live) its approval to the queue of
// the replay's executor. A call the orchestrator answered itself needs none.
func (e *engine) answerFor(t events.Turn, c events.TurnCall, trace events.RunTrace) (events.Outgoing, bool) {
	if e.answered[c.CallID] {
		return events.Outgoing{}, false // a turn delivered again
	}
	i, ok := e.callStep[c.Seq]
	if !ok {
		extra := Step{N: e.extraN(t.Iteration), Kind: StepToolCall, Iteration: t.Iteration, Seq: c.Seq, CallID: c.CallID,
			Tool: c.Ref().String()}
		e.diverge(0, &extra, "the orchestrator requests a call the recorded run did not make",
			"no call #"+fmt.Sprint(c.Seq), describe(c.Name, c.Version, c.Input, c.CallID))
		return events.Outgoing{}, false
	}
	st := e.steps[i]
	if st.CallID != c.CallID {
		what := "the call differs"
		if st.Iteration != t.Iteration {
			what = fmt.Sprintf("the call belongs to iteration %d, not %d", t.Iteration, st.Iteration)
		}
		e.diverge(i, nil, what, e.recordedCall(st.CallID), describe(c.Name, c.Version, c.Input, c.CallID))
		return events.Outgoing{}, false
	}
	e.answered[c.CallID] = true
	if c.Answered {
		// The model named no valid tool, or arguments no tool takes: the
		// orchestrator's own envelope answers it.
		e.ok(i, "orchestrator")
		return events.Outgoing{}, false
	}
	e.requested[c.CallID] = requestedCall{TurnCall: c, iteration: t.Iteration}
	env, haveEnv := e.recorded[c.CallID]
	if reason := e.liveReason(c, env, haveEnv); e.live && reason == "" {
		e.reexecuted = append(e.reexecuted, c.CallID)
		e.ok(i, "live")
		out, err := events.NewCallApproved(Source, events.CallRequest{RunID: t.RunID, CallID: c.CallID, Seq: c.Seq,
			Iteration: t.Iteration, Name: c.Name, Version: c.Version, Input: c.Input, ProviderCallID: c.ProviderCallID,
			Tenant: t.Tenant, Agent: t.Agent, Queue: envelope.DefaultQueue}, trace)
		if err != nil {
			e.diverge(i, nil, "the call cannot be re-executed", "", err.Error())
			return events.Outgoing{}, false
		}
		return out, true
	} else if e.live {
		e.kept[c.CallID] = reason
	}
	if !haveEnv {
		// The recorded run ended before this call completed: the recording
		// goes no further.
		e.ok(i, "recorded")
		e.endOfRecording(fmt.Sprintf("the recording has no envelope for %s", st.Title()))
		return events.Outgoing{}, false
	}
	e.ok(i, "recorded")
	out, err := events.NewCallCompleted(Source, t.RunID, env, t.Tenant, trace)
	if err != nil {
		e.diverge(i, nil, "the recorded envelope cannot be replayed", "", err.Error())
		return events.Outgoing{}, false
	}
	return out, true
}

// liveReason says why a call keeps its recorded envelope with Live ("" when
// it is executed again).
func (e *engine) liveReason(c events.TurnCall, env envelope.ToolEnvelope, haveEnv bool) string {
	def, ok := e.defs[c.Ref().String()]
	switch {
	case !ok || def.Implementation.Kind == "":
		return "the bundle has no definition of " + c.Ref().String()
	case def.Metadata.SideEffects.Rank() < 0 || def.Metadata.SideEffects == envelope.SideEffectsWrites:
		return "its side_effects is writes: writes are never executed again"
	case strings.HasPrefix(def.Description, standInPrefix):
		return strings.TrimPrefix(def.Description, standInPrefix)
	case haveEnv && env.Error != nil && env.Error.Code == envelope.CodePolicyDenied:
		return "the Policy Guard denied it: it never ran"
	case def.QueueName() != envelope.DefaultQueue:
		return fmt.Sprintf("its queue %q has no worker in a replay (the replay's executor serves %q)",
			def.QueueName(), envelope.DefaultQueue)
	}
	return ""
}

// extraN places a step the recording does not have after the last recorded
// step of its iteration.
func (e *engine) extraN(iteration int) int {
	n := len(e.steps)
	for _, s := range e.steps {
		if s.Kind != StepOutcome && s.Iteration <= iteration {
			n = s.N + 1
		}
	}
	return n
}

// onEnvelope sees a completion published by the orchestrator (a call it
// answered itself) or by the live executor.
func (e *engine) onEnvelope(env envelope.ToolEnvelope) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.touch()
	c, requested := e.requested[env.CallID]
	if !requested {
		if e.answered[env.CallID] {
			return // the orchestrator's answer to a call its turn marked answered
		}
		// The orchestrator answered a call whose turn the answerer has not
		// read yet (the streams have no order between them): its id must
		// be a recorded one.
		if _, ok := e.idStep[env.CallID]; !ok {
			extra := Step{N: len(e.steps), Kind: StepToolCall, CallID: env.CallID, Tool: env.Name}
			e.diverge(0, &extra, "the orchestrator answers a call the recorded run did not make",
				"no such call", describe(env.Name, env.Version, env.Input, env.CallID))
		}
		return
	}
	if e.enveloped == nil {
		e.enveloped = map[string]bool{}
	}
	e.enveloped[env.CallID] = true
	rec, ok := e.recorded[env.CallID]
	if !ok {
		return
	}
	if same, recJSON, repJSON := sameResult(rec, env); !same {
		e.changed = append(e.changed, ChangedOutput{Seq: c.Seq, CallID: env.CallID, Tool: c.Ref().String(),
			Recorded: recJSON, Replayed: repJSON})
	}
}

// result is what a call answered: its output or its error.
type result struct {
	Output json.RawMessage     `json:"output,omitempty"`
	Error  *envelope.ToolError `json:"error,omitempty"`
}

func resultJSON(env envelope.ToolEnvelope) json.RawMessage {
	r := result{Output: env.Output, Error: env.Error}
	if c, err := envelope.Canonicalize(r.Output); err == nil && len(r.Output) > 0 {
		r.Output = c
	}
	b, err := json.Marshal(r)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return b
}

// sameResult compares two envelopes' outputs and errors (not their times,
// cache flags or costs).
func sameResult(a, b envelope.ToolEnvelope) (bool, json.RawMessage, json.RawMessage) {
	ra, rb := resultJSON(a), resultJSON(b)
	return bytes.Equal(ra, rb), ra, rb
}

// endOfRecording ends a replay that reached the end of what was recorded
// without a divergence.
func (e *engine) endOfRecording(why string) {
	out := len(e.steps) - 1
	if e.b.Status == events.StatusFailed || e.b.Status == events.StatusCancelled {
		// The recorded run stopped here too.
		e.steps[out].Checked, e.steps[out].OK = true, true
		e.finish()
		return
	}
	e.diverge(out, nil, why, "run "+e.b.Status, "the recording ends here")
}

// onOutcome compares how the replayed run ended with the recording;
// outputsErr is why a completed run's outputs could not be read.
func (e *engine) onOutcome(s events.RunStatus, outputsErr error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	defer e.finish()
	e.outcome = &s
	out := len(e.steps) - 1
	if s.Status != e.b.Status {
		e.diverge(out, nil, "the run ends differently", "run "+e.b.Status+reasonOf(e.b.Reason), "run "+s.Status+reasonOf(s.Reason))
		return
	}
	if s.Status != events.StatusCompleted || e.b.Outputs == nil {
		e.ok(out, "")
		return
	}
	if outputsErr != nil {
		e.diverge(out, nil, "the replayed run's outputs cannot be read", "its outputs", outputsErr.Error())
		return
	}
	got := s.Outputs
	if got == nil {
		got = &envelope.AgentOutputs{}
	}
	want := e.b.Outputs
	switch {
	case got.Response != want.Response:
		e.diverge(out, nil, "the response differs", want.Response, got.Response)
		return
	case !equalStrings(got.ToolOrder, want.ToolOrder):
		e.diverge(out, nil, "tool_order differs", strings.Join(want.ToolOrder, ", "), strings.Join(got.ToolOrder, ", "))
		return
	case lastID(got.LastTool) != lastID(want.LastTool):
		e.diverge(out, nil, "last_tool differs", lastID(want.LastTool), lastID(got.LastTool))
		return
	}
	live := map[string]bool{}
	for _, id := range e.reexecuted {
		live[id] = true
	}
	for _, id := range want.ToolOrder {
		if live[id] {
			continue // its changes are reported as changed outputs
		}
		if same, a, b := sameResult(want.ToolsByID[id], got.ToolsByID[id]); !same {
			e.diverge(out, nil, "the envelope of call "+id+" in tools_by_id differs", string(a), string(b))
			return
		}
	}
	e.ok(out, "")
}

func reasonOf(r string) string {
	if r == "" {
		return ""
	}
	return ": " + r
}

func lastID(env *envelope.ToolEnvelope) string {
	if env == nil {
		return "(none)"
	}
	return env.CallID
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

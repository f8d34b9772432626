package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// The answerer stands in for everything around the orchestrator: it plays the
// Policy Guard's recorded iteration verdicts, answers each tool call with its
// recorded envelope (or, live, hands it to the executor), and watches the
// run's calls and outcome.

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
	runFilters, err := forRun(events.FilterIterationRequested, events.FilterRunCompleted, events.FilterRunFailed)
	if err != nil {
		return err
	}
	callFilters, err := forRun(events.FilterCallRequested, events.FilterCallCompleted)
	if err != nil {
		return err
	}
	specs := []events.RunnerConfig{
		{Spec: events.ConsumerSpec{Stream: events.StreamRuns, Durable: durableRuns, Filters: runFilters}, Handler: e.onRun},
		{Spec: events.ConsumerSpec{Stream: events.StreamCalls, Durable: durableCalls, Filters: callFilters}, Handler: e.onCall},
	}
	for _, rc := range specs {
		rc.Concurrency = 1 // in order: the replay compares steps in the order they happen
		r, err := events.NewRunner(e.js, rc)
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

func (e *engine) onRun(ctx context.Context, d *events.Delivery) error {
	switch d.Event.Type() {
	case events.TypeIterationRequested:
		var c events.IterationCheck
		if err := events.DecodeData(d.Event, &c); err != nil {
			return events.Permanent(err)
		}
		v, ok := e.verdictFor(c.Iteration)
		if !ok {
			return nil
		}
		out, err := events.NewVerdict(Source, v, c.Tenant, events.TraceOf(d.Event))
		if err != nil {
			return events.Permanent(err)
		}
		return e.pub.Publish(ctx, out)
	case events.TypeRunCompleted, events.TypeRunFailed:
		var s events.RunStatus
		if err := events.DecodeData(d.Event, &s); err != nil {
			return events.Permanent(err)
		}
		e.onOutcome(s)
	}
	return nil
}

// verdictFor returns the recorded verdict of iteration n: the recorded one, or
// an approval for an iteration whose model turn was recorded.
func (e *engine) verdictFor(n int) (events.Verdict, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.touch()
	if v, ok := e.verdicts[n]; ok {
		return events.Verdict{RunID: e.b.RunID, Iteration: n, Allowed: v.Allowed, Code: v.Code, Reason: v.Reason}, true
	}
	if n <= len(e.b.Turns) {
		return events.Verdict{RunID: e.b.RunID, Iteration: n, Allowed: true}, true
	}
	extra := Step{N: len(e.steps), Kind: StepModelTurn, Iteration: n}
	e.diverge(0, &extra, "the orchestrator goes on to another iteration",
		fmt.Sprintf("the run checked %d iterations", max(len(e.verdicts), len(e.b.Turns))),
		fmt.Sprintf("a check of iteration %d", n))
	return events.Verdict{}, false
}

func (e *engine) onCall(ctx context.Context, d *events.Delivery) error {
	switch d.Event.Type() {
	case events.TypeCallRequested:
		var c events.CallRequest
		if err := events.DecodeData(d.Event, &c); err != nil {
			return events.Permanent(err)
		}
		return e.onCallRequested(ctx, c, events.TraceOf(d.Event))
	case events.TypeCallCompleted:
		if d.Event.Source() == Source {
			return nil // the answerer's own answer
		}
		var env envelope.ToolEnvelope
		if err := events.DecodeData(d.Event, &env); err != nil {
			return events.Permanent(err)
		}
		e.onEnvelope(env)
	}
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

func (e *engine) onCallRequested(ctx context.Context, c events.CallRequest, trace events.RunTrace) error {
	out, ok := e.answerFor(c, trace)
	if !ok {
		return nil
	}
	return e.pub.Publish(ctx, out)
}

// answerFor checks a call request and returns the event that answers it.
func (e *engine) answerFor(c events.CallRequest, trace events.RunTrace) (events.Outgoing, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.requested[c.CallID] = c
	if e.answered[c.CallID] {
		return events.Outgoing{}, false
	}
	i, ok := e.callStep[c.Seq]
	if !ok {
		extra := Step{N: e.extraN(c.Iteration), Kind: StepToolCall, Iteration: c.Iteration, Seq: c.Seq, CallID: c.CallID,
			Tool: c.Ref().String()}
		e.diverge(0, &extra, "the orchestrator requests a call the recorded run did not make",
			"no call #"+fmt.Sprint(c.Seq), describe(c.Name, c.Version, c.Input, c.CallID))
		return events.Outgoing{}, false
	}
	st := e.steps[i]
	if st.CallID != c.CallID {
		what := "the call differs"
		if st.Iteration != c.Iteration {
			what = fmt.Sprintf("the call belongs to iteration %d, not %d", c.Iteration, st.Iteration)
		}
		e.diverge(i, nil, what, e.recordedCall(st.CallID), describe(c.Name, c.Version, c.Input, c.CallID))
		return events.Outgoing{}, false
	}
	e.answered[c.CallID] = true
	env, haveEnv := e.recorded[c.CallID]
	if reason := e.liveReason(c, env, haveEnv); e.live && reason == "" {
		e.reexecuted = append(e.reexecuted, c.CallID)
		e.ok(i, "live")
		out, err := events.NewCallRequest(Source, "approved", c, trace)
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
	out, err := events.NewCallCompleted(Source, c.RunID, env, c.Tenant, trace)
	if err != nil {
		e.diverge(i, nil, "the recorded envelope cannot be replayed", "", err.Error())
		return events.Outgoing{}, false
	}
	return out, true
}

// liveReason says why a call keeps its recorded envelope with Live ("" when
// it is executed again).
func (e *engine) liveReason(c events.CallRequest, env envelope.ToolEnvelope, haveEnv bool) string {
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
	if _, requested := e.requested[env.CallID]; !requested {
		// The orchestrator answered this call itself (the model named no valid
		// tool): its id must be the recorded one.
		i, ok := e.idStep[env.CallID]
		if !ok {
			extra := Step{N: len(e.steps), Kind: StepToolCall, CallID: env.CallID, Tool: env.Name}
			e.diverge(0, &extra, "the orchestrator answers a call the recorded run did not make",
				"no such call", describe(env.Name, env.Version, env.Input, env.CallID))
			return
		}
		e.ok(i, "orchestrator")
		return
	}
	rec, ok := e.recorded[env.CallID]
	if !ok {
		return
	}
	if same, recJSON, repJSON := sameResult(rec, env); !same {
		c := e.requested[env.CallID]
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

// sameResult compares two envelopes' outputs and errors (not their times or
// cache flags).
func sameResult(a, b envelope.ToolEnvelope) (bool, json.RawMessage, json.RawMessage) {
	ra, rb := resultJSON(a), resultJSON(b)
	return bytes.Equal(ra, rb), ra, rb
}

// endOfRecording ends a replay that reached the end of what was recorded
// without a divergence.
func (e *engine) endOfRecording(why string) {
	out := len(e.steps) - 1
	if e.b.Status == events.StatusFailed {
		e.steps[out].Checked, e.steps[out].OK = true, true
		e.finish()
		return
	}
	e.diverge(out, nil, why, "run "+e.b.Status, "the recording ends here")
}

// onOutcome compares how the replayed run ended with the recording.
func (e *engine) onOutcome(s events.RunStatus) {
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

package orchestrator

import (
	"slices"
	"strconv"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Run phases.
const (
	// PhaseAwaitingTools: turn Iteration is recorded; its calls are pending.
	PhaseAwaitingTools = "awaiting_tools"
	// PhaseCalling: every call of turn Iteration-1 is answered; the model
	// call of turn Iteration is due (or running).
	PhaseCalling  = "calling"
	PhaseComplete = "completed"
	PhaseFailed   = "failed"
	// PhaseCancelled: ended on request (cancel.go).
	PhaseCancelled = "cancelled"
)

// stateVersion is the version of RunState this build writes.
const stateVersion = 2

// RunState is what the loop needs to decide what comes next in a run, kept
// in KV and changed by compare-and-set. It is bounded: it holds the calls of
// the current turn and the run's counters, never the conversation (rebuilt
// from the run's events when the model is called) nor an envelope (each is in
// its completed event).
type RunState struct {
	V         int    `json:"v"`
	RunID     string `json:"run_id"`
	Phase     string `json:"phase"`
	Iteration int    `json:"iteration"`

	// What the loop needs of the request, so that it need not read it back
	// for every event.
	Tenant       envelope.Tenant `json:"tenant"`
	Agent        string          `json:"agent"`
	Model        events.ModelRef `json:"model"`
	Policy       envelope.Policy `json:"policy"`
	EnabledTools []string        `json:"enabled_tools"`
	Trace        events.RunTrace `json:"trace"`

	// Calls is how many tool calls the run has made: the last seq given out.
	Calls int `json:"calls"`
	// Spend is what the run has cost so far: its model turns at the price
	// table and the cost of its billed calls (each envelope's Cost).
	Spend float64 `json:"spend"`
	// LastTokens are the input and output tokens of the last model call,
	// which the next prompt repeats: the least the next call costs.
	LastTokens int `json:"last_tokens"`
	// Pending are the calls of turn Iteration (of Iteration-1 while the run
	// is calling the model).
	Pending []PendingCall `json:"pending,omitempty"`
	// Trigger names the event whose handler drives the run's next model
	// call: the run request ("request"), or the completion that answered
	// the last pending call ("call/<call_id>"). Only that handler, or that
	// event redelivered when its handler died, makes the call: a model
	// call is not made twice because another event of the run came again.
	Trigger string `json:"trigger,omitempty"`

	// Denied is the loop verdict that ended the run, when one did.
	Denied *events.LoopVerdict `json:"denied,omitempty"`
	Reason string              `json:"reason,omitempty"`
	// Code is the error code of a failed run, when one applies.
	Code envelope.ErrorCode `json:"code,omitempty"`
	// Cancel is set once the run is asked to stop (cancel.go): no model
	// call follows, and the run ends cancelled once the calls of its turn
	// have their envelopes.
	Cancel *Cancel `json:"cancel,omitempty"`

	// Rejections counts the final answers that failed the agent's output
	// schema and went back to the model.
	Rejections int `json:"rejections,omitempty"`
	// StopAt are the agent's stop_at_tools; StopCall is the call whose
	// success ended the run, its output the answer.
	StopAt   []string `json:"stop_at,omitempty"`
	StopCall string   `json:"stop_call,omitempty"`

	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Deadline is when the run must have ended: its request's time plus
	// its deadline_s (or the server's default). A run still going then is
	// failed by the reaper (reaper.go); zero in a state written before
	// deadlines.
	Deadline time.Time `json:"deadline"`
}

// pastDeadline reports whether the run has a deadline and it has passed.
func (s *RunState) pastDeadline(now time.Time) bool {
	return !s.Deadline.IsZero() && !now.Before(s.Deadline)
}

// PendingCall is one call of the current turn.
type PendingCall struct {
	CallID         string `json:"call_id"`
	Seq            int    `json:"seq"`
	Name           string `json:"name"`
	Version        string `json:"version,omitempty"`
	ProviderCallID string `json:"provider_call_id,omitempty"`
	// Done is set when its envelope came; Error when that envelope is a
	// failure.
	Done  bool `json:"done,omitempty"`
	Error bool `json:"error,omitempty"`
	// Approval is "" for a call that needs no decision, ApprovalWaiting while
	// it waits for one (the run is suspended) and ApprovalResumed once its
	// approval or completion arrived; ResumedBy says which.
	Approval  string `json:"approval,omitempty"`
	ResumedBy string `json:"resumed_by,omitempty"`
}

// Approval states of a call.
const (
	ApprovalWaiting = "waiting"
	ApprovalResumed = "resumed"
)

// ref is the call's name@version, or its bare name when no version matched.
func (c *PendingCall) ref() string {
	if c.Version == "" {
		return c.Name
	}
	return c.Name + "@" + c.Version
}

// Done reports whether the run has ended.
func (s *RunState) Done() bool {
	return s.Phase == PhaseComplete || s.Phase == PhaseFailed || s.Phase == PhaseCancelled
}

// call returns the pending call id, or nil.
func (s *RunState) call(id string) *PendingCall {
	for i := range s.Pending {
		if s.Pending[i].CallID == id {
			return &s.Pending[i]
		}
	}
	return nil
}

// allDone reports whether every pending call has its envelope.
func (s *RunState) allDone() bool {
	for _, c := range s.Pending {
		if !c.Done {
			return false
		}
	}
	return true
}

// fail ends the run with a reason (and an error code, when one applies).
func (s *RunState) fail(code envelope.ErrorCode, reason string) {
	s.Phase, s.Code, s.Reason = PhaseFailed, code, reason
}

// clone copies the state deeply enough for a change.
func (s *RunState) clone() *RunState {
	c := *s
	c.Pending = slices.Clone(s.Pending)
	c.EnabledTools = slices.Clip(s.EnabledTools)
	if s.Denied != nil {
		d := *s.Denied
		c.Denied = &d
	}
	if s.Cancel != nil {
		x := *s.Cancel
		c.Cancel = &x
	}
	return &c
}

// recordTurn makes turn t the run's current turn: its calls pending (those
// the orchestrator answered itself are done at once), its cost spent; a turn
// that answers without calls completes the run, and a denied one fails it.
// It reports whether it changed the state (a turn already recorded changes
// nothing). Going on from a turn whose calls are all answered is the
// trigger's (Service.goOn).
func (s *RunState) recordTurn(t *events.Turn) bool {
	if s.Done() || t.Iteration < s.Iteration || (t.Iteration == s.Iteration && s.Phase == PhaseAwaitingTools) {
		return false
	}
	s.Iteration = t.Iteration
	if !t.Verdict.Allowed {
		v := t.Verdict
		s.Denied = &v
		s.fail(v.Code, "policy denied iteration "+strconv.Itoa(t.Iteration)+": "+v.Reason)
		s.Pending = nil
		return true
	}
	s.Spend += t.Cost
	if t.Response != nil {
		s.LastTokens = t.Response.Usage.InputTokens + t.Response.Usage.OutputTokens
	}
	s.Pending = s.Pending[:0]
	for _, c := range t.Calls {
		p := PendingCall{CallID: c.CallID, Seq: c.Seq, Name: c.Name, Version: c.Version, ProviderCallID: c.ProviderCallID}
		if c.Answered {
			p.Done, p.Error = true, true // its envelope is the orchestrator's refusal
		}
		s.Pending = append(s.Pending, p)
		s.Calls = max(s.Calls, c.Seq)
	}
	s.Phase = PhaseAwaitingTools
	if t.Rejected != nil {
		// The answer goes back to the model: the next model call follows
		// as after a turn whose calls are all answered (Service.goOn).
		s.Rejections = max(s.Rejections, t.Rejected.Attempt)
		s.Pending = nil
		return true
	}
	if len(s.Pending) == 0 {
		s.Pending = nil
		if t.Response != nil {
			s.Phase = PhaseComplete
		}
	}
	return true
}

// stopCall is the first call of the current turn, in call order, that
// succeeded and names a stop_at_tools tool; "" when none did.
func (s *RunState) stopCall() string {
	for _, c := range s.Pending {
		if c.Done && !c.Error && slices.Contains(s.StopAt, c.Name) {
			return c.CallID
		}
	}
	return ""
}

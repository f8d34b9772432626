package store

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Approval states of a call, as its recorded events show them (ApprovalOf).
const (
	ApprovalPending  = string(events.ApprovalPending)
	ApprovalApproved = string(events.ApprovalApproved)
	ApprovalDenied   = string(events.ApprovalDenied)
	ApprovalRevised  = string(events.ApprovalRevised)
	ApprovalExpired  = string(events.ApprovalExpired)
	// ApprovalWithdrawn: the run was cancelled while the call waited, and
	// the guard answered it (POLICY_DENIED, details.cancelled) instead of a
	// decision.
	ApprovalWithdrawn = string(events.ApprovalWithdrawn)
)

// Approval is what a call's recorded events say of its approval: the
// decision the Policy Guard applied, which its outcome shows, and the
// decisions it did not apply. The guard applies one decision per call,
// the first it takes (services/policy/approvals.go, handleDecision), and
// publishes its outcome: the call approved to its queue (operator_approved),
// or its completion with the approval in the error's details ("approval":
// approve, deny, revise or timeout). Any decision recorded besides the
// applied one was ignored, however late it was recorded: the last decision
// recorded is not the one that took effect.
type Approval struct {
	// State is "" when the call waited for no approval; else pending until
	// the guard's outcome is recorded, then approved, denied, revised,
	// expired (no decision by the deadline) or withdrawn (the run was
	// cancelled while the call waited).
	State string
	// Applied is the decision the guard applied (nil while pending, and
	// for an expired approval). Its Event is "" when the outcome is
	// recorded but no recorded decision matches it.
	Applied *DecisionRow
	// Ignored are the decisions the guard did not apply, in recorded order.
	Ignored []DecisionRow
	// Awaiting are the decisions recorded while the outcome is not: the
	// guard applies one of them (or none, past the deadline).
	Awaiting []DecisionRow
}

// DecisionRow is one operator's decision on a call, as recorded.
type DecisionRow struct {
	// Event is the id of the decided event, Seq its recorded order.
	Event    string
	Seq      int64
	Time     time.Time
	Decision string // approve, deny or revise
	By, Note string
	// Why says why an ignored decision was: the call was decided already,
	// its approval had timed out, or it had ended.
	Why string
}

// outcome is the guard's outcome of a call's approval, from its events.
type outcome struct {
	kind     string // approve, deny, revise, timeout; "" for an end of no approval
	by, note string
	detailed bool // by and note are the outcome's (a denial's details)
}

// ApprovalOf reads a call's approval from its recorded events (one call's,
// in recorded order: Store.Events narrowed to the call).
func ApprovalOf(evs []EventRow) Approval {
	var a Approval
	var decisions []DecisionRow
	var out *outcome
	asked := false
	for i := range evs {
		e := &evs[i]
		switch e.Type {
		case events.TypeCallApprovalRequired:
			asked = true
		case events.TypeCallDecided:
			var d events.Decision
			if json.Unmarshal(e.Data, &d) != nil {
				continue
			}
			decisions = append(decisions, DecisionRow{Event: e.ID, Seq: e.Seq, Time: e.Time,
				Decision: string(d.Decision), By: d.By, Note: d.Note})
		case events.TypeCallApproved:
			var c struct {
				OperatorApproved bool `json:"operator_approved"`
			}
			if out == nil && json.Unmarshal(e.Data, &c) == nil && c.OperatorApproved {
				out = &outcome{kind: string(events.DecisionApprove)}
			}
		case events.TypeCallCompleted:
			if out == nil {
				out = completionOutcome(e.Data)
			}
		}
	}
	if !asked && len(decisions) == 0 && (out == nil || out.kind == "") {
		return a // the call waited for no approval
	}
	switch {
	case out == nil:
		a.State, a.Awaiting = ApprovalPending, decisions
		return a
	case out.kind == "timeout":
		a.State = ApprovalExpired
	case out.kind == ApprovalWithdrawn:
		a.State = ApprovalWithdrawn
	case out.kind == "":
		// The call ended otherwise (its run ended, say) while it waited.
		a.State = ApprovalPending
		if len(decisions) == 0 {
			return a
		}
	default:
		a.State = map[string]string{"approve": ApprovalApproved, "deny": ApprovalDenied, "revise": ApprovalRevised}[out.kind]
		applied := -1
		for i, d := range decisions { // the first that says what the outcome says
			if d.Decision == out.kind && (!out.detailed || d.By == out.by && strings.TrimSpace(d.Note) == out.note) {
				applied = i
				break
			}
		}
		if applied < 0 {
			for i, d := range decisions {
				if d.Decision == out.kind {
					applied = i
					break
				}
			}
		}
		if applied >= 0 {
			d := decisions[applied]
			a.Applied = &d
			decisions = append(decisions[:applied:applied], decisions[applied+1:]...)
		} else {
			a.Applied = &DecisionRow{Decision: out.kind, By: out.by, Note: out.note}
		}
	}
	why := "the call was already " + a.State
	switch {
	case a.State == ApprovalExpired:
		why = "the approval had timed out"
	case a.State == ApprovalWithdrawn:
		why = "the approval was withdrawn: the run was cancelled"
	case out.kind == "":
		why = "the call had ended"
	case a.Applied != nil && a.Applied.By != "":
		why += " by " + a.Applied.By
	}
	for _, d := range decisions {
		d.Why = why
		a.Ignored = append(a.Ignored, d)
	}
	return a
}

// completionOutcome reads a call's envelope: the guard's outcome of its
// approval when its error's details name one, else an end of no approval.
func completionOutcome(data json.RawMessage) *outcome {
	var env struct {
		Error *struct {
			Code    envelope.ErrorCode `json:"code"`
			Details map[string]any     `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &env) != nil || env.Error == nil {
		return &outcome{}
	}
	str := func(k string) string { s, _ := env.Error.Details[k].(string); return s }
	if c, _ := env.Error.Details["cancelled"].(bool); c && str("approval") == "" {
		// Withdrawn by the run's cancellation (events.CancelledCallError).
		return &outcome{kind: ApprovalWithdrawn}
	}
	switch k := str("approval"); k {
	case "deny", "revise":
		return &outcome{kind: k, by: str("by"), note: str("note"), detailed: true}
	case "approve", "timeout": // approved, and no worker of its queue; or no decision in time
		return &outcome{kind: k}
	}
	return &outcome{}
}

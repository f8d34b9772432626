package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Approvals: a call that needs an operator's decision (docs/policy.md,
// Approvals).
//
// When the run's policy requires approval for a call, the Policy Guard stores
// an ApprovalRecord in the KV bucket BucketApprovals (key ApprovalKey) and
// publishes toolwire.call.<run_id>.<call_id>.approval_required with an
// ApprovalRequest. An operator answers with toolwire.call.<run_id>.<call_id>.decided
// (a Decision: approve, deny or revise); the guard then publishes the call as
// approved, or completes it with a POLICY_DENIED envelope. A call with no
// decision by its deadline is denied.

// BucketApprovals is the KV bucket of approval records, keyed by ApprovalKey.
const BucketApprovals = "toolwire_approvals"

// Previews (a tool's dry run for an approval request) are asked of the
// executors by core NATS request/reply, not through a stream: nothing is kept,
// and an unanswered request just means "preview unavailable".
const (
	// SubjectPreview is the request subject; the request's data is the
	// CallRequest as JSON, the reply an ApprovalPreview as JSON.
	SubjectPreview = Prefix + ".rpc.preview"
	// QueuePreview is the executors' queue group on SubjectPreview: one
	// replica answers each request.
	QueuePreview = "executor-preview"
)

// Schema names of the approval events' data.
const (
	SchemaApprovalRequest = "event_approval_request"
	SchemaDecision        = "event_decision"
)

// ApprovalRequest is the data of an approval_required event: what an operator
// needs to decide on one tool call.
type ApprovalRequest struct {
	RunID string `json:"run_id"`
	// CorrelationID is the call's id; a Decision names it.
	CorrelationID string          `json:"correlation_id"`
	ToolName      string          `json:"tool_name"`
	ToolVersion   string          `json:"tool_version"`
	AgentName     string          `json:"agent_name"`
	Tenant        envelope.Tenant `json:"tenant"`
	// ArgsSummary shows the call's arguments with secret-looking fields and
	// long values stripped: safe to display.
	ArgsSummary string `json:"args_summary"`
	// EffectDescription says what the call will change.
	EffectDescription string `json:"effect_description"`
	// Reason says which policy setting asked for approval.
	Reason string `json:"reason"`
	// Preview is the tool's dry run, when its definition supports one.
	Preview *ApprovalPreview `json:"preview,omitempty"`
	// Gate is the gate matrix's verdict that put the call to an operator
	// (preview or confirm) and its cell; absent when only the policy's
	// approval list did.
	Gate *envelope.GateVerdict `json:"gate,omitempty"`
	// ExpiresAt is the deadline: no decision by then denies the call.
	ExpiresAt time.Time `json:"expires_at"`
}

// ApprovalPreview is the result of a tool's dry run: its output, or why there
// is none.
type ApprovalPreview struct {
	Output      json.RawMessage `json:"output,omitempty"`
	Unavailable string          `json:"unavailable,omitempty"`
}

// DecisionKind is an operator's answer to an approval request.
type DecisionKind string

// Decisions.
const (
	// DecisionApprove runs the call.
	DecisionApprove DecisionKind = "approve"
	// DecisionDeny answers the call with POLICY_DENIED ("approval denied").
	DecisionDeny DecisionKind = "deny"
	// DecisionRevise answers the call with POLICY_DENIED carrying the
	// operator's note, so that the model may propose a revised call.
	DecisionRevise DecisionKind = "revise"
)

// Limits of a Decision.
const (
	MaxDecisionNote = 4000 // bytes
	MaxDecisionBy   = 128  // bytes
)

// ErrInvalidDecision is wrapped by Decision.Validate.
var ErrInvalidDecision = errors.New("invalid decision")

// Decision is the data of a decided event: an operator's answer to the
// approval request of one call.
type Decision struct {
	RunID    string       `json:"run_id"`
	CallID   string       `json:"call_id"`
	Decision DecisionKind `json:"decision"`
	// Note is the operator's message; required to revise.
	Note string `json:"note,omitempty"`
	// By names who decided.
	By string `json:"by,omitempty"`
}

// Validate checks the decision's ids, kind and texts.
func (d Decision) Validate() error {
	var problems []string
	if err := ValidateRunID(d.RunID); err != nil {
		problems = append(problems, err.Error())
	}
	if err := ValidateCallID(d.CallID); err != nil {
		problems = append(problems, err.Error())
	}
	switch d.Decision {
	case DecisionApprove, DecisionDeny:
	case DecisionRevise:
		if strings.TrimSpace(d.Note) == "" {
			problems = append(problems, "a revise decision needs a note: it is what the model is told")
		}
	default:
		problems = append(problems, fmt.Sprintf("decision %q is not one of approve, deny, revise", d.Decision))
	}
	if len(d.Note) > MaxDecisionNote || !utf8.ValidString(d.Note) {
		problems = append(problems, fmt.Sprintf("note must be valid UTF-8 of at most %d bytes", MaxDecisionNote))
	}
	if len(d.By) > MaxDecisionBy || !utf8.ValidString(d.By) {
		problems = append(problems, fmt.Sprintf("by must be valid UTF-8 of at most %d bytes", MaxDecisionBy))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidDecision, strings.Join(problems, "; "))
	}
	return nil
}

// NewApprovalRequired builds the approval request of a call. Its id is
// "<run_id>/<call_id>/approval_required": one request per call.
func NewApprovalRequired(source string, a ApprovalRequest, trace RunTrace) (Outgoing, error) {
	return buildCall(TypeCallApprovalRequired, "call", "approval_required",
		Attrs{Source: source, RunID: a.RunID, CallID: a.CorrelationID, TenantID: a.Tenant.ID(), Trace: trace}, a)
}

// NewDecided builds an operator's decision on a call. Its id is
// "<run_id>/<call_id>/decided/<decision>": the same decision published
// twice is one (JetStream drops the second within its duplicate window),
// while an opposite one is an event of its own, which the guard ignores
// (it applies only the first decision it takes) and the recorder keeps,
// so that the call's audit shows it as ignored.
func NewDecided(source string, d Decision, tenant envelope.Tenant, trace RunTrace) (Outgoing, error) {
	if err := d.Validate(); err != nil {
		return Outgoing{}, err
	}
	out, err := buildCall(TypeCallDecided, "call", "decided",
		Attrs{Source: source, RunID: d.RunID, CallID: d.CallID, TenantID: tenant.ID(), Trace: trace}, d)
	if err != nil {
		return Outgoing{}, err
	}
	out.Event.SetID(out.Event.ID() + "/" + string(d.Decision))
	return out, nil
}

// ApprovalState is the state of an ApprovalRecord.
type ApprovalState string

// Approval states: pending until decided or expired.
const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDenied   ApprovalState = "denied"
	ApprovalRevised  ApprovalState = "revised"
	ApprovalExpired  ApprovalState = "expired"
	// ApprovalWithdrawn: the call's run was cancelled while it waited
	// (cancel.go); the call is answered POLICY_DENIED, and a decision that
	// comes later is refused.
	ApprovalWithdrawn ApprovalState = "withdrawn"
)

// ApprovalRecord is the KV record of one call's approval. The Policy Guard
// creates it pending and moves it, by compare-and-set, to exactly one final
// state; Settled records that the outcome event is stored.
type ApprovalRecord struct {
	State   ApprovalState   `json:"state"`
	Call    CallRequest     `json:"call"`
	Request ApprovalRequest `json:"request"`
	// RequestedAt is when the guard held the call; Deadline is RequestedAt
	// plus the policy's approval timeout, which a timed-out call's denial
	// names (the approved call no longer carries the policy).
	RequestedAt time.Time `json:"requested_at,omitzero"`
	Deadline    time.Time `json:"deadline"`
	// Decision is the decision that settled the call (none when it expired).
	Decision  *Decision  `json:"decision,omitempty"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	Settled   bool       `json:"settled,omitempty"`
	// Routed is set once the guard has checked that the approved call's
	// queue has a live worker; Unserved then names the queue when it had
	// none within the guard's queue wait, and the call's outcome is a
	// PROVIDER_ERROR completion instead of its approval. Both are stored
	// (compare-and-set) before the outcome is published, so that every
	// replica that settles the record publishes the same outcome.
	Routed   bool   `json:"routed,omitempty"`
	Unserved string `json:"unserved,omitempty"`
	// Withdrawn says why a withdrawn record was (its run's cancel,
	// CancelRequest.Said).
	Withdrawn string `json:"withdrawn,omitempty"`
	// Trace is the run's trace, for the events published on a decision.
	Trace RunTrace `json:"trace,omitzero"`
}

// Pending reports whether the call still waits for a decision.
func (r *ApprovalRecord) Pending() bool { return r.State == ApprovalPending }

// ApprovalKey is the KV key of a call's approval record: "<run_id>.<call_id>".
func ApprovalKey(runID, callID string) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	if err := ValidateCallID(callID); err != nil {
		return "", err
	}
	return runID + "." + callID, nil
}

// DecodeApprovalRecord decodes a record read from BucketApprovals.
func DecodeApprovalRecord(b []byte) (ApprovalRecord, error) {
	var r ApprovalRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return ApprovalRecord{}, fmt.Errorf("approval record: %w", err)
	}
	switch r.State {
	case ApprovalPending, ApprovalApproved, ApprovalDenied, ApprovalRevised, ApprovalExpired, ApprovalWithdrawn:
	default:
		return ApprovalRecord{}, fmt.Errorf("approval record: unknown state %q", r.State)
	}
	return r, nil
}

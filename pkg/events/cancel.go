package events

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Cancelling a run (docs/agent-loop.md, Cancellation).
//
// A cancel request, toolwire.run.<run_id>.cancel_requested with a
// CancelRequest, is published by an operator, by a producer trusted with
// every tenant, by the recorder for an approver or admin of the run's
// tenant (the HTTP API and the timeline page) or by the orchestrator, which
// hands a tenant producer's cancel over from the tenant's intake once it
// has checked that the run is that tenant's. nats-server lets no one else
// publish on the subject (pkg/service/identity/roles.go).
//
// The orchestrator stops the run's loop (no model call after it), the
// Policy Guard withdraws the run's waiting approvals (each answered with a
// POLICY_DENIED envelope, a late decision refused), executors, workers and
// the sandbox stop the run's calls (the tool's context, an HTTP request, a
// sandbox job killed), each answered with an envelope saying it was cut
// short, and once every call of the run's turn has its envelope, or the
// grace has passed, the run ends with toolwire.run.<run_id>.cancelled: a
// RunStatus with status cancelled whose outputs hold what completed.

// Cancel event types.
const (
	TypeRunCancelRequested = "dev.toolwire.run.cancel_requested.v1" // data: CancelRequest
	TypeRunCancelled       = "dev.toolwire.run.cancelled.v1"        // data: RunStatus (with outputs)
)

// StatusCancelled is the status of a run that was cancelled: one of its
// three ends.
const StatusCancelled = "cancelled"

// Verbs of cancellation.
const (
	VerbCancelRequested Verb = "cancel_requested"
	VerbCancelled       Verb = "cancelled"
)

// Subjects of cancellation, for every run.
const (
	FilterRunCancelRequested Filter = Prefix + ".run.*.cancel_requested"
	FilterRunCancelled       Filter = Prefix + ".run.*.cancelled"
)

// SchemaCancelRequest names the JSON Schema of a CancelRequest.
const SchemaCancelRequest = "event_cancel_request"

// Limits of a CancelRequest.
const (
	MaxCancelReason = 1000 // bytes
	MaxCancelBy     = 128  // bytes
)

// ErrInvalidCancel is wrapped by CancelRequest.Validate.
var ErrInvalidCancel = errors.New("invalid cancel request")

// CancelRequest is the data of a cancel_requested event.
type CancelRequest struct {
	RunID string `json:"run_id"`
	// Reason says why; it is the reason of the run's end and of the
	// envelopes of the calls cut short.
	Reason string `json:"reason,omitempty"`
	// By names who asked (a user, a token's subject, "operator").
	By string `json:"by,omitempty"`
	// Tenant is the tenant the request was made for: the run's, checked by
	// whoever published it (the orchestrator refuses a cancel whose tenant
	// is not the run's).
	Tenant envelope.Tenant `json:"tenant"`
	// RequestedAt is when it was asked for.
	RequestedAt time.Time `json:"requested_at"`
}

// Validate checks what the schema cannot say.
func (c CancelRequest) Validate() error {
	var problems []string
	if err := ValidateRunID(c.RunID); err != nil {
		problems = append(problems, err.Error())
	}
	if len(c.Reason) > MaxCancelReason || !utf8.ValidString(c.Reason) {
		problems = append(problems, fmt.Sprintf("reason must be valid UTF-8 of at most %d bytes", MaxCancelReason))
	}
	if len(c.By) > MaxCancelBy || !utf8.ValidString(c.By) {
		problems = append(problems, fmt.Sprintf("by must be valid UTF-8 of at most %d bytes", MaxCancelBy))
	}
	if c.Tenant.OrgID == "" {
		problems = append(problems, "tenant.org_id is required")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidCancel, strings.Join(problems, "; "))
	}
	return nil
}

// Covers reports whether the cancel was made for tenant t: its org, and its
// workspace when it names one. Whoever published it checked that it is the
// run's; a call or job of another tenant under the run's id is not the
// run's.
func (c CancelRequest) Covers(t envelope.Tenant) bool {
	return c.Tenant.OrgID == t.OrgID && (c.Tenant.WorkspaceID == "" || c.Tenant.WorkspaceID == t.WorkspaceID)
}

// DecodeCancel reads the cancel request e, received on subject: its type,
// its data (strictly, then Validate) and that its run is the subject's.
func DecodeCancel(e *event.Event, subject string) (CancelRequest, error) {
	var c CancelRequest
	if e.Type() != TypeRunCancelRequested {
		return c, fmt.Errorf("%w: event %s has type %q, want %s", ErrInvalidCancel, e.ID(), e.Type(), TypeRunCancelRequested)
	}
	if err := DecodeData(e, &c); err != nil {
		return c, err
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	if want, err := RunSubject(c.RunID, VerbCancelRequested); err != nil || want != subject {
		return c, fmt.Errorf("%w: cancel of run %q on subject %s", ErrInvalidCancel, c.RunID, subject)
	}
	return c, nil
}

// Said is the reason as the run's end and its cut calls say it.
func (c CancelRequest) Said() string {
	s := "cancelled"
	if c.By != "" {
		s += " by " + c.By
	}
	if c.Reason != "" {
		s += ": " + c.Reason
	}
	return s
}

// CancelRequestedID is the id of run runID's cancel request: a run is
// cancelled once, however often it is asked (a request published again
// within the stream's duplicate window is dropped; after it, the
// orchestrator ignores a cancel of a run that is ending or has ended).
func CancelRequestedID(runID string) string { return runID + "/cancel_requested" }

// NewCancelRequested builds a cancel request.
func NewCancelRequested(source string, c CancelRequest, trace RunTrace) (Outgoing, error) {
	if err := c.Validate(); err != nil {
		return Outgoing{}, err
	}
	if c.RequestedAt.IsZero() {
		c.RequestedAt = time.Now().UTC()
	}
	subj, err := RunSubject(c.RunID, VerbCancelRequested)
	if err != nil {
		return Outgoing{}, err
	}
	return Build(TypeRunCancelRequested, CancelRequestedID(c.RunID), subj,
		Attrs{Source: source, RunID: c.RunID, TenantID: c.Tenant.ID(), Trace: trace}, c)
}

// CancelledCallError is the error of the envelope of a call its run's
// cancellation cut short or kept from starting: POLICY_DENIED for a call
// that never started (or whose approval was withdrawn), TIMEOUT for one
// stopped while it ran; its details say cancelled, and why.
func CancelledCallError(started bool, said string) *envelope.ToolError {
	details := map[string]any{"cancelled": true, "reason": said}
	if started {
		return envelope.NewToolError(envelope.CodeTimeout, "stopped: the run was %s", said).WithDetails(details)
	}
	return envelope.NewToolError(envelope.CodePolicyDenied, "not run: the run was %s", said).WithDetails(details)
}

// IsCancelledCall reports whether e is the error of a call its run's
// cancellation cut short or kept from starting.
func IsCancelledCall(e *envelope.ToolError) bool {
	if e == nil {
		return false
	}
	d, ok := e.Details.(map[string]any)
	return ok && d["cancelled"] == true
}

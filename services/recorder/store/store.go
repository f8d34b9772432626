// Package store is what the recorder keeps, and the rules it keeps it by: the
// Store interface, whose doc says how the materialized rows converge whatever
// order events arrive in; the records and rows; and RecordOf, which turns a
// consumed event into the record that stores it (one decoder per event type
// of events.Table).
//
// The backends are in store/postgres (production) and store/sqlite (the
// embedded store of `toolwire dev`); both pass the contract suite of
// store/storetest, which enforces the rules. A new backend implements Store
// and runs that suite.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Store is what the recorder keeps: every event it consumed, and the runs,
// tool calls, model turns, verdicts and tool definitions materialized from
// them. The materializer writes through Write; the HTTP API reads through the
// rest.
//
// Every implementation passes the contract suite of package storetest, which
// pins down the rules below: postgres.Store (production) and sqlite.Store (the
// embedded default of `toolwire dev`).
type Store interface {
	// Tokens keeps the API's tokens (tokens.go).
	Tokens

	// Write stores the records in one transaction: all of them or none. A
	// record whose event is already stored (its run and id: EventKey)
	// changes nothing, so a redelivered event is harmless; an event of
	// another run under the same id is another event. Every new record's event is stored; its effects pass
	// the gate of Admit first (gate.go), as the services would accept them: a
	// run's rows come from its run request only (a second one changes
	// nothing), a call's from the turn that requested it only, and nothing
	// dated after a run's end changes it. A record that waits for its run's
	// request or its call's turn is parked, and applied, in the order it came,
	// when that is written. The materialized rows converge to the same state
	// whatever order the records arrive in (except that an event dated after
	// the run's end that is written before the end applies: nothing ended it
	// yet):
	//
	//   - a run's status moves forward only, along requested < started <
	//     suspended | resumed < completed | failed; between two statuses of the
	//     same rank the later event (by event time) wins, but between two ends
	//     (completed, failed) the earlier one. reason and
	//     completed_at follow the winning status (a model turn counts as
	//     started: run.started is only published for a slow first model call);
	//   - a run's request, tenant and agent come from its run request, or
	//     from the first event that named them when the request has none;
	//   - iteration and tool call counts only grow; created_at is the earliest
	//     event's time, updated_at the latest one's;
	//   - a completed (or cancelled) run's outputs, pinned handles and outputs
	//     blob: the first reported wins;
	//   - a tool call's status moves forward only, along requested < approved <
	//     started < completed (the model turn that made it requests it); once
	//     its envelope has arrived, the envelope's name, version, input and
	//     times win over those of other events, and the envelope alone sets
	//     the call's cost; its queue is the first named;
	//   - the first model turn and the first verdict of an iteration win (the
	//     verdict is the loop rules' verdict carried by the turn; the turn that
	//     ended a run rides on its completed or failed event);
	//   - a run's spend only grows (the greatest reported wins);
	//   - the first definition recorded for a tool version in a run wins.
	//
	// Since contract v2 (issue 15) one record may update several tool calls:
	// a model turn's event requests every call it made.
	Write(ctx context.Context, recs ...Record) error

	// Run returns one run, or an error wrapping ErrRunNotFound.
	Run(ctx context.Context, runID string) (Run, error)
	// ToolCalls returns a run's tool calls in order: by seq, then by start
	// time, then by call id (a call whose request has not arrived yet has no
	// seq and sorts last).
	ToolCalls(ctx context.Context, runID string) ([]ToolCall, error)
	// Envelopes returns the envelopes of a run's completed calls, in the
	// order of ToolCalls.
	Envelopes(ctx context.Context, runID string) ([]json.RawMessage, error)
	// ListRuns returns the runs that match f, newest first (by created_at,
	// then run id), without their Request, Outputs, Pinned and OutputsBlob.
	ListRuns(ctx context.Context, f RunFilter) ([]Run, error)
	// Events returns the events stored for a run in the order they were
	// recorded.
	Events(ctx context.Context, runID string) ([]EventRow, error)
	// EventsAfter returns at most limit events of a run recorded after the
	// event whose Seq is after (0: from the first), in recorded order. A live
	// stream resumes with it, so an event it returns must never be followed
	// by one with a lower Seq: a store with concurrent writers returns only
	// the events no running transaction can precede.
	EventsAfter(ctx context.Context, runID string, after int64, limit int) ([]EventRow, error)

	// ToolCall returns one tool call, or an error wrapping ErrCallNotFound.
	ToolCall(ctx context.Context, runID, callID string) (ToolCall, error)
	// Turns returns a run's model turns by iteration.
	Turns(ctx context.Context, runID string) ([]TurnRow, error)
	// Verdicts returns the loop rules' verdicts of a run by iteration (for a
	// run recorded before contract v2, the Policy Guard's iteration
	// verdicts).
	Verdicts(ctx context.Context, runID string) ([]VerdictRow, error)
	// RunTools returns the tool definitions a run's model was offered, as they
	// were when it was offered them, by name then version.
	RunTools(ctx context.Context, runID string) ([]ToolDefRow, error)
	// CompletedRuns returns the completed runs of one agent node, the agent
	// name within one tenant, created before before, newest first, at most
	// limit, with their Outputs, Pinned and OutputsBlob (not their Request).
	// The tenant is matched whole: its org, its workspace and its user, each
	// exactly ("" matches only a run without one), so that a run's
	// stale_last_success pins never read another workspace's or user's
	// outputs.
	CompletedRuns(ctx context.Context, tenant envelope.Tenant, agent string, before time.Time, limit int) ([]Run, error)
}

// ErrRunNotFound is wrapped when a run is not in the store.
var ErrRunNotFound = errors.New("run not found")

// ErrCallNotFound is wrapped when a tool call is not in the store.
var ErrCallNotFound = errors.New("tool call not found")

// Default deadlines of a store's calls when the caller set none.
const (
	DefaultWriteTimeout = 30 * time.Second
	DefaultReadTimeout  = 10 * time.Second
)

// MigrationResult says what a backend's Migrate did.
type MigrationResult struct {
	// Applied lists the versions applied by this call; empty when the schema
	// was already up to date.
	Applied []int64
	// Version is the schema version after the call.
	Version int64
}

// ErrUnstorable is wrapped when the database refuses a record's data for what
// it is (for example text that is not UTF-8, or a NUL byte in a field kept
// as text): retrying cannot help, so the event is dead-lettered.
var ErrUnstorable = errors.New("data cannot be stored")

// Record is one consumed event and what it changes, ready to be written. The
// materializer builds it from a CloudEvent with RecordOf; a Store applies it.
// Run, Turn and Verdict are nil and Calls empty when the event does not touch
// them: an event of an unknown type has only its Event. Calls holds one update
// per call the event speaks of: one for a call event, one per call for a model
// turn (which requests them all), in the order the event gives them. Tools are
// the definitions of the tools a model turn offered, added by the recorder
// from the registry (RecordOf does no I/O and leaves them empty).
type Record struct {
	Event   EventRow
	Run     *RunUpdate
	Calls   []CallUpdate
	Turn    *TurnRow
	Verdict *VerdictRow
	Tools   []ToolDefRow
}

// ToolDefRow is the definition of one tool version as a run's model was
// offered it.
type ToolDefRow struct {
	RunID      string
	Name       string
	Version    string
	Definition json.RawMessage // envelope.ToolDefinition
}

// EventKey is what a store keys an event by: its run and its id. An event
// id says what the event announces within its run, so two runs may hold
// events of one id (issue 29); RunID is "" for an event of no run.
type EventKey struct {
	RunID string
	ID    string
}

// Key is the event's key.
func (e *EventRow) Key() EventKey { return EventKey{RunID: e.RunID, ID: e.ID} }

// EventRow is one consumed CloudEvent as the events table keeps it. The API
// shows it as apitypes.EventJSON (the same fields).
type EventRow struct {
	ID      string
	Type    string
	Source  string
	Subject string // the NATS subject it was delivered on
	Time    time.Time
	RunID   string
	CallID  string
	// Stream and StreamSeq locate the event in JetStream (empty when the
	// event did not come from a stream).
	Stream    string
	StreamSeq uint64
	// Extensions are the CloudEvents extension attributes (runid, callid,
	// tenantid, traceparent, ...), so that the event can be republished as
	// it was.
	Extensions map[string]string
	Data       json.RawMessage
	// RecordedAt is set by the store.
	RecordedAt time.Time
	// Seq is the store's recorded order of events (set by the store; 0 on
	// write): a live stream's event id.
	Seq int64
}

// RunUpdate is what one event says about its run. Zero fields say nothing.
type RunUpdate struct {
	RunID string
	// At is the event's time: it orders statuses of the same rank and sets
	// created_at, updated_at and completed_at.
	At time.Time
	// Request is the run request as received; when set, its Tenant and Agent
	// override what earlier events said.
	Request json.RawMessage
	Tenant  envelope.Tenant
	Agent   string
	// Status is one of the events.Status* values or StatusRequested; "" leaves
	// the status as it is.
	Status  string
	Reason  string
	Outputs json.RawMessage // the AgentOutputs of a completed run, as received
	Pinned  json.RawMessage // its resolved pinned handles, as received
	// OutputsBlob is the envelope.Attachment naming the blob that holds a
	// completed run's outputs and pinned handles (an events.OutputsDocument)
	// when they were too large for its event, as received.
	OutputsBlob json.RawMessage
	TraceID     string
	// Iterations and ToolCalls are counts the event reports; the stored ones
	// are the greatest reported.
	Iterations int
	ToolCalls  int
	// Spend is the run's accrued cost as the event reports it (nil: the
	// event says nothing); the stored one is the greatest reported.
	Spend *float64
}

// CallUpdate is what one event says about a tool call. Zero fields say
// nothing.
type CallUpdate struct {
	RunID  string
	CallID string
	// Status is one of the Call* statuses.
	Status    string
	Seq       *int // from the model turn or the approved call
	Iteration *int // from the model turn or the approved call
	Name      string
	Version   string
	Input     json.RawMessage
	// Queue is the queue the call was routed to (its approved event).
	Queue  string
	TStart *time.Time
	// Envelope is set by the call's completion; the fields below come from it.
	Envelope  json.RawMessage
	TEnd      *time.Time
	LatencyMS *int64
	ErrorCode string
	Cached    bool
	Truncated bool
	// Cost is what the call cost the run, as its envelope says (nil: it says
	// nothing).
	Cost *float64
}

// TurnRow is one model turn of a run: the data of its turn event as it was
// sent (an events.Turn). A run recorded before contract v2 has the
// envelope.ModelTurn of its llm.completed event instead; DecodeTurn reads
// both.
type TurnRow struct {
	RunID     string
	Iteration int
	Turn      json.RawMessage
}

// VerdictRow is the verdict of the loop rules on one iteration, as its model
// turn carried it (before contract v2: the Policy Guard's answer to the
// iteration check).
type VerdictRow struct {
	RunID     string
	Iteration int
	Allowed   bool
	Code      string
	Reason    string
}

// StatusRequested is the status of a run whose request is all the recorder has
// seen (events.Status* has the others).
const StatusRequested = events.StatusRequested

// Tool call statuses, in the order a call moves through them (events.Table
// says which event implies which).
const (
	CallRequested = events.StatusRequested
	CallApproved  = events.CallStatusApproved
	CallStarted   = events.CallStatusStarted
	CallCompleted = events.CallStatusCompleted
)

// RunStatuses lists the run statuses in rank order.
func RunStatuses() []string {
	return []string{StatusRequested, events.StatusStarted, events.StatusSuspended,
		events.StatusResumed, events.StatusCompleted, events.StatusFailed, events.StatusCancelled}
}

// RunStatusRank orders run statuses: requested 0, started 1, suspended and
// resumed 2, completed, failed and cancelled 3 (terminal); anything else -1.
func RunStatusRank(s string) int {
	switch s {
	case StatusRequested:
		return 0
	case events.StatusStarted:
		return 1
	case events.StatusSuspended, events.StatusResumed:
		return 2
	case events.StatusCompleted, events.StatusFailed, events.StatusCancelled:
		return 3
	}
	return -1
}

// IsTerminal reports whether a run status is final: completed, failed or
// cancelled.
func IsTerminal(status string) bool { return RunStatusRank(status) == 3 }

// CallStatusRank orders tool call statuses: requested 0, approved 1, started
// 2, completed 3; anything else -1.
func CallStatusRank(s string) int {
	switch s {
	case CallRequested:
		return 0
	case CallApproved:
		return 1
	case CallStarted:
		return 2
	case CallCompleted:
		return 3
	}
	return -1
}

// Run is a materialized run.
type Run struct {
	RunID       string
	Tenant      envelope.Tenant
	Agent       string
	Status      string
	Reason      string
	TraceID     string
	Iterations  int
	ToolCalls   int // the greatest of the count reported by events and the calls recorded
	Spend       *float64
	Request     json.RawMessage
	Outputs     json.RawMessage
	Pinned      json.RawMessage
	OutputsBlob json.RawMessage // an envelope.Attachment; see RunUpdate.OutputsBlob
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
}

// ToolCall is a materialized tool call.
type ToolCall struct {
	RunID     string
	CallID    string
	Seq       *int
	Iteration *int
	Name      string
	Version   string
	Status    string
	ErrorCode string
	Input     json.RawMessage
	Envelope  json.RawMessage
	Queue     string
	Cost      *float64
	TStart    *time.Time
	TEnd      *time.Time
	LatencyMS *int64
	Cached    bool
	Truncated bool
}

// RunFilter selects runs to list. Empty fields match everything.
type RunFilter struct {
	Status      string
	Agent       string
	OrgID       string
	WorkspaceID string
	UserID      string
	// Since and Until bound created_at: Since <= created_at < Until.
	Since time.Time
	Until time.Time
	// Limit bounds the result; ListRuns treats values below 1 as
	// DefaultListLimit and above MaxListLimit as MaxListLimit.
	Limit int
}

// Limits of ListRuns.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
)

// EffectiveLimit is f.Limit clamped as ListRuns applies it.
func (f RunFilter) EffectiveLimit() int {
	switch {
	case f.Limit < 1:
		return DefaultListLimit
	case f.Limit > MaxListLimit:
		return MaxListLimit
	}
	return f.Limit
}

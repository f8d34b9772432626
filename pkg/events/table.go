package events

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// EventType is everything toolwire knows about one event type, in one row of
// Table: its subjects, stream, data (Go type and JSON Schema) and the status
// it implies for its run or call. Services, the recorder and the docs read
// it from here, never from a copy.
//
// Adding an event type:
//  1. its Type* constant (types.go) and its data's Go type;
//  2. its data's JSON Schema in schemas/ (or pkg/envelope/schemas/), named by
//     a Schema* constant, and a fixture that the schema tests validate;
//  3. its row below: a Filter* constant for its subjects (subjects.go has the
//     builders), the stream, the schema, New, and the status it implies;
//  4. a constructor New<Event> that builds its id, subject and attributes;
//  5. the recorder's decoder for it (services/recorder/store: RecordOf's
//     map; a test fails until every row has one);
//  6. the event table of docs/architecture.md, which `make docs`
//     regenerates from this table (TestEventTableIsCurrent).
type EventType struct {
	// Type is the CloudEvents type.
	Type string
	// Filter matches the subjects events of the type are published on.
	Filter Filter
	// Stream holds them.
	Stream string
	// Schema names the JSON Schema of the data (see DataSchema).
	Schema string
	// New returns a pointer to a new value of the data's Go type.
	New func() any
	// RunStatus is the status the event gives its run ("" none).
	RunStatus string
	// CallStatus is the status the event gives its call ("" none).
	CallStatus string
	// Doc says what the event announces.
	Doc string
}

// Run and call statuses implied by events, besides the run statuses of
// RunStatus (StatusStarted ... StatusFailed).
const (
	StatusRequested     = "requested" // a run or call asked for, not started
	CallStatusApproved  = "approved"
	CallStatusStarted   = "started"
	CallStatusCompleted = "completed"
)

func newOf[T any]() func() any { return func() any { return new(T) } }

// table is every event type toolwire produces.
var table = []EventType{
	{TypeRunRequested, FilterRunRequested, StreamRuns, envelope.SchemaRunRequest, newOf[envelope.RunRequest](),
		StatusRequested, "", "an upstream system asks for a run"},
	{TypeRunStarted, FilterRunStarted, StreamRuns, SchemaRunStatus, newOf[RunStatus](),
		StatusStarted, "", "the run's first model call is taking long (it is only published then)"},
	{TypeTurnCompleted, FilterTurnCompleted, StreamRuns, SchemaTurn, newOf[Turn](),
		StatusStarted, "", "one model turn: the loop rules' verdict, the response and its cost, the calls it made"},
	{TypeRunSuspended, FilterRunSuspended, StreamRuns, SchemaRunStatus, newOf[RunStatus](),
		StatusSuspended, "", "the run waits for an operator's approval of a call"},
	{TypeRunResumed, FilterRunResumed, StreamRuns, SchemaRunStatus, newOf[RunStatus](),
		StatusResumed, "", "the awaited approval (or the call's completion) came"},
	{TypeRunCompleted, FilterRunCompleted, StreamRuns, SchemaRunStatus, newOf[RunStatus](),
		StatusCompleted, "", "the run ended with its AgentOutputs"},
	{TypeRunFailed, FilterRunFailed, StreamRuns, SchemaRunStatus, newOf[RunStatus](),
		StatusFailed, "", "the run ended without outputs, with a reason"},
	{TypeRunCancelRequested, FilterRunCancelRequested, StreamRuns, SchemaCancelRequest, newOf[CancelRequest](),
		"", "", "an operator, the run's tenant or a producer asks that the run stop (cancel.go)"},
	{TypeRunCancelled, FilterRunCancelled, StreamRuns, SchemaRunStatus, newOf[RunStatus](),
		StatusCancelled, "", "the run ended on request, with the outputs of what completed"},
	{TypeCallApprovalRequired, FilterCallApprovalRequired, StreamCalls, SchemaApprovalRequest, newOf[ApprovalRequest](),
		"", StatusRequested, "the call waits for an operator's decision"},
	{TypeCallDecided, FilterCallDecided, StreamCalls, SchemaDecision, newOf[Decision](),
		"", StatusRequested, "an operator approved, denied or revised the call"},
	{TypeCallApproved, FilterCallApproved, StreamCalls, SchemaCallRequest, newOf[CallRequest](),
		"", CallStatusApproved, "the guard approved the call; a worker of its queue runs it"},
	{TypeCallStarted, FilterCallStarted, StreamCalls, SchemaCallStarted, newOf[CallStarted](),
		"", CallStatusStarted, "a call is still running after a threshold (a quick call has none)"},
	{TypeCallCompleted, FilterCallCompleted, StreamCalls, envelope.SchemaToolEnvelope, newOf[envelope.ToolEnvelope](),
		"", CallStatusCompleted, "the call's ToolEnvelope: its output or its error, and its cost"},
	{TypeSandboxRequested, FilterSandboxRequested, StreamSandbox, SchemaSandboxJob, newOf[SandboxJob](),
		"", "", "the executor asks the sandbox to run a job"},
	{TypeSandboxCompleted, FilterSandboxCompleted, StreamSandbox, SchemaSandboxResult, newOf[SandboxResult](),
		"", "", "the sandbox's result of a job"},
}

var byType = func() map[string]*EventType {
	m := make(map[string]*EventType, len(table))
	for i := range table {
		if _, dup := m[table[i].Type]; dup {
			panic(fmt.Sprintf("events: type %s is in the table twice", table[i].Type))
		}
		m[table[i].Type] = &table[i]
	}
	return m
}()

// schemaURIs are the dataschema URLs of the table's types, parsed: every
// event carries one, and url.Parse was a sixth of decoding an event.
var schemaURIs = func() map[string]url.URL {
	m := make(map[string]url.URL, len(table))
	for _, t := range table {
		if t.Schema == "" {
			continue
		}
		s := envelope.SchemaURL(t.Schema)
		if u, err := url.Parse(s); err == nil && u.String() == s {
			m[s] = *u
		}
	}
	return m
}()

// setDataSchema is e.SetDataSchema(v), from schemaURIs when v is there.
func setDataSchema(e *event.Event, v string) {
	if ec, ok := e.Context.(*event.EventContextV1); ok {
		if u, ok := schemaURIs[v]; ok {
			ec.DataSchema = &types.URI{URL: u}
			return
		}
	}
	e.SetDataSchema(v)
}

// Table returns every event type, in the order of a run's life.
func Table() []EventType { return append([]EventType(nil), table...) }

// LookupType returns the row of an event type.
func LookupType(typ string) (EventType, bool) {
	if t, ok := byType[typ]; ok {
		return *t, true
	}
	return EventType{}, false
}

// DataSchema returns the schema name of an event type's data, or "".
func DataSchema(eventType string) string {
	if t, ok := byType[eventType]; ok {
		return t.Schema
	}
	return ""
}

// EventTypes lists every event type.
func EventTypes() []string {
	out := make([]string, len(table))
	for i, t := range table {
		out[i] = t.Type
	}
	return out
}

// Verb is the last token of a subject: what happened.
type Verb string

// Verbs of toolwire's subjects.
const (
	VerbRequested        Verb = "requested"
	VerbStarted          Verb = "started"
	VerbSuspended        Verb = "suspended"
	VerbResumed          Verb = "resumed"
	VerbCompleted        Verb = "completed"
	VerbFailed           Verb = "failed"
	VerbApproved         Verb = "approved"
	VerbApprovalRequired Verb = "approval_required"
	VerbDecided          Verb = "decided"
)

// Filter is a subject filter: a subject with a '*' for each id.
type Filter string

// The subjects of each event type, for every run.
const (
	FilterRunRequested         Filter = Prefix + ".run.*.requested"
	FilterRunStarted           Filter = Prefix + ".run.*.started"
	FilterRunSuspended         Filter = Prefix + ".run.*.suspended"
	FilterRunResumed           Filter = Prefix + ".run.*.resumed"
	FilterRunCompleted         Filter = Prefix + ".run.*.completed"
	FilterRunFailed            Filter = Prefix + ".run.*.failed"
	FilterTurnCompleted        Filter = Prefix + ".run.*.turn.*.completed"
	FilterRunEvents            Filter = Prefix + ".run.*.>" // every event of a run on the runs stream
	FilterCallApprovalRequired Filter = Prefix + ".call.*.*.approval_required"
	FilterCallDecided          Filter = Prefix + ".call.*.*.decided"
	FilterCallApproved         Filter = Prefix + ".call.*.*.approved.*" // every queue; see ApprovedFilter
	FilterCallStarted          Filter = Prefix + ".call.*.*.started"
	FilterCallCompleted        Filter = Prefix + ".call.*.*.completed"
	FilterSandboxRequested     Filter = Prefix + ".sandbox.*.*.requested"
	FilterSandboxCompleted     Filter = Prefix + ".sandbox.*.*.completed"
)

// ForRun narrows f to one run: its first '*' (the run id) becomes runID.
func (f Filter) ForRun(runID string) (string, error) {
	if err := ValidateRunID(runID); err != nil {
		return "", err
	}
	return strings.Replace(string(f), "*", runID, 1), nil
}

// Filters turns filters into the strings a consumer configuration takes.
func Filters(fs ...Filter) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = string(f)
	}
	return out
}

package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	fastjson "github.com/segmentio/encoding/json"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// CloudEvents extension attribute names used by toolwire.
const (
	ExtRunID       = "runid"
	ExtCallID      = "callid"
	ExtTenantID    = "tenantid"
	ExtTraceParent = "traceparent" // distributed-tracing extension: the run's trace
	ExtTraceState  = "tracestate"
)

// Outgoing is an event ready to publish on its subject.
type Outgoing struct {
	Subject string
	Event   event.Event
	// MsgID, when set, is the Nats-Msg-Id instead of the event's id: the
	// intake (intake.go) dedupes a request per tenant, where the runs
	// stream dedupes it per run.
	MsgID string
}

// Msg encodes the event for its subject (Encode), with its Nats-Msg-Id.
func (o *Outgoing) Msg() (*nats.Msg, error) {
	m, err := Encode(o.Subject, &o.Event)
	if err != nil {
		return nil, err
	}
	if o.MsgID != "" {
		m.Header.Set(HeaderMsgID, o.MsgID)
	}
	return m, nil
}

// RunTrace is the run's starting trace context, carried by every event of the
// run in the distributed-tracing extension.
type RunTrace struct {
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// Attrs are the attributes of an event besides its type, id and data.
type Attrs struct {
	Source   string // "/toolwire/<service>" for toolwire's own services
	RunID    string
	CallID   string
	TenantID string
	Trace    RunTrace
	Time     time.Time // zero: now
}

// ErrInvalidEvent is wrapped when an event lacks what its type requires.
var ErrInvalidEvent = errors.New("invalid event")

// Build makes an event of type typ with the given id, subject and data, the
// dataschema of its type, and the toolwire extensions.
func Build(typ, id, subject string, a Attrs, data any) (Outgoing, error) {
	e := event.New()
	e.SetID(id)
	e.SetType(typ)
	if a.Source == "" {
		a.Source = "/toolwire"
	}
	e.SetSource(a.Source)
	t := a.Time
	if t.IsZero() {
		t = time.Now()
	}
	e.SetTime(t.UTC())
	if name := DataSchema(typ); name != "" {
		setDataSchema(&e, envelope.SchemaURL(name))
	}
	if a.RunID != "" {
		e.SetExtension(ExtRunID, a.RunID)
	}
	if a.CallID != "" {
		e.SetExtension(ExtCallID, a.CallID)
		e.SetSubject(a.CallID)
	}
	if a.TenantID != "" {
		e.SetExtension(ExtTenantID, a.TenantID)
	}
	if a.Trace.TraceParent != "" {
		e.SetExtension(ExtTraceParent, a.Trace.TraceParent)
		if a.Trace.TraceState != "" {
			e.SetExtension(ExtTraceState, a.Trace.TraceState)
		}
	}
	b, err := fastjson.Marshal(data) // the bytes encoding/json writes (FuzzEncodeData), for less
	if err != nil {
		return Outgoing{}, fmt.Errorf("%w: marshal %s data: %w", ErrInvalidEvent, typ, err)
	}
	if err := e.SetData(event.ApplicationJSON, b); err != nil {
		return Outgoing{}, fmt.Errorf("%w: %s data: %w", ErrInvalidEvent, typ, err)
	}
	if err := validate(&e); err != nil {
		return Outgoing{}, fmt.Errorf("%w: %s: %w", ErrInvalidEvent, typ, err)
	}
	return Outgoing{Subject: subject, Event: e}, nil
}

// buildCall builds an event about call a.CallID of run a.RunID, on the
// subject toolwire.<kind>.<run_id>.<call_id>.<verb> (kind: call or sandbox).
// Its id is "<run_id>/<call_id>/<verb>", or "<run_id>/<call_id>/sandbox/<verb>"
// for a sandbox event: one such event per call.
func buildCall(typ, kind string, verb Verb, a Attrs, data any) (Outgoing, error) {
	subj, err := callSubject(kind, a.RunID, a.CallID, verb)
	if err != nil {
		return Outgoing{}, err
	}
	id := a.RunID + "/" + a.CallID + "/" + string(verb)
	if kind != "call" {
		id = a.RunID + "/" + a.CallID + "/" + kind + "/" + string(verb)
	}
	return Build(typ, id, subj, a, data)
}

// NewRunRequested builds a run request event. Its id is RunRequestedID, so
// a request published twice is one request.
func NewRunRequested(source string, req envelope.RunRequest, trace RunTrace) (Outgoing, error) {
	subj, err := RunSubject(req.RunID, "requested")
	if err != nil {
		return Outgoing{}, err
	}
	return Build(TypeRunRequested, RunRequestedID(req.RunID), subj,
		Attrs{Source: source, RunID: req.RunID, TenantID: req.Tenant.ID(), Trace: trace}, req)
}

// runStatusTypes maps each run status to the lifecycle event type that
// announces it (Table's RunStatus, for the types whose data is a RunStatus).
var runStatusTypes = func() map[string]string {
	m := map[string]string{}
	for _, t := range table {
		if t.Schema == SchemaRunStatus {
			m[t.RunStatus] = t.Type
		}
	}
	return m
}()

// NewRunStatus builds a lifecycle event. Its id is "<run_id>/<status>", plus
// "/<discriminator>" when one run can have several (suspensions, resumptions);
// a run's end, whatever its status, is "<run_id>/end" (EndEventID), so that
// the stream refuses a second end of another kind as a duplicate.
func NewRunStatus(source string, s RunStatus, discriminator string, trace RunTrace) (Outgoing, error) {
	typ, ok := runStatusTypes[s.Status]
	if !ok {
		return Outgoing{}, fmt.Errorf("%w: unknown run status %q", ErrInvalidEvent, s.Status)
	}
	subj, err := RunSubject(s.RunID, Verb(s.Status))
	if err != nil {
		return Outgoing{}, err
	}
	id := s.RunID + "/" + s.Status
	if IsEndStatus(s.Status) {
		id = EndEventID(s.RunID)
	} else if discriminator != "" {
		id += "/" + discriminator
	}
	return Build(typ, id, subj, Attrs{Source: source, RunID: s.RunID, TenantID: s.Tenant.ID(), Trace: trace}, s.dataOf())
}

// EndEventID is the id of a run's end event, whether it completed, failed or
// was cancelled.
func EndEventID(runID string) string { return runID + "/end" }

// IsEndStatus reports whether status ends a run: nothing of the run may
// follow an event of it.
func IsEndStatus(status string) bool {
	return status == StatusCompleted || status == StatusFailed || status == StatusCancelled
}

// IsEndType reports whether events of the type end their run (completed,
// failed, cancelled).
func IsEndType(typ string) bool {
	t, ok := byType[typ]
	return ok && t.Schema == SchemaRunStatus && IsEndStatus(t.RunStatus)
}

// EndVerbs are the verbs of a run's end events.
func EndVerbs() []Verb { return []Verb{VerbCompleted, VerbFailed, VerbCancelled} }

// NewTurnCompleted builds the record of model turn t.Iteration. Its id is
// "<run_id>/turn/<n>": a turn is recorded once, whichever replica's model
// call got there first (a retried publish of another answer is dropped as a
// duplicate, and its publisher reads the stored one).
func NewTurnCompleted(source string, t Turn, trace RunTrace) (Outgoing, error) {
	subj, err := TurnSubject(t.RunID, t.Iteration)
	if err != nil {
		return Outgoing{}, err
	}
	return Build(TypeTurnCompleted, TurnEventID(t.RunID, t.Iteration), subj,
		Attrs{Source: source, RunID: t.RunID, TenantID: t.Tenant.ID(), Trace: trace}, t)
}

// RunRequestedID is the id of run runID's request, "<run_id>/requested":
// derived from the run, never a producer's choice. The orchestrator gives
// it to every request it hands over from the intake (whatever id its
// producer gave it), so that the id, which is also the Nats-Msg-Id the runs
// stream dedupes on, can never be one of another run's events.
func RunRequestedID(runID string) string { return runID + "/requested" }

// TurnEventID is the id of turn n's event.
func TurnEventID(runID string, n int) string { return runID + "/turn/" + strconv.Itoa(n) }

// NewCallApproved builds an approved call, routed to c.Queue. Its id is
// "<run_id>/<call_id>/approved": one approval per call, whatever the queue.
func NewCallApproved(source string, c CallRequest, trace RunTrace) (Outgoing, error) {
	subj, err := ApprovedSubject(c.RunID, c.CallID, c.Queue)
	if err != nil {
		return Outgoing{}, err
	}
	return Build(TypeCallApproved, c.RunID+"/"+c.CallID+"/approved", subj,
		Attrs{Source: source, RunID: c.RunID, CallID: c.CallID, TenantID: c.Tenant.ID(), Trace: trace}, c)
}

// NewCallStarted builds the announcement that an executor began a call.
func NewCallStarted(source string, s CallStarted, tenant envelope.Tenant, trace RunTrace) (Outgoing, error) {
	return buildCall(TypeCallStarted, "call", "started",
		Attrs{Source: source, RunID: s.RunID, CallID: s.CallID, TenantID: tenant.ID(), Trace: trace}, s)
}

// NewCallCompleted builds the completion of a call; its data is the envelope.
func NewCallCompleted(source, runID string, env envelope.ToolEnvelope, tenant envelope.Tenant, trace RunTrace) (Outgoing, error) {
	return buildCall(TypeCallCompleted, "call", "completed",
		Attrs{Source: source, RunID: runID, CallID: env.CallID, TenantID: tenant.ID(), Trace: trace}, env)
}

// Ext returns a string extension of e, or "".
func Ext(e *event.Event, name string) string {
	v, ok := extensions(e)[name]
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// TraceOf returns the run trace carried by e.
func TraceOf(e *event.Event) RunTrace {
	return RunTrace{TraceParent: Ext(e, ExtTraceParent), TraceState: Ext(e, ExtTraceState)}
}

// DecodeData unmarshals e's JSON data into v, rejecting unknown fields so that
// a producer's mistake is a clear error rather than silently dropped data.
func DecodeData(e *event.Event, v any) error {
	if !isJSONMedia(mediaType(e)) {
		return fmt.Errorf("%w: %s data content type %q, want application/json", ErrInvalidEvent, e.Type(), e.DataContentType())
	}
	if len(e.Data()) == 0 {
		return fmt.Errorf("%w: %s has no data", ErrInvalidEvent, e.Type())
	}
	data := e.Data()
	// segmentio's decoder takes what encoding/json takes, at a fraction of
	// its cost (JSON was a fifth of the pipeline's CPU); it returns what
	// follows the value, where only white space may be, so that data
	// DecodeData takes is JSON as json.Valid would have it. Data it refuses
	// is decoded again by encoding/json, which has the last word and says
	// what is wrong in its own words.
	if rest, err := fastjson.Parse(data, v, fastjson.DisallowUnknownFields); err == nil && len(rest) == 0 {
		return nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero() // nothing of the refused attempt stays
	}
	return decodeDataStrict(e.Type(), data, v)
}

// decodeDataStrict is DecodeData by encoding/json alone.
func decodeDataStrict(typ string, data []byte, v any) error {
	dec := json.NewDecoder(bytesReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s data: %w", ErrInvalidEvent, typ, err)
	}
	if rest := data[dec.InputOffset():]; len(bytes.TrimLeft(rest, " \t\r\n")) > 0 {
		return fmt.Errorf("%w: %s data: trailing content after the JSON value", ErrInvalidEvent, typ)
	}
	return nil
}

// extensions is e's extension map, read in place: event.Event.Extensions
// copies it on every call.
func extensions(e *event.Event) map[string]any {
	if c, ok := e.Context.(*event.EventContextV1); ok {
		return c.Extensions
	}
	return e.Extensions()
}

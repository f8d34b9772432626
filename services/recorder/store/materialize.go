package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	fastjson "github.com/segmentio/encoding/json"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// ErrUndecodable is wrapped by RecordOf when an event cannot be recorded as it
// is: its data does not decode as its type says, or its ids are unsafe or
// disagree. Retrying cannot help; the event belongs in the dead-letter stream.
var ErrUndecodable = errors.New("event cannot be recorded")

// RecordOf decodes a consumed event, delivered on subject, into the record
// that stores it. Every event type of events.Table has a decoder in decoders
// that gives it its effects on the materialized tables; an event of any other
// type is kept in the events table only.
func RecordOf(ev *event.Event, subject string) (Record, error) {
	row := EventRow{
		ID:      ev.ID(),
		Type:    ev.Type(),
		Source:  ev.Source(),
		Subject: subject,
		Time:    ev.Time().UTC(),
		RunID:   events.Ext(ev, events.ExtRunID),
		CallID:  events.Ext(ev, events.ExtCallID),
	}
	if row.Time.IsZero() {
		// CloudEvents makes time optional; toolwire's producers always set it.
		// Without one, the time the recorder saw the event is the best there is.
		row.Time = time.Now().UTC()
	}
	if exts := ev.Extensions(); len(exts) > 0 {
		row.Extensions = make(map[string]string, len(exts))
		for k := range exts {
			row.Extensions[k] = events.Ext(ev, k)
		}
	}
	dec, known := decoders[row.Type]
	if data := ev.Data(); len(data) > 0 {
		// A type the recorder decodes has its data checked by DecodeData;
		// any other is checked here.
		if !known && !json.Valid(data) {
			return Record{}, undecodable(&row, errors.New("data is not JSON"))
		}
		row.Data = data // the event's own bytes: nothing writes to them
	}
	// The subject names the event's run and call, and a store keys the event
	// by its run (EventKey): NATS permissions say who may publish on a run's
	// subjects, while anyone who may publish sets any extension. An event
	// whose extensions name another run or call than its subject is refused.
	p, err := events.ParseSubject(subject)
	if err == nil {
		for _, f := range []struct {
			what     string
			row      *string
			delivery string
		}{{"run", &row.RunID, p.RunID}, {"call", &row.CallID, p.CallID}} {
			switch {
			case f.delivery == "":
			case *f.row != "" && *f.row != f.delivery:
				return Record{}, undecodable(&row, fmt.Errorf("its extensions name %s %q but it was delivered on %s %q's subject %s",
					f.what, *f.row, f.what, f.delivery, subject))
			default:
				*f.row = f.delivery
			}
		}
	}
	if !known {
		// Not a type this recorder knows (a newer producer's): kept as it
		// came, materialized by none.
		return Record{Event: row}, nil
	}
	typ, _ := events.LookupType(row.Type)
	d := &decoding{ev: ev, typ: typ, rec: Record{Event: row}, subject: p, at: row.Time, traceID: events.TraceOf(ev).TraceID()}
	if err := dec(d); err != nil {
		return Record{}, undecodable(&row, err)
	}
	return d.rec, nil
}

func undecodable(row *EventRow, err error) error {
	return fmt.Errorf("%w: %s %s: %w", ErrUndecodable, row.Type, row.ID, err)
}

// decoding is one event on its way to a record: a decoder reads the data
// and fills rec's run, call, turn and verdict effects.
type decoding struct {
	ev      *event.Event
	typ     events.EventType // the type's row: the statuses it implies
	rec     Record
	subject events.ParsedSubject // what the subject says (zero when it is not a toolwire subject)
	at      time.Time
	traceID string
}

// decoder gives one event type its effects.
type decoder func(d *decoding) error

// decoders are the recorder's knowledge of each event type of events.Table
// (a test checks that every row has one).
var decoders = map[string]decoder{
	events.TypeRunRequested:         recordRunRequested,
	events.TypeRunStarted:           recordRunStatus,
	events.TypeRunSuspended:         recordRunStatus,
	events.TypeRunResumed:           recordRunStatus,
	events.TypeRunCompleted:         recordRunStatus,
	events.TypeRunFailed:            recordRunStatus,
	events.TypeRunCancelRequested:   recordCancelRequested,
	events.TypeRunCancelled:         recordRunStatus,
	events.TypeTurnCompleted:        recordTurn,
	events.TypeCallApproved:         recordCallApproved,
	events.TypeCallStarted:          recordCallStarted,
	events.TypeCallCompleted:        recordCallCompleted,
	events.TypeCallApprovalRequired: recordApprovalRequired,
	events.TypeCallDecided:          recordDecided,
	events.TypeSandboxRequested:     recordSandboxJob,
	events.TypeSandboxCompleted:     recordSandboxResult,
}

// data decodes the event's data as its type's Go value.
func data[T any](d *decoding) (*T, error) {
	v := new(T)
	if err := events.DecodeData(d.ev, v); err != nil {
		return nil, err
	}
	return v, nil
}

// raw decodes the event's data into a struct of json.RawMessage fields: the
// values exactly as they were sent, not as they would re-encode.
func raw[T any](d *decoding) (*T, error) {
	v := new(T)
	if err := fastjson.Unmarshal(d.rec.Event.Data, v); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	return v, nil
}

// setRun checks the run id an event's data names against its subject's and
// extension's, and adopts it.
func (d *decoding) setRun(runID string) error {
	if err := events.ValidateRunID(runID); err != nil {
		return err
	}
	if d.rec.Event.RunID != "" && d.rec.Event.RunID != runID {
		return fmt.Errorf("data names run %q but the event belongs to run %q", runID, d.rec.Event.RunID)
	}
	d.rec.Event.RunID = runID
	return nil
}

// setCall is setRun for the call id.
func (d *decoding) setCall(callID string) error {
	if err := events.ValidateCallID(callID); err != nil {
		return err
	}
	if d.rec.Event.CallID != "" && d.rec.Event.CallID != callID {
		return fmt.Errorf("data names call %q but the event belongs to call %q", callID, d.rec.Event.CallID)
	}
	d.rec.Event.CallID = callID
	return nil
}

// setRunCall is setRun and setCall.
func (d *decoding) setRunCall(runID, callID string) error {
	if err := d.setRun(runID); err != nil {
		return err
	}
	return d.setCall(callID)
}

// touch is the run update of an event that changes nothing of its run but
// its last activity.
func (d *decoding) touch() *RunUpdate {
	return &RunUpdate{RunID: d.rec.Event.RunID, At: d.at, TraceID: d.traceID}
}

func recordRunRequested(d *decoding) error {
	req, err := data[envelope.RunRequest](d)
	if err != nil {
		return err
	}
	if err := d.setRun(req.RunID); err != nil {
		return err
	}
	d.rec.Run = &RunUpdate{RunID: req.RunID, At: d.at, Request: d.rec.Event.Data, Tenant: req.Tenant,
		Agent: req.Agent.Name, Status: d.typ.RunStatus, TraceID: d.traceID}
	return nil
}

func recordRunStatus(d *decoding) error {
	s, err := data[events.RunStatus](d)
	if err != nil {
		return err
	}
	if err := d.setRun(s.RunID); err != nil {
		return err
	}
	if s.Status != d.typ.RunStatus {
		return fmt.Errorf("status %q in an event of type %s (want %q)", s.Status, d.typ.Type, d.typ.RunStatus)
	}
	if s.OutputsBlob != nil {
		// The blob holds both outputs and pinned handles (an
		// events.OutputsDocument), and the API reads it by name.
		if s.Outputs != nil || s.Pinned != nil {
			return errors.New("outputs_blob and inline outputs or pinned handles: the blob holds both when they are too large for the event")
		}
		if _, err := BlobName(*s.OutputsBlob); err != nil {
			return fmt.Errorf("outputs_blob: %w", err)
		}
	}
	r, err := raw[struct {
		Outputs     json.RawMessage `json:"outputs"`
		Pinned      json.RawMessage `json:"pinned"`
		OutputsBlob json.RawMessage `json:"outputs_blob"`
		Spend       json.RawMessage `json:"spend"`
		Turn        json.RawMessage `json:"turn"`
	}](d)
	if err != nil {
		return err
	}
	u := &RunUpdate{RunID: s.RunID, At: d.at, Tenant: s.Tenant, Agent: s.Agent, Status: s.Status,
		Reason: s.Reason, TraceID: s.TraceID, Iterations: s.Iteration, ToolCalls: s.ToolCalls,
		Spend: spendOf(r.Spend)}
	if u.TraceID == "" {
		u.TraceID = d.traceID
	}
	if s.Status == events.StatusCompleted || s.Status == events.StatusCancelled {
		// A cancelled run's outputs hold what completed (events/cancel.go).
		u.Outputs, u.Pinned, u.OutputsBlob = r.Outputs, r.Pinned, r.OutputsBlob
	}
	if s.Turn != nil {
		// The turn that ended the run rides on its end event (it has no
		// turn event of its own): the model's final answer, or the model
		// call the loop rules denied.
		switch {
		case !IsTerminal(s.Status):
			return fmt.Errorf("a %s event carries turn %d: only the end of a run carries the turn that ended it", s.Status, s.Turn.Iteration)
		case s.Status == events.StatusCompleted && !s.Turn.Verdict.Allowed:
			return fmt.Errorf("a completed run's end carries turn %d, which the loop rules denied", s.Turn.Iteration)
		}
		if err := d.turn(s.Turn, r.Turn, u); err != nil {
			return fmt.Errorf("turn: %w", err)
		}
		if u.Spend == nil { // the end's spend is left out when it is 0
			u.Spend = amountOf(s.Turn.Spend)
		}
	}
	d.rec.Run = u
	return nil
}

// recordTurn records a model turn: the run moves on to iteration n (started,
// with its spend so far), the turn and the loop rules' verdict are kept, and
// each call the model made is requested.
func recordTurn(d *decoding) error {
	t, err := data[events.Turn](d)
	if err != nil {
		return err
	}
	if err := d.setRun(t.RunID); err != nil {
		return err
	}
	if n := d.subject.Iteration; n != 0 && n != t.Iteration {
		return fmt.Errorf("data is turn %d but the event was delivered as turn %d", t.Iteration, n)
	}
	u := &RunUpdate{RunID: t.RunID, At: d.at, Tenant: t.Tenant, Agent: t.Agent, Status: d.typ.RunStatus,
		TraceID: d.traceID, Spend: amountOf(t.Spend)}
	if err := d.turn(t, d.rec.Event.Data, u); err != nil {
		return err
	}
	d.rec.Run = u
	return nil
}

// turn records model turn t, whose data as sent is raw, from its turn event
// or from the end event that carries the turn that ended the run: the turn,
// its verdict, a request of each call, and the run's iteration and tool call
// count in u.
func (d *decoding) turn(t *events.Turn, raw json.RawMessage, u *RunUpdate) error {
	if t.RunID != u.RunID {
		return fmt.Errorf("the turn names run %q but the event belongs to run %q", t.RunID, u.RunID)
	}
	if t.Iteration < 1 {
		return fmt.Errorf("iteration %d must be at least 1", t.Iteration)
	}
	if !t.Verdict.Allowed && (t.Response != nil || len(t.Calls) > 0) {
		return fmt.Errorf("turn %d is denied by the loop rules yet has a response or calls", t.Iteration)
	}
	calls := make([]CallUpdate, 0, len(t.Calls))
	ids, seqs := make(map[string]bool, len(t.Calls)), make(map[int]bool, len(t.Calls))
	for i := range t.Calls {
		c := &t.Calls[i]
		if err := events.ValidateCallID(c.CallID); err != nil {
			return fmt.Errorf("calls[%d]: %w", i, err)
		}
		if c.Seq < 1 {
			return fmt.Errorf("calls[%d]: seq %d must be at least 1", i, c.Seq)
		}
		if ids[c.CallID] || seqs[c.Seq] {
			return fmt.Errorf("calls[%d]: call %s (seq %d) is in the turn twice", i, c.CallID, c.Seq)
		}
		ids[c.CallID], seqs[c.Seq] = true, true
		// Seq numbers the calls through the run: the turn's last is how many
		// the run has made.
		u.ToolCalls = max(u.ToolCalls, c.Seq)
		seq, iter := c.Seq, t.Iteration
		calls = append(calls, CallUpdate{RunID: t.RunID, CallID: c.CallID, Status: CallRequested, Seq: &seq,
			Iteration: &iter, Name: c.Name, Version: c.Version, Input: c.Input})
	}
	u.Iterations = max(u.Iterations, t.Iteration)
	d.rec.Calls = calls
	d.rec.Turn = &TurnRow{RunID: t.RunID, Iteration: t.Iteration, Turn: raw}
	d.rec.Verdict = &VerdictRow{RunID: t.RunID, Iteration: t.Iteration, Allowed: t.Verdict.Allowed,
		Code: string(t.Verdict.Code), Reason: t.Verdict.Reason}
	return nil
}

// recordCallApproved records the guard's approval of a call, routed to its
// queue: the subject's last token, which the data must agree with.
func recordCallApproved(d *decoding) error {
	c, err := data[events.CallRequest](d)
	if err != nil {
		return err
	}
	if err := d.setRunCall(c.RunID, c.CallID); err != nil {
		return err
	}
	if err := envelope.ValidateQueue(c.Queue); err != nil {
		return err
	}
	if q := d.subject.Queue; q != "" && q != c.Queue {
		return fmt.Errorf("data routes the call to queue %q but the event was delivered to queue %q", c.Queue, q)
	}
	seq, iter := c.Seq, c.Iteration
	d.rec.Run = &RunUpdate{RunID: c.RunID, At: d.at, Tenant: c.Tenant, Agent: c.Agent, TraceID: d.traceID,
		Iterations: c.Iteration}
	d.rec.Calls = []CallUpdate{{RunID: c.RunID, CallID: c.CallID, Status: d.typ.CallStatus, Seq: &seq, Iteration: &iter,
		Name: c.Name, Version: c.Version, Input: c.Input, Queue: c.Queue}}
	return nil
}

func recordCallStarted(d *decoding) error {
	s, err := data[events.CallStarted](d)
	if err != nil {
		return err
	}
	if err := d.setRunCall(s.RunID, s.CallID); err != nil {
		return err
	}
	d.rec.Run = d.touch()
	d.rec.Calls = []CallUpdate{{RunID: s.RunID, CallID: s.CallID, Status: d.typ.CallStatus, Name: s.Name,
		Version: s.Version, TStart: timePtr(s.TStart)}}
	return nil
}

func recordCallCompleted(d *decoding) error {
	env, err := data[envelope.ToolEnvelope](d)
	if err != nil {
		return err
	}
	// The envelope names no run: its subject and extension do.
	if err := d.setRunCall(d.rec.Event.RunID, env.CallID); err != nil {
		return err
	}
	u := CallUpdate{RunID: d.rec.Event.RunID, CallID: env.CallID, Status: d.typ.CallStatus,
		Name: env.Name, Version: env.Version, Input: env.Input, Envelope: d.rec.Event.Data,
		TStart: timePtr(env.TStart), TEnd: timePtr(env.TEnd), Cached: env.Cached, Truncated: env.Truncated,
		Cost: amountOf(env.Cost)}
	if !env.TStart.IsZero() && !env.TEnd.IsZero() {
		ms := env.Latency().Milliseconds()
		u.LatencyMS = &ms
	}
	if env.Error != nil {
		u.ErrorCode = string(env.Error.Code)
	}
	d.rec.Run = d.touch()
	d.rec.Calls = []CallUpdate{u}
	return nil
}

// recordApprovalRequired: the timeline shows the request in place, from the
// events table; the call row learns the tool (status requested never moves
// one back).
func recordApprovalRequired(d *decoding) error {
	a, err := data[events.ApprovalRequest](d)
	if err != nil {
		return err
	}
	if err := d.setRunCall(a.RunID, a.CorrelationID); err != nil {
		return err
	}
	d.rec.Run = &RunUpdate{RunID: a.RunID, At: d.at, Tenant: a.Tenant, Agent: a.AgentName, TraceID: d.traceID}
	d.rec.Calls = []CallUpdate{{RunID: a.RunID, CallID: a.CorrelationID, Status: d.typ.CallStatus,
		Name: a.ToolName, Version: a.ToolVersion}}
	return nil
}

func recordDecided(d *decoding) error {
	dec, err := data[events.Decision](d)
	if err != nil {
		return err
	}
	if err := d.setRunCall(dec.RunID, dec.CallID); err != nil {
		return err
	}
	d.rec.Run = d.touch()
	d.rec.Calls = []CallUpdate{{RunID: dec.RunID, CallID: dec.CallID, Status: d.typ.CallStatus}}
	return nil
}

// recordCancelRequested keeps the request in the run's events; the run's
// status changes with its end (cancelled), not with the asking.
func recordCancelRequested(d *decoding) error {
	c, err := data[events.CancelRequest](d)
	if err != nil {
		return err
	}
	if err := d.setRun(c.RunID); err != nil {
		return err
	}
	d.rec.Run = d.touch()
	return nil
}

func recordSandboxJob(d *decoding) error {
	j, err := data[events.SandboxJob](d)
	if err != nil {
		return err
	}
	if err := d.setRunCall(j.RunID, j.CallID); err != nil {
		return err
	}
	d.rec.Run = d.touch()
	return nil
}

func recordSandboxResult(d *decoding) error {
	r, err := data[events.SandboxResult](d)
	if err != nil {
		return err
	}
	if err := d.setRunCall(r.RunID, r.CallID); err != nil {
		return err
	}
	d.rec.Run = d.touch()
	return nil
}

// spendOf reads the spend a run status reports: a number, or an object whose
// "total" is one (the shape the orchestrator's budget accounting may grow
// into). Anything else, or a negative or non-finite number, says nothing.
func spendOf(raw json.RawMessage) *float64 {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var v float64
	if err := json.Unmarshal(raw, &v); err != nil {
		var obj struct {
			Total *float64 `json:"total"`
		}
		if json.Unmarshal(raw, &obj) != nil || obj.Total == nil {
			return nil
		}
		v = *obj.Total
	}
	return amountOf(v)
}

// amountOf is a reported spend or cost: nil (says nothing) when it is
// negative or not finite, which no price table gives.
func amountOf(v float64) *float64 {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

package recorder

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
// that stores it. Every event type of package events has its effects on the
// materialized tables; an event of any other type is kept in the events table
// only.
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
	bad := func(format string, args ...any) (Record, error) {
		return Record{}, fmt.Errorf("%w: %s %s: %s", ErrUndecodable, row.Type, row.ID, fmt.Sprintf(format, args...))
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
	if data := ev.Data(); len(data) > 0 {
		// A type the recorder decodes has its data checked by DecodeData;
		// any other is checked here.
		if !knownTypes[row.Type] && !json.Valid(data) {
			return bad("data is not JSON")
		}
		row.Data = data // the event's own bytes: nothing writes to them
	}
	if p, err := events.ParseSubject(subject); err == nil {
		if row.RunID == "" {
			row.RunID = p.RunID
		}
		if row.CallID == "" {
			row.CallID = p.CallID
		}
	}

	rec := Record{Event: row}
	// setRun checks the run id an event's data names against its subject's
	// and extension's, and adopts it.
	setRun := func(runID string) error {
		if err := events.ValidateRunID(runID); err != nil {
			return err
		}
		if rec.Event.RunID != "" && rec.Event.RunID != runID {
			return fmt.Errorf("data names run %q but the event belongs to run %q", runID, rec.Event.RunID)
		}
		rec.Event.RunID = runID
		return nil
	}
	setCall := func(callID string) error {
		if err := events.ValidateCallID(callID); err != nil {
			return err
		}
		if rec.Event.CallID != "" && rec.Event.CallID != callID {
			return fmt.Errorf("data names call %q but the event belongs to call %q", callID, rec.Event.CallID)
		}
		rec.Event.CallID = callID
		return nil
	}
	at := row.Time
	traceID := events.TraceOf(ev).TraceID()

	switch row.Type {
	case events.TypeRunRequested:
		var req envelope.RunRequest
		if err := events.DecodeData(ev, &req); err != nil {
			return bad("%v", err)
		}
		if err := setRun(req.RunID); err != nil {
			return bad("%v", err)
		}
		rec.Run = &RunUpdate{RunID: req.RunID, At: at, Request: rec.Event.Data, Tenant: req.Tenant,
			Agent: req.Agent.Name, Status: StatusRequested, TraceID: traceID}

	case events.TypeRunStarted, events.TypeRunSuspended, events.TypeRunResumed,
		events.TypeRunCompleted, events.TypeRunFailed:
		var s events.RunStatus
		if err := events.DecodeData(ev, &s); err != nil {
			return bad("%v", err)
		}
		if err := setRun(s.RunID); err != nil {
			return bad("%v", err)
		}
		if want := runStatusOfType[row.Type]; s.Status != want {
			return bad("status %q in an event of type %s (want %q)", s.Status, row.Type, want)
		}
		// Keep outputs and pinned handles exactly as they were sent, not as
		// they would re-encode.
		var raw struct {
			Outputs json.RawMessage `json:"outputs"`
			Pinned  json.RawMessage `json:"pinned"`
			Spend   json.RawMessage `json:"spend"`
		}
		if err := fastjson.Unmarshal(rec.Event.Data, &raw); err != nil { // raw values: the bytes as sent
			return bad("data: %v", err)
		}
		u := &RunUpdate{RunID: s.RunID, At: at, Tenant: s.Tenant, Agent: s.Agent, Status: s.Status,
			Reason: s.Reason, TraceID: s.TraceID, Iterations: s.Iteration, ToolCalls: s.ToolCalls,
			Spend: spendOf(raw.Spend)}
		if u.TraceID == "" {
			u.TraceID = traceID
		}
		if s.Status == events.StatusCompleted {
			u.Outputs, u.Pinned = raw.Outputs, raw.Pinned
		}
		rec.Run = u

	case events.TypeIterationRequested:
		var c events.IterationCheck
		if err := events.DecodeData(ev, &c); err != nil {
			return bad("%v", err)
		}
		if err := setRun(c.RunID); err != nil {
			return bad("%v", err)
		}
		spend := c.Spend
		rec.Run = &RunUpdate{RunID: c.RunID, At: at, Tenant: c.Tenant, Agent: c.Agent, TraceID: traceID,
			Iterations: c.Iteration, ToolCalls: c.ToolCalls, Spend: &spend}

	case events.TypeIterationApproved, events.TypeIterationDenied:
		var v events.Verdict
		if err := events.DecodeData(ev, &v); err != nil {
			return bad("%v", err)
		}
		if err := setRun(v.RunID); err != nil {
			return bad("%v", err)
		}
		if v.Allowed != (row.Type == events.TypeIterationApproved) {
			return bad("allowed is %t in an event of type %s", v.Allowed, row.Type)
		}
		if v.Iteration < 1 {
			return bad("iteration %d must be at least 1", v.Iteration)
		}
		rec.Run = &RunUpdate{RunID: v.RunID, At: at, TraceID: traceID, Iterations: v.Iteration}
		rec.Verdict = &VerdictRow{RunID: v.RunID, Iteration: v.Iteration, Allowed: v.Allowed,
			Code: string(v.Code), Reason: v.Reason}

	case events.TypeLLMCompleted:
		var l events.LLMCompleted
		if err := events.DecodeData(ev, &l); err != nil {
			return bad("%v", err)
		}
		if err := setRun(l.RunID); err != nil {
			return bad("%v", err)
		}
		if l.Turn.Iteration < 1 {
			return bad("turn.iteration %d must be at least 1", l.Turn.Iteration)
		}
		var raw struct {
			Turn json.RawMessage `json:"turn"`
		}
		if err := fastjson.Unmarshal(rec.Event.Data, &raw); err != nil { // raw values: the bytes as sent
			return bad("data: %v", err)
		}
		rec.Run = &RunUpdate{RunID: l.RunID, At: at, TraceID: traceID, Iterations: l.Turn.Iteration}
		rec.Turn = &TurnRow{RunID: l.RunID, Iteration: l.Turn.Iteration, Turn: raw.Turn}

	case events.TypeCallRequested, events.TypeCallApproved:
		var c events.CallRequest
		if err := events.DecodeData(ev, &c); err != nil {
			return bad("%v", err)
		}
		if err := setRun(c.RunID); err != nil {
			return bad("%v", err)
		}
		if err := setCall(c.CallID); err != nil {
			return bad("%v", err)
		}
		status := CallRequested
		if row.Type == events.TypeCallApproved {
			status = CallApproved
		}
		seq, iter := c.Seq, c.Iteration
		rec.Run = &RunUpdate{RunID: c.RunID, At: at, Tenant: c.Tenant, Agent: c.Agent, TraceID: traceID,
			Iterations: c.Iteration}
		rec.Call = &CallUpdate{RunID: c.RunID, CallID: c.CallID, Status: status, Seq: &seq, Iteration: &iter,
			Name: c.Name, Version: c.Version, Input: c.Input}

	case events.TypeCallStarted:
		var s events.CallStarted
		if err := events.DecodeData(ev, &s); err != nil {
			return bad("%v", err)
		}
		if err := setRun(s.RunID); err != nil {
			return bad("%v", err)
		}
		if err := setCall(s.CallID); err != nil {
			return bad("%v", err)
		}
		rec.Run = &RunUpdate{RunID: s.RunID, At: at, TraceID: traceID}
		rec.Call = &CallUpdate{RunID: s.RunID, CallID: s.CallID, Status: CallStarted, Name: s.Name,
			Version: s.Version, TStart: timePtr(s.TStart)}

	case events.TypeCallCompleted:
		var env envelope.ToolEnvelope
		if err := events.DecodeData(ev, &env); err != nil {
			return bad("%v", err)
		}
		// The envelope names no run: its subject and extension do.
		if err := setRun(rec.Event.RunID); err != nil {
			return bad("%v", err)
		}
		if err := setCall(env.CallID); err != nil {
			return bad("%v", err)
		}
		u := &CallUpdate{RunID: rec.Event.RunID, CallID: env.CallID, Status: CallCompleted,
			Name: env.Name, Version: env.Version, Input: env.Input, Envelope: rec.Event.Data,
			TStart: timePtr(env.TStart), TEnd: timePtr(env.TEnd), Cached: env.Cached, Truncated: env.Truncated}
		if !env.TStart.IsZero() && !env.TEnd.IsZero() {
			ms := env.Latency().Milliseconds()
			u.LatencyMS = &ms
		}
		if env.Error != nil {
			u.ErrorCode = string(env.Error.Code)
		}
		rec.Run = &RunUpdate{RunID: rec.Event.RunID, At: at, TraceID: traceID}
		rec.Call = u

	case events.TypeCallApprovalRequired:
		var a events.ApprovalRequest
		if err := events.DecodeData(ev, &a); err != nil {
			return bad("%v", err)
		}
		if err := setRun(a.RunID); err != nil {
			return bad("%v", err)
		}
		if err := setCall(a.CorrelationID); err != nil {
			return bad("%v", err)
		}
		// The timeline shows the request in place, from the events table; the
		// call row learns the tool (status requested never moves one back).
		rec.Run = &RunUpdate{RunID: a.RunID, At: at, Tenant: a.Tenant, Agent: a.AgentName, TraceID: traceID}
		rec.Call = &CallUpdate{RunID: a.RunID, CallID: a.CorrelationID, Status: CallRequested,
			Name: a.ToolName, Version: a.ToolVersion}

	case events.TypeCallDecided:
		var d events.Decision
		if err := events.DecodeData(ev, &d); err != nil {
			return bad("%v", err)
		}
		if err := setRun(d.RunID); err != nil {
			return bad("%v", err)
		}
		if err := setCall(d.CallID); err != nil {
			return bad("%v", err)
		}
		rec.Run = &RunUpdate{RunID: d.RunID, At: at, TraceID: traceID}
		rec.Call = &CallUpdate{RunID: d.RunID, CallID: d.CallID, Status: CallRequested}

	case events.TypeUsageRecorded:
		// Billing's record of one model turn or tool call; the run's spend
		// comes from its status events, which carry the total.
		var u events.Usage
		if err := events.DecodeData(ev, &u); err != nil {
			return bad("%v", err)
		}
		if err := setRun(u.RunID); err != nil {
			return bad("%v", err)
		}
		rec.Run = &RunUpdate{RunID: u.RunID, At: at, Tenant: u.Tenant, Agent: u.Agent, TraceID: traceID}

	case events.TypeSandboxRequested:
		var j events.SandboxJob
		if err := events.DecodeData(ev, &j); err != nil {
			return bad("%v", err)
		}
		if err := setRun(j.RunID); err != nil {
			return bad("%v", err)
		}
		if err := setCall(j.CallID); err != nil {
			return bad("%v", err)
		}
		rec.Run = &RunUpdate{RunID: j.RunID, At: at, TraceID: traceID}

	case events.TypeSandboxCompleted:
		var res events.SandboxResult
		if err := events.DecodeData(ev, &res); err != nil {
			return bad("%v", err)
		}
		if err := setRun(res.RunID); err != nil {
			return bad("%v", err)
		}
		if err := setCall(res.CallID); err != nil {
			return bad("%v", err)
		}
		rec.Run = &RunUpdate{RunID: res.RunID, At: at, TraceID: traceID}

	default:
		// Not a type this recorder knows (a newer producer's): kept as it
		// came, materialized by none.
	}
	return rec, nil
}

// knownTypes are the types RecordOf decodes with events.DecodeData.
var knownTypes = map[string]bool{
	events.TypeRunRequested: true, events.TypeRunStarted: true, events.TypeRunSuspended: true,
	events.TypeRunResumed: true, events.TypeRunCompleted: true, events.TypeRunFailed: true,
	events.TypeIterationRequested: true, events.TypeIterationApproved: true, events.TypeIterationDenied: true,
	events.TypeLLMCompleted: true, events.TypeCallRequested: true, events.TypeCallApproved: true,
	events.TypeCallStarted: true, events.TypeCallCompleted: true, events.TypeCallApprovalRequired: true,
	events.TypeCallDecided: true, events.TypeUsageRecorded: true, events.TypeSandboxRequested: true,
	events.TypeSandboxCompleted: true,
}

var runStatusOfType = map[string]string{
	events.TypeRunStarted:   events.StatusStarted,
	events.TypeRunSuspended: events.StatusSuspended,
	events.TypeRunResumed:   events.StatusResumed,
	events.TypeRunCompleted: events.StatusCompleted,
	events.TypeRunFailed:    events.StatusFailed,
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

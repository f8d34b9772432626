package api

import (
	"encoding/json"
	"regexp"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// causalOrder puts a run's events, read in the order the store recorded
// them (its seq), in the order they happened. The recorder reads the runs,
// calls and sandbox streams side by side with concurrent handlers, so a
// call's envelope can be recorded before the model turn that asked for the
// call, a decision before the approval request it answers, and the run's
// end before its last calls' envelopes. causalOrder holds:
//
//   - a call's events (its approval, routing, start, sandbox job, envelope)
//     until the turn that asked for the call has been released;
//   - a decision on a call, and an operator's approval of it, until the
//     call's approval request has been released;
//   - the run's suspension for a call's approval until that approval
//     request, and its resumption until the call's decision, approval or
//     envelope;
//   - the run's end (completed, failed or cancelled) until finish, which
//     the stream calls once the run is settled: the end comes last.
//
// It is a pure function of the sequence of events it is given: the same
// events in the same seq order are released in the same order, which is
// what lets a live stream resume after the last event a client received
// (Last-Event-ID) by replaying the run's events from the first.
type causalOrder struct {
	asked    map[string]bool  // calls whose turn was released
	approval map[string]bool  // calls whose approval request was released
	answered map[string]bool  // calls whose decision, approval or envelope was released
	held     []store.EventRow // in seq order
	ends     []store.EventRow
}

func newCausalOrder() *causalOrder {
	return &causalOrder{asked: map[string]bool{}, approval: map[string]bool{}, answered: map[string]bool{}}
}

// isRunEnd reports whether an event type is a run's end.
func isRunEnd(typ string) bool {
	return typ == events.TypeRunCompleted || typ == events.TypeRunFailed || typ == events.TypeRunCancelled
}

// add takes the next event in seq order and returns those it releases, in
// causal order.
func (o *causalOrder) add(e store.EventRow) []store.EventRow {
	if isRunEnd(e.Type) {
		o.ends = append(o.ends, e)
		return nil
	}
	if !o.ready(e) {
		o.held = append(o.held, e)
		return nil
	}
	out := o.release(nil, e)
	// Each release may make held events ready. Of those ready at once, the
	// first in a call's life goes first (an approval request before its
	// decisions, a routing before a start, an envelope last), then the
	// first published on its stream: the order the services made them in,
	// which a held batch would otherwise lose.
	for {
		best := -1
		for i, h := range o.held {
			if o.ready(h) && (best < 0 || before(h, o.held[best])) {
				best = i
			}
		}
		if best < 0 {
			return out
		}
		h := o.held[best]
		o.held = append(o.held[:best], o.held[best+1:]...)
		out = o.release(out, h)
	}
}

// callRank orders the events of one call's life.
func callRank(typ string) int {
	switch typ {
	case events.TypeCallApprovalRequired:
		return 0
	case events.TypeRunSuspended:
		return 1
	case events.TypeCallDecided:
		return 2
	case events.TypeCallApproved:
		return 3
	case events.TypeRunResumed:
		return 4
	case events.TypeCallStarted:
		return 5
	case events.TypeCallCompleted:
		return 8
	}
	if strings.HasPrefix(typ, "dev.toolwire.sandbox.") {
		return 6
	}
	return 7
}

// before orders events released together: by callRank, then by their
// place in their stream, then as recorded.
func before(a, b store.EventRow) bool {
	if ra, rb := callRank(a.Type), callRank(b.Type); ra != rb {
		return ra < rb
	}
	if a.Stream == b.Stream && a.Stream != "" && a.StreamSeq != b.StreamSeq {
		return a.StreamSeq < b.StreamSeq
	}
	return a.Seq < b.Seq
}

// finish releases what is still held (calls no turn asked for, decisions
// without their request: in seq order), then the run's end.
func (o *causalOrder) finish() []store.EventRow {
	out := append(o.held, o.ends...)
	o.held, o.ends = nil, nil
	return out
}

func (o *causalOrder) ready(e store.EventRow) bool {
	if c := statusCall(e); c != "" {
		if e.Type == events.TypeRunSuspended {
			return o.approval[c]
		}
		return o.answered[c]
	}
	if e.CallID == "" || e.Type == events.TypeTurnCompleted {
		return true
	}
	if !o.asked[e.CallID] {
		return false
	}
	switch e.Type {
	case events.TypeCallDecided:
		return o.approval[e.CallID]
	case events.TypeCallApproved:
		var d struct {
			OperatorApproved bool `json:"operator_approved"`
		}
		if json.Unmarshal(e.Data, &d) == nil && d.OperatorApproved {
			return o.approval[e.CallID]
		}
	}
	return true
}

func (o *causalOrder) release(out []store.EventRow, e store.EventRow) []store.EventRow {
	switch e.Type {
	case events.TypeTurnCompleted:
		var t struct {
			Calls []struct {
				CallID string `json:"call_id"`
			} `json:"calls"`
		}
		if json.Unmarshal(e.Data, &t) == nil {
			for _, c := range t.Calls {
				o.asked[c.CallID] = true
			}
		}
	case events.TypeCallApprovalRequired:
		o.approval[e.CallID] = true
	case events.TypeCallDecided, events.TypeCallApproved, events.TypeCallCompleted:
		o.answered[e.CallID] = true
	}
	return append(out, e)
}

// statusCall is the call a run's suspension or resumption is about, from
// its id (<run_id>/suspended/<call_id>, events.NewRunStatus); "" for any
// other event.
func statusCall(e store.EventRow) string {
	var verb string
	switch e.Type {
	case events.TypeRunSuspended:
		verb = "/" + events.StatusSuspended + "/"
	case events.TypeRunResumed:
		verb = "/" + events.StatusResumed + "/"
	default:
		return ""
	}
	c, ok := strings.CutPrefix(e.ID, e.RunID+verb)
	if !ok || events.ValidateCallID(c) != nil {
		return ""
	}
	return c
}

// ceExtensionName is a valid CloudEvents attribute name: lowercase ASCII
// letters and digits (CloudEvents 1.0, "Attribute Naming Convention").
var ceExtensionName = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

// ceContextAttrs are the CloudEvents context attributes an extension must
// not shadow.
var ceContextAttrs = map[string]bool{"specversion": true, "id": true, "source": true, "type": true,
	"time": true, "subject": true, "datacontenttype": true, "dataschema": true, "data": true, "data_base64": true}

// cloudEventJSON is a recorded event as a CloudEvent 1.0 in the JSON event
// format (structured mode): what the live stream's data carries. Its data
// is the event's own bytes; its extensions those it was published with
// whose names are CloudEvents names.
func cloudEventJSON(e store.EventRow) ([]byte, error) {
	ce := map[string]any{
		"specversion":     "1.0",
		"id":              e.ID,
		"source":          e.Source,
		"type":            e.Type,
		"time":            e.Time.UTC().Format("2006-01-02T15:04:05.999999999Z07:00"),
		"datacontenttype": "application/json",
	}
	if name := events.DataSchema(e.Type); name != "" {
		ce["dataschema"] = envelope.SchemaURL(name)
	}
	for k, v := range e.Extensions {
		if ceExtensionName.MatchString(k) && !ceContextAttrs[k] && v != "" {
			ce[k] = v
		}
	}
	if e.RunID != "" {
		ce[events.ExtRunID] = e.RunID
	}
	if e.CallID != "" {
		ce[events.ExtCallID] = e.CallID
		ce["subject"] = e.CallID // as events.Build sets it
	}
	if len(e.Data) > 0 && json.Valid(e.Data) {
		ce["data"] = json.RawMessage(e.Data)
	}
	return json.Marshal(ce)
}

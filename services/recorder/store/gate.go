package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// The gate: which consumed events may change a run's record. The recorder
// takes every event on the run and call subjects, so it must refuse what the
// services refuse, or a forged or stray event would show in a run as if it
// had happened:
//
//   - a run exists from its run request only (the orchestrator starts no run
//     from anything else): an event of a run whose request is not recorded
//     makes no run row;
//   - a call exists from the model turn that made it only (the orchestrator
//     takes the completion of a call it has pending, and nothing else): an
//     event of a call that no turn of its run requested changes no tool call
//     and no run;
//   - a run that ended stays as it ended (the orchestrator ignores whatever
//     comes after the end): an event whose time is after the run's end
//     changes nothing. Between two ends the earlier wins (Store.Write).
//
// Events still arrive in any order: the recorder reads two streams, several
// replicas share them, batches are retried. An event that waits for its run's
// request or its call's turn is not lost: its record is parked, and applied
// as soon as the request or the turn is recorded, in the order it came, so
// that the rows converge to what in-order delivery gives. An event recorded
// late that happened before the run's end (its time is not after the end)
// still applies; that is also how an operator's DLQ replay reaches a run that
// has ended: `toolwire dlq replay` publishes the dead letter again with its
// original attributes, time included, and the recorder applies it then.
//
// Every event is kept in the events table whatever the gate decides: it is
// what the recorder received (a forged event stays visible to an operator),
// while the run's record (its row, tool calls, turns, verdicts and tool
// definitions) is what the services accepted.

// RunGate is what a store holds of one run that the gate decides by.
type RunGate struct {
	// Known: the run's request is recorded (the run has a row).
	Known bool
	// End is the time of the run's end (its terminal status), if it ended.
	End *time.Time
	// Calls holds the calls its turns requested (at least those the batch
	// names).
	Calls map[string]bool
}

// Parked is a record that waits in a store for its run's request or its
// call's turn. Stored is set on a record loaded from the store (it is
// already kept there).
type Parked struct {
	Record Record
	Stored bool
}

// Admission says what Write does with a batch's new records.
type Admission struct {
	// Apply are the records whose effects apply, in the order they apply
	// (a parked record follows the request or turn that let it in).
	Apply []Record
	// Park are the records to keep waiting: the new ones to store, and the
	// stored ones still waiting (Stored set; left as they are).
	Park []Parked
	// Released are the keys of stored parked records that were applied or
	// dropped: no longer waiting.
	Released []EventKey
	// Dropped are the records whose effects never apply (kept in the events
	// table only): a second run request of a run, an event after its run's
	// end.
	Dropped []Record
}

// Admit decides, in batch order, which of recs (the batch's new records)
// apply, wait or are dropped, given what the store holds of their runs
// (runs, by run id; a run missing from it is not known) and the records
// parked for them (parked, by run id, in the order they were parked). Admit
// updates runs as the batch changes them. Writing a batch at once or record
// by record admits the same records in the same order.
func Admit(recs []Record, runs map[string]*RunGate, parked map[string][]Parked) Admission {
	if runs == nil {
		runs = map[string]*RunGate{}
	}
	if parked == nil {
		parked = map[string][]Parked{}
	}
	a := &admitter{runs: runs, pool: parked}
	for i := range recs {
		a.admit(Parked{Record: recs[i]})
	}
	for _, pool := range a.pool {
		a.out.Park = append(a.out.Park, pool...)
	}
	return a.out
}

type admitter struct {
	runs map[string]*RunGate
	pool map[string][]Parked
	out  Admission
}

func (a *admitter) run(id string) *RunGate {
	g := a.runs[id]
	if g == nil {
		g = &RunGate{}
		a.runs[id] = g
	}
	if g.Calls == nil {
		g.Calls = make(map[string]bool)
	}
	return g
}

func (a *admitter) admit(p Parked) {
	r := &p.Record
	runID := r.Event.RunID
	if !HasEffects(r) || runID == "" {
		a.apply(p, nil)
		return
	}
	g := a.run(runID)
	switch {
	case IsRunRequest(r) && g.Known:
		a.drop(p) // the run has its request: the orchestrator ignores another
	case IsRunRequest(r):
		g.Known = true
		a.apply(p, g)
	case !g.Known:
		a.park(p)
	case g.End != nil && AfterEnd(r.Event.Time, *g.End):
		a.drop(p)
	case r.Event.CallID != "" && r.Turn == nil && !g.Calls[r.Event.CallID]:
		a.park(p)
	default:
		a.apply(p, g)
	}
}

func (a *admitter) apply(p Parked, g *RunGate) {
	r := p.Record
	a.out.Apply = append(a.out.Apply, r)
	if p.Stored {
		a.out.Released = append(a.out.Released, r.Event.Key())
	}
	if g == nil {
		return
	}
	if u := r.Run; u != nil && IsTerminal(u.Status) && (g.End == nil || u.At.Before(*g.End)) {
		at := u.At
		g.End = &at
	}
	opens := IsRunRequest(&r)
	if r.Turn != nil {
		for _, c := range r.Calls {
			g.Calls[c.CallID] = true
			opens = true
		}
	}
	if pool := a.pool[r.Event.RunID]; opens && len(pool) > 0 {
		delete(a.pool, r.Event.RunID)
		for _, q := range pool {
			a.admit(q)
		}
	}
}

func (a *admitter) park(p Parked) {
	id := p.Record.Event.RunID
	a.pool[id] = append(a.pool[id], p)
}

func (a *admitter) drop(p Parked) {
	a.out.Dropped = append(a.out.Dropped, p.Record)
	if p.Stored {
		a.out.Released = append(a.out.Released, p.Record.Event.Key())
	}
}

// HasEffects reports whether r changes anything beside the events table.
func HasEffects(r *Record) bool {
	return r.Run != nil || len(r.Calls) > 0 || r.Turn != nil || r.Verdict != nil || len(r.Tools) > 0
}

// IsRunRequest reports whether r is a run's request: its update carries the
// request.
func IsRunRequest(r *Record) bool {
	return r.Run != nil && len(r.Run.Request) > 0 && string(r.Run.Request) != "null"
}

// AfterEnd reports whether an event at t happened after a run's end at end,
// to the microsecond (what Postgres keeps of a time).
func AfterEnd(t, end time.Time) bool {
	return t.Truncate(time.Microsecond).After(end.Truncate(time.Microsecond))
}

// GateRuns returns the run ids of recs that Admit needs to know about, and
// those of them whose parked records may be let in by recs (they carry a run
// request or a turn).
func GateRuns(recs []Record) (runs, opening []string) {
	seen, open := map[string]bool{}, map[string]bool{}
	for i := range recs {
		r := &recs[i]
		id := r.Event.RunID
		if id == "" || !HasEffects(r) {
			continue
		}
		if !seen[id] {
			seen[id] = true
			runs = append(runs, id)
		}
		if (IsRunRequest(r) || r.Turn != nil) && !open[id] {
			open[id] = true
			opening = append(opening, id)
		}
	}
	return runs, opening
}

// CallKey names a tool call.
type CallKey struct{ RunID, CallID string }

// GateCalls returns the calls of recs' call events (each once): Admit needs
// to know whether their turns requested them.
func GateCalls(recs []Record) []CallKey {
	seen := map[CallKey]bool{}
	var keys []CallKey
	for i := range recs {
		r := &recs[i]
		if r.Event.RunID == "" || r.Event.CallID == "" || r.Turn != nil || !HasEffects(r) {
			continue
		}
		k := CallKey{r.Event.RunID, r.Event.CallID}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// EncodeParked is the document a store keeps a parked record as: the record
// without its event's data and extensions, which the events table holds.
func EncodeParked(r Record) ([]byte, error) {
	r.Event.Data, r.Event.Extensions = nil, nil
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("%w: park event %q: %w", ErrUnstorable, r.Event.ID, err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// DecodeParked reads a document EncodeParked made.
func DecodeParked(doc []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(doc, &r); err != nil {
		return Record{}, fmt.Errorf("parked record: %w", err)
	}
	// An absent document was encoded as null: absent again.
	if u := r.Run; u != nil {
		for _, raw := range []*json.RawMessage{&u.Request, &u.Outputs, &u.Pinned, &u.OutputsBlob} {
			unNull(raw)
		}
	}
	for i := range r.Calls {
		unNull(&r.Calls[i].Input)
		unNull(&r.Calls[i].Envelope)
	}
	if r.Turn != nil {
		unNull(&r.Turn.Turn)
	}
	for i := range r.Tools {
		unNull(&r.Tools[i].Definition)
	}
	return r, nil
}

func unNull(raw *json.RawMessage) {
	if string(*raw) == "null" {
		*raw = nil
	}
}

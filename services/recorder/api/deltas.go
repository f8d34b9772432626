package api

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// DeltaSource relays the deltas of runs (the pieces of a streaming model's
// answer, pkg/events/delta.go) to live event streams.
type DeltaSource interface {
	// Deltas follows run id's deltas until stop is called (once per call):
	// held are those it holds of the run's current model call, in seq
	// order, and next receives each one that comes after them, none twice.
	// A reader too slow for next loses deltas (a gap in their seq).
	Deltas(runID string) (held []events.Delta, next <-chan events.Delta, stop func())
}

// maxHeldDeltas bounds the deltas one live stream holds back until the
// events they follow have been sent.
const maxHeldDeltas = 4096

// deltaRelay decides when a live stream sends each delta of its run, from
// the events it has sent: a delta of iteration n goes after the turn of
// iteration n-1 and the completions of the calls that turn asked for (the
// model was called again with their results), or, when the turn of
// iteration n comes first (the calls are recorded apart from the turns, and
// may be late), right before that turn (the run's end, for its last model
// call); never after it or the run's end
// (the turn is the record; what the deltas add up to is in it). Deltas
// that come early are held; those of an iteration whose turn was sent are
// dropped.
type deltaRelay struct {
	turns    map[int][]string // per iteration whose turn was sent, the calls it asked for
	done     map[string]bool  // calls whose completion was sent
	lastTurn int              // the last iteration whose turn was sent
	ended    bool             // the run's end was read
	held     []events.Delta   // in the order they came
}

func newDeltaRelay() *deltaRelay {
	return &deltaRelay{turns: map[int][]string{}, done: map[string]bool{}}
}

// sent notes an event the stream released (sent, or skipped because the
// client has it already).
func (r *deltaRelay) sent(e store.EventRow) {
	switch {
	case e.Type == events.TypeTurnCompleted:
		var t struct {
			Iteration int `json:"iteration"`
			Calls     []struct {
				CallID string `json:"call_id"`
			} `json:"calls"`
		}
		if json.Unmarshal(e.Data, &t) != nil {
			return
		}
		ids := make([]string, 0, len(t.Calls))
		for _, c := range t.Calls {
			ids = append(ids, c.CallID)
		}
		r.turns[t.Iteration] = ids
		r.lastTurn = max(r.lastTurn, t.Iteration)
	case e.Type == events.TypeCallCompleted && e.CallID != "":
		r.done[e.CallID] = true
	case isRunEnd(e.Type):
		// The run's last turn is in its end: no delta goes after it.
		r.ended, r.held = true, nil
	}
}

// before returns the held deltas to send right before e: for the turn of
// iteration n, those of iteration n that wait for its previous turn's
// calls only; for the run's end (which carries its last turn), those of
// its last model call.
func (r *deltaRelay) before(e store.EventRow) []events.Delta {
	if isRunEnd(e.Type) {
		return r.due(func(d events.Delta) bool { return d.Iteration > r.lastTurn })
	}
	if e.Type != events.TypeTurnCompleted {
		return nil
	}
	var t struct {
		Iteration int `json:"iteration"`
	}
	if json.Unmarshal(e.Data, &t) != nil {
		return nil
	}
	return r.due(func(d events.Delta) bool { return d.Iteration == t.Iteration })
}

// due takes from the held deltas those of pick whose previous turn was
// sent, in the order they came.
func (r *deltaRelay) due(pick func(events.Delta) bool) []events.Delta {
	var out []events.Delta
	kept := r.held[:0]
	for _, d := range r.held {
		_, turned := r.turns[d.Iteration-1]
		if !r.void(d) && pick(d) && (d.Iteration == 1 || turned) {
			out = append(out, d)
			continue
		}
		kept = append(kept, d)
	}
	clear(r.held[len(kept):])
	r.held = kept
	return out
}

// add takes a delta that came; false when it is dropped for want of room.
func (r *deltaRelay) add(d events.Delta) bool {
	if r.void(d) {
		return true
	}
	if len(r.held) >= maxHeldDeltas {
		return false
	}
	r.held = append(r.held, d)
	return true
}

// void says whether d is of a model call that is over for the client.
func (r *deltaRelay) void(d events.Delta) bool {
	return r.ended || d.Iteration <= r.lastTurn
}

// ready says whether the events d follows have been sent.
func (r *deltaRelay) ready(d events.Delta) bool {
	if d.Iteration == 1 {
		return true
	}
	calls, ok := r.turns[d.Iteration-1]
	if !ok {
		return false
	}
	for _, c := range calls {
		if !r.done[c] {
			return false
		}
	}
	return true
}

// release returns the held deltas that may go now, in the order they came,
// and drops those that are void.
func (r *deltaRelay) release() []events.Delta {
	var out []events.Delta
	kept := r.held[:0]
	for _, d := range r.held {
		switch {
		case r.void(d):
		case r.ready(d):
			out = append(out, d)
		default:
			kept = append(kept, d)
		}
	}
	clear(r.held[len(kept):])
	r.held = kept
	return out
}

// writeDeltas writes deltas as SSE messages of event type "delta", without
// an id: Last-Event-ID keeps naming the last stored event received.
func writeDeltas(w io.Writer, ds []events.Delta) error {
	for _, d := range ds {
		b, err := json.Marshal(d)
		if err != nil {
			return fmt.Errorf("delta: %w", err)
		}
		if _, err := fmt.Fprintf(w, "event: delta\ndata: %s\n\n", b); err != nil {
			return fmt.Errorf("delta: %w", err)
		}
	}
	return nil
}

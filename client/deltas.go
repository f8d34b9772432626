package client

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/events"
)

// FollowOption configures Follow.
type FollowOption func(*followConfig)

type followConfig struct {
	deltas     bool
	subscribed func(context.Context) error
}

// WithSubscribed has Follow call fn once its subscriptions are in place,
// before it reads the run's events; an error of fn ends Follow with it. A
// run submitted there (as `toolwire run` does) has none of its deltas
// published before Follow listens.
func WithSubscribed(fn func(ctx context.Context) error) FollowOption {
	return func(c *followConfig) { c.subscribed = fn }
}

// WithDeltas has Follow deliver the run's deltas too, for an agent that
// streams (envelope.Agent.Stream): the pieces of each model call's answer
// as it grows (pkg/events/delta.go), as Events whose Delta is set. They are
// on core NATS only: Follow sees those published while it follows (not
// those before, which no stream keeps; the recorder's live stream holds
// the current model call's), and a slow reader may miss some (a gap in
// their Seq). A delta comes after the events it follows (the previous turn
// and the completions of its calls), or at the latest right before its own
// turn (the run's end, for the last model call), never after it; a
// Discarded one voids what its attempt streamed.
func WithDeltas() FollowOption {
	return func(c *followConfig) { c.deltas = true }
}

// followRoom is how many deltas Follow takes ahead of its reader, and
// maxHeldDeltas how many it holds until the events they follow come.
const (
	followRoom    = 1024
	maxHeldDeltas = 4096
)

// deltaFeed is what Follow hears of a run's deltas: the messages on their
// subjects, handed over by the connection's reader in the order they came
// (a channel subscription), so that a delta published before an event is
// in msgs by the time a read returns the event; and the order they are
// delivered in.
type deltaFeed struct {
	msgs  chan *nats.Msg
	sub   *nats.Subscription
	order *deltaOrder
}

// subscribeDeltas subscribes nc to the deltas of run id. A message the
// feed has no room for is lost (a gap in Seq).
func subscribeDeltas(nc *nats.Conn, runID string) (*deltaFeed, error) {
	subj, err := events.DeltaRunSubjects(runID)
	if err != nil {
		return nil, err
	}
	f := &deltaFeed{msgs: make(chan *nats.Msg, followRoom), order: newDeltaOrder()}
	if f.sub, err = nc.ChanSubscribe(subj, f.msgs); err != nil {
		return nil, fmt.Errorf("follow %s: %w", subj, err)
	}
	return f, nil
}

// take holds the delta of m; one that is not valid is dropped.
func (f *deltaFeed) take(m *nats.Msg) {
	if d, err := events.DecodeDelta(m.Subject, m.Data); err == nil {
		f.order.add(d)
	}
}

// absorb takes every message come so far, and says how many.
func (f *deltaFeed) absorb() int {
	for n := 0; ; n++ {
		select {
		case m := <-f.msgs:
			f.take(m)
		default:
			return n
		}
	}
}

// send hands fn the deltas that may go now; false when fn says stop.
func (f *deltaFeed) send(fn func(Event) bool) bool {
	return sendDeltas(fn, f.order.release())
}

// sendDeltas hands fn ds; false when fn says stop.
func sendDeltas(fn func(Event) bool, ds []events.Delta) bool {
	for _, d := range ds {
		if !fn(Event{Delta: &d}) {
			return false
		}
	}
	return true
}

// deltaOrder decides when Follow delivers each delta, from the events it
// has delivered: one of iteration n after the turn of iteration n-1 and
// the completions of the calls that turn asked for (the model was called
// again with their results), or right before the turn of iteration n (or
// the run's end) when that comes first (Follow delivers a turn without
// waiting for the calls of the one before); none of an iteration whose
// turn, or after the run's end, was delivered. Those that come early are
// held.
type deltaOrder struct {
	turns    map[int][]string // per iteration whose turn was delivered, its calls
	done     map[string]bool  // calls whose completion was delivered
	lastTurn int
	started  bool // an event was delivered: the first model call's deltas may go
	ended    bool
	held     []events.Delta
}

func newDeltaOrder() *deltaOrder {
	return &deltaOrder{turns: map[int][]string{}, done: map[string]bool{}}
}

// delivered notes an event Follow delivered.
func (o *deltaOrder) delivered(e Event) {
	if e.Event == nil {
		return
	}
	o.started = true
	switch typ := e.Event.Type(); {
	case typ == events.TypeTurnCompleted:
		var t events.Turn
		if events.DecodeData(e.Event, &t) != nil {
			return
		}
		ids := make([]string, 0, len(t.Calls))
		for _, c := range t.Calls {
			ids = append(ids, c.CallID)
		}
		o.turns[t.Iteration] = ids
		o.lastTurn = max(o.lastTurn, t.Iteration)
	case typ == events.TypeCallCompleted && e.Subject.CallID != "":
		o.done[e.Subject.CallID] = true
	case events.IsEndType(typ):
		o.ended, o.held = true, nil
	}
}

// before returns the held deltas to deliver right before e: for the turn
// of iteration n, those of iteration n that wait for its previous turn's
// calls only; for the run's end (which carries its last turn), those of
// its last model call.
func (o *deltaOrder) before(e Event) []events.Delta {
	if e.Event == nil {
		return nil
	}
	switch typ := e.Event.Type(); {
	case events.IsEndType(typ):
		return o.due(func(d events.Delta) bool { return d.Iteration > o.lastTurn })
	case typ == events.TypeTurnCompleted:
		n := e.Subject.Iteration
		return o.due(func(d events.Delta) bool { return d.Iteration == n })
	}
	return nil
}

// due takes from the held deltas those of pick whose previous turn was
// delivered, in the order they came.
func (o *deltaOrder) due(pick func(events.Delta) bool) []events.Delta {
	var out []events.Delta
	kept := o.held[:0]
	for _, d := range o.held {
		_, turned := o.turns[d.Iteration-1]
		if !o.void(d) && pick(d) && (turned || d.Iteration == 1 && o.started) {
			out = append(out, d)
			continue
		}
		kept = append(kept, d)
	}
	clear(o.held[len(kept):])
	o.held = kept
	return out
}

// add holds a delta that came (dropped when it is void, or past
// maxHeldDeltas).
func (o *deltaOrder) add(d events.Delta) {
	if !o.void(d) && len(o.held) < maxHeldDeltas {
		o.held = append(o.held, d)
	}
}

func (o *deltaOrder) void(d events.Delta) bool { return o.ended || d.Iteration <= o.lastTurn }

func (o *deltaOrder) ready(d events.Delta) bool {
	if d.Iteration == 1 {
		return o.started
	}
	calls, ok := o.turns[d.Iteration-1]
	if !ok {
		return false
	}
	for _, c := range calls {
		if !o.done[c] {
			return false
		}
	}
	return true
}

// release returns the held deltas that may go now, in the order they came,
// and drops the void ones.
func (o *deltaOrder) release() []events.Delta {
	var out []events.Delta
	kept := o.held[:0]
	for _, d := range o.held {
		switch {
		case o.void(d):
		case o.ready(d):
			out = append(out, d)
		default:
			kept = append(kept, d)
		}
	}
	clear(o.held[len(kept):])
	o.held = kept
	return out
}

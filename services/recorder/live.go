package recorder

import (
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// live follows, on core NATS, the runs that clients of the API wait on (a
// live event stream is open on them), and nudges the recorder's consumer of
// each event's stream as the event goes by (consume.Runner.Nudge): the
// recorder polls its consumers (Config.Poll) to stay off the agent loop's
// critical path, and a run someone is watching is recorded as it happens
// instead of up to a poll later. What it hears is only a wake-up: the
// events are recorded from the streams, in their order, as always.
//
// It also takes the deltas of the runs whose streams follow them (the
// pieces of a streaming model's answer, pkg/events/delta.go, which no
// stream keeps; Deltas): it holds those of each one's current model call
// (deltaBuffer), so that a stream opened mid-turn shows the answer so far,
// and hands each new one to the streams.
type live struct {
	nc  *nats.Conn
	log *slog.Logger

	mu     sync.Mutex
	nudges map[string]func() // by stream: its runner's Nudge; set by Start
	runs   map[string]*watched
}

// watched is one run's subscriptions and how many waiters share them.
type watched struct {
	n    int
	subs []*nats.Subscription
	// deltas is the subscription to the run's deltas while readers, the
	// channels of the streams that follow them (Deltas), are not empty;
	// buf holds those of the run's current model call meanwhile.
	deltas  *nats.Subscription
	buf     deltaBuffer
	readers map[chan events.Delta]struct{}
}

// deltaReaderRoom is how many deltas a stream may be behind before it loses
// some.
const deltaReaderRoom = 256

// subscribeFlush bounds the wait for a run's delta subscription to be in
// place on the server.
const subscribeFlush = 2 * time.Second

func newLive(nc *nats.Conn, log *slog.Logger) *live {
	return &live{nc: nc, log: log, nudges: map[string]func(){}, runs: map[string]*watched{}}
}

// setNudge registers the nudge of the consumer of stream.
func (l *live) setNudge(stream string, nudge func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nudges[stream] = nudge
}

// nudge wakes the consumer of stream, if it has one.
func (l *live) nudge(stream string) {
	l.mu.Lock()
	n := l.nudges[stream]
	l.mu.Unlock()
	if n != nil {
		n()
	}
}

// Watch follows run id until the returned function is called (once per
// Watch). A run id that is no subject token is not followed. Without a
// connection, or when a subscription is refused, the run is recorded at
// the consumers' pace, as any other (and its deltas are not relayed).
func (l *live) Watch(runID string) (stop func()) {
	if l == nil || l.nc == nil || events.ValidateRunID(runID) != nil {
		return func() {}
	}
	l.mu.Lock()
	l.watch(runID).n++
	l.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { l.release(runID) }) }
}

// watch returns run id's watch, subscribing when it is new; l.mu is held.
func (l *live) watch(runID string) *watched {
	if w := l.runs[runID]; w != nil {
		return w
	}
	w := &watched{readers: map[chan events.Delta]struct{}{}}
	for _, s := range []struct{ prefix, stream string }{
		{events.Prefix + ".run.", events.StreamRuns},
		{events.Prefix + ".call.", events.StreamCalls},
		{events.Prefix + ".sandbox.", events.StreamSandbox},
	} {
		stream := s.stream
		sub, err := l.nc.Subscribe(s.prefix+runID+".>", func(*nats.Msg) { l.nudge(stream) })
		if err != nil {
			l.log.Debug("live: cannot follow the run; it is recorded at the consumers' pace", "run_id", runID, "err", err)
			continue
		}
		w.subs = append(w.subs, sub)
	}
	l.runs[runID] = w
	// What the run published before it was followed is in the streams,
	// waiting for a poll: fetch it now. The fetches go out on the
	// connection after the subscriptions, so nothing published in between
	// is missed by both.
	for _, n := range l.nudges {
		n()
	}
	return w
}

// release ends one waiter's watch of run id: the last one unsubscribes.
func (l *live) release(runID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.runs[runID]
	if w == nil {
		return
	}
	if w.n--; w.n > 0 {
		return
	}
	for _, sub := range w.subs {
		_ = sub.Unsubscribe()
	}
	if w.deltas != nil {
		_ = w.deltas.Unsubscribe()
	}
	delete(l.runs, runID)
}

// Deltas follows run id's deltas (api.DeltaSource): it watches the run
// (Watch) until stop, subscribed to its deltas while it has a reader (a
// stream whose principal may see the run: the API asks only then), and
// returns the deltas held of its current model call and a channel of the
// next ones. The two are taken together: a delta is in one or the other,
// never both, never neither.
func (l *live) Deltas(runID string) (held []events.Delta, next <-chan events.Delta, stop func()) {
	unwatch := l.Watch(runID)
	if l == nil || l.nc == nil {
		return nil, nil, unwatch
	}
	ch := make(chan events.Delta, deltaReaderRoom)
	l.mu.Lock()
	w := l.runs[runID]
	fresh := false
	if w != nil {
		fresh = l.subscribeDeltas(runID, w)
		held = w.buf.held()
		w.readers[ch] = struct{}{}
	}
	l.mu.Unlock()
	if fresh {
		// Deltas are on core NATS only: what is published before the
		// server has the subscription is lost. The wait is bounded; past
		// it the subscription still comes, a moment later.
		if err := l.nc.FlushTimeout(subscribeFlush); err != nil {
			l.log.Debug("live: the run's delta subscription is not confirmed yet", "run_id", runID, "err", err)
		}
	}
	var once sync.Once
	return held, ch, func() {
		once.Do(func() {
			l.mu.Lock()
			if w != nil {
				l.dropReader(w, ch)
			}
			l.mu.Unlock()
			unwatch()
		})
	}
}

// subscribeDeltas subscribes w, run id's watch, to the run's deltas unless
// it is; true when it has just done so. l.mu is held.
func (l *live) subscribeDeltas(runID string, w *watched) bool {
	if w.deltas != nil {
		return false
	}
	subj, err := events.DeltaRunSubjects(runID)
	if err == nil {
		w.deltas, err = l.nc.Subscribe(subj, func(m *nats.Msg) { l.delta(runID, m) })
	}
	if err != nil {
		l.log.Debug("live: cannot follow the run's deltas; its streams show its turns only", "run_id", runID, "err", err)
		return false
	}
	return true
}

// dropReader ends a reader of w's deltas: the last one unsubscribes, and
// what was held goes. l.mu is held.
func (l *live) dropReader(w *watched, ch chan events.Delta) {
	delete(w.readers, ch)
	if len(w.readers) > 0 || w.deltas == nil {
		return
	}
	_ = w.deltas.Unsubscribe()
	w.deltas, w.buf = nil, deltaBuffer{}
}

// delta takes a message on run id's delta subjects: a valid delta is held
// and handed to the run's readers; any other is dropped.
func (l *live) delta(runID string, m *nats.Msg) {
	d, err := events.DecodeDelta(m.Subject, m.Data)
	if err != nil {
		l.log.Debug("live: an invalid delta; dropped", "run_id", runID, "subject", m.Subject, "err", err)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.runs[runID]
	if w == nil {
		return // no longer watched
	}
	out, full := w.buf.add(d, len(m.Data))
	if full {
		l.log.Warn("live: the run's model call streams more than a stream opened now is shown; "+
			"its later deltas go to the streams open already only",
			"run_id", runID, "iteration", d.Iteration, "max_deltas", maxBufferedDeltas, "max_bytes", maxBufferedBytes)
	}
	for _, d := range out {
		for ch := range w.readers {
			select {
			case ch <- d:
			default:
				l.log.Debug("live: a stream is too slow for the run's deltas; it loses one", "run_id", runID, "seq", d.Seq)
			}
		}
	}
}

// recorded is told of the records just committed: a run's turn, or its
// end, makes the deltas held of that model call (and those before) void.
func (l *live) recorded(recs []store.Record) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.runs) == 0 {
		return
	}
	for i := range recs {
		e := &recs[i].Event
		w := l.runs[e.RunID]
		if w == nil {
			continue
		}
		switch {
		case e.Type == events.TypeRunCompleted || e.Type == events.TypeRunFailed || e.Type == events.TypeRunCancelled:
			w.buf.drop(math.MaxInt)
		case recs[i].Turn != nil:
			w.buf.drop(recs[i].Turn.Iteration)
		}
	}
}

// Bounds of the deltas held of one run's model call.
const (
	maxBufferedDeltas = 4096
	maxBufferedBytes  = 1 << 20
)

// deltaBuffer holds the deltas of a run's current model call, from its
// last discarded attempt on, for the streams that open mid-call.
type deltaBuffer struct {
	iteration int            // the model call held; 0: none yet
	closed    int            // the last iteration whose turn was recorded
	ds        []events.Delta // in seq order
	bytes     int
	full      bool // deltas of the call were dropped for want of room
}

// add takes the next delta on the run's subjects and returns what to hand
// the readers (none for a delta of a call that is over; a discarded delta
// before it when the call started over without saying so), and whether
// the buffer has just run out of room.
func (b *deltaBuffer) add(d events.Delta, size int) (out []events.Delta, full bool) {
	switch {
	case d.Iteration <= b.closed || d.Iteration < b.iteration:
		return nil, false // its turn is recorded, or a later call is under way
	case d.Iteration > b.iteration:
		b.reset(d.Iteration)
	case len(b.ds) > 0 && d.Seq <= b.ds[len(b.ds)-1].Seq && !b.ds[len(b.ds)-1].Discarded:
		// The call started over (a redelivery, another orchestrator)
		// without its discarded delta: what was streamed is void.
		last := b.ds[len(b.ds)-1]
		void := events.Delta{RunID: d.RunID, Iteration: d.Iteration, Attempt: last.Attempt, Seq: last.Seq + 1, Discarded: true}
		out = append(out, void)
		b.reset(d.Iteration)
		b.keep(void, 0)
	}
	if d.Discarded {
		// What the attempt streamed is void: a stream opened now needs
		// only the news.
		b.reset(d.Iteration)
	}
	full = b.keep(d, size)
	return append(out, d), full
}

// keep holds d when there is room; true when it has just run out.
func (b *deltaBuffer) keep(d events.Delta, size int) bool {
	if b.full {
		return false
	}
	if len(b.ds) >= maxBufferedDeltas || b.bytes+size > maxBufferedBytes {
		b.full = true
		return true
	}
	b.ds = append(b.ds, d)
	b.bytes += size
	return false
}

// reset empties the buffer for model call iteration.
func (b *deltaBuffer) reset(iteration int) {
	*b = deltaBuffer{iteration: iteration, closed: b.closed}
}

// drop forgets the deltas of iteration and those before: its turn is
// recorded.
func (b *deltaBuffer) drop(iteration int) {
	b.closed = max(b.closed, iteration)
	if b.iteration <= iteration {
		b.reset(b.iteration)
	}
}

// held returns a copy of the deltas held.
func (b *deltaBuffer) held() []events.Delta {
	return append([]events.Delta(nil), b.ds...)
}

package recorder

import (
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/events"
)

// live follows, on core NATS, the runs that clients of the API wait on (a
// live event stream is open on them), and nudges the recorder's consumer of
// each event's stream as the event goes by (consume.Runner.Nudge): the
// recorder polls its consumers (Config.Poll) to stay off the agent loop's
// critical path, and a run someone is watching is recorded as it happens
// instead of up to a poll later. What it hears is only a wake-up: the
// events are recorded from the streams, in their order, as always.
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
}

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
// the consumers' pace, as any other.
func (l *live) Watch(runID string) (stop func()) {
	if l == nil || l.nc == nil || events.ValidateRunID(runID) != nil {
		return func() {}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.runs[runID]
	if w == nil {
		w = &watched{}
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
		// What the run published before it was followed is in the
		// streams, waiting for a poll: fetch it now. The fetches go out on
		// the connection after the subscriptions, so nothing published
		// in between is missed by both.
		for _, n := range l.nudges {
			n()
		}
	}
	w.n++
	var once sync.Once
	return func() { once.Do(func() { l.release(runID) }) }
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
	delete(l.runs, runID)
}

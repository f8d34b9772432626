package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Stored is what a batch of runs stored, counted at the server: the messages
// its events added to toolwire's event streams and the writes it made to
// the KV buckets, per run and per tool call.
type Stored struct {
	Runs        int     `json:"runs"`
	CallsPerRun int     `json:"calls_per_run"`
	Events      uint64  `json:"events"`
	KVWrites    uint64  `json:"kv_writes"`
	PerRun      float64 `json:"events_per_run"`
	PerCall     float64 `json:"events_per_tool_call"`
	KVPerCall   float64 `json:"kv_writes_per_tool_call"`
	// ByStream is the events by stream.
	ByStream map[string]uint64 `json:"events_by_stream"`
}

// eventStreams are the streams that hold toolwire's events.
var eventStreams = []string{events.StreamRuns, events.StreamCalls, events.StreamSandbox, events.StreamDLQ}

// serverCounts reads each stream's last sequence: every message ever stored
// on it, deleted or not.
func serverCounts(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	out := map[string]uint64{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		// The KV buckets and the timers (a run's deadline: one message
		// per run) are the state writes.
		if strings.HasPrefix(name, "KV_") || name == provision.StreamTimers {
			out[name] = 0
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("stream names: %w", err)
	}
	for _, name := range eventStreams {
		out[name] = 0
	}
	for name := range out {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		out[name] = info.State.LastSeq
	}
	return out, nil
}

// countStored runs n runs of k echo calls in one turn, inFlight at a time,
// with nothing else going on, and counts what they stored at the server.
func countStored(ctx context.Context, js jetstream.JetStream, run *runner, n, k, inFlight int) (Stored, error) {
	s := Stored{Runs: n, CallsPerRun: k, ByStream: map[string]uint64{}}
	// Let what came before settle: its last events are stored by now.
	time.Sleep(200 * time.Millisecond)
	before, err := serverCounts(ctx, js)
	if err != nil {
		return s, err
	}
	sem := make(chan struct{}, inFlight)
	errs := make(chan error, n)
	for range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, err := run.run(cctx, run.request("echo", echoArgs(k)))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			return s, err
		}
	}
	// A run's end is its last event; the writes that follow it (its
	// state's last revision) are stored within a moment.
	time.Sleep(200 * time.Millisecond)
	after, err := serverCounts(ctx, js)
	if err != nil {
		return s, err
	}
	for name, seq := range after {
		d := seq - before[name]
		if strings.HasPrefix(name, "KV_") || name == provision.StreamTimers {
			s.KVWrites += d
			continue
		}
		s.Events += d
		s.ByStream[name] = d
	}
	s.PerRun = float64(s.Events) / float64(n)
	if k > 0 {
		s.PerCall = float64(s.Events) / float64(n*k)
		s.KVPerCall = float64(s.KVWrites) / float64(n*k)
	}
	return s, nil
}

// Hop is one step of a one-call run, timed by the server: from the time the
// stream stored the event that starts it to the time it stored the event
// that ends it (so a hop counts its delivery, its service's work and its
// publish).
type Hop struct {
	Name    string `json:"name"`
	Latency Dist   `json:"latency"`
}

// Steps of a one-call run, each between two stored events.
var hopSteps = []struct{ name, from, to string }{
	{"request -> turn (orchestrator)", "requested", "turn"},
	{"turn -> approved (policy)", "turn", "approved"},
	{"approved -> completed (executor)", "approved", "completed"},
	{"completed -> end (orchestrator)", "completed", "end"},
}

// runHops times the steps of the given one-call runs from the stored times
// of their events: which hop a run's latency goes to, with no clock but the
// server's.
func runHops(ctx context.Context, js jetstream.JetStream, runIDs []string) ([]Hop, error) {
	want := make(map[string]map[string]time.Time, len(runIDs))
	for _, id := range runIDs {
		want[id] = map[string]time.Time{}
	}
	for _, stream := range []string{events.StreamRuns, events.StreamCalls} {
		if err := storedTimes(ctx, js, stream, want); err != nil {
			return nil, err
		}
	}
	hops := make([]Hop, 0, len(hopSteps))
	for _, s := range hopSteps {
		var lat []time.Duration
		for _, at := range want {
			from, ok1 := at[s.from]
			to, ok2 := at[s.to]
			if ok1 && ok2 {
				lat = append(lat, to.Sub(from))
			}
		}
		if len(lat) == 0 {
			return nil, fmt.Errorf("bench: no run stored both its %s and its %s event", s.from, s.to)
		}
		hops = append(hops, Hop{Name: s.name, Latency: distOf(lat)})
	}
	return hops, nil
}

// storedTimes reads stream from its start up to its last message now and
// notes, for each run of want, when each of its events was stored.
func storedTimes(ctx context.Context, js jetstream.JetStream, stream string, want map[string]map[string]time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("bench: %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bench: %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("bench: %s: %w", stream, err)
	}
	for {
		m, err := c.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return fmt.Errorf("bench: %s: read up to %d: %w", stream, last, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("bench: %s: %w", stream, err)
		}
		// toolwire.run.<run>.<...> and toolwire.call.<run>.<call>.<verb>[.<queue>]
		t := strings.Split(m.Subject(), ".")
		if at, ok := want[t[min(2, len(t)-1)]]; ok && len(t) >= 4 {
			switch {
			case t[1] == "run" && t[3] == "requested":
				at["requested"] = md.Timestamp
			case t[1] == "run" && t[3] == "turn":
				at["turn"] = md.Timestamp
			case t[1] == "run" && t[3] == "completed":
				at["end"] = md.Timestamp
			case t[1] == "call" && len(t) >= 5 && t[4] == "approved":
				at["approved"] = md.Timestamp
			case t[1] == "call" && len(t) >= 5 && t[4] == "completed":
				at["completed"] = md.Timestamp
			}
		}
		if md.Sequence.Stream >= last {
			return nil
		}
	}
}

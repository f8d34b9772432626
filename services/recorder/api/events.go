package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// Limits of the events endpoints.
const (
	defaultEventsLimit = 500
	maxEventsLimit     = 5000
	streamPage         = 500
)

// runID reads and checks the path's run id, or writes the error.
func (a *api) runID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("run_id")
	if events.ValidateRunID(id) != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidRunID,
			fmt.Sprintf("run_id %q is not a run id: a run id is 1 to 64 letters, digits, '-' or '_'", clip(id)))
		return "", false
	}
	return id, true
}

// clip shortens a path parameter an error message quotes to 80 bytes.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// knownRun answers whether the store has the run or any event of it (an
// event of an unknown type has no run row), writing a 404 when it has neither.
func (a *api) knownRun(w http.ResponseWriter, r *http.Request, id string) (*store.Run, bool) {
	p := auth.FromContext(r.Context())
	run, err := a.store.Run(r.Context(), id)
	if err == nil {
		if !p.Sees(run.Tenant) {
			notFoundRun(w, id)
			return nil, false
		}
		return &run, true
	}
	if !errors.Is(err, store.ErrRunNotFound) {
		a.internal(w, r, err)
		return nil, false
	}
	if !p.AllTenants() {
		// Events without a run row have no known tenant: operators only.
		notFoundRun(w, id)
		return nil, false
	}
	evs, err := a.store.EventsAfter(r.Context(), id, 0, 1)
	if err != nil {
		a.internal(w, r, err)
		return nil, false
	}
	if len(evs) == 0 {
		notFoundRun(w, id)
		return nil, false
	}
	return nil, true
}

func parseAfter(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("event id %q must be a whole number, 0 or more (the seq of the last event received)", v)
	}
	return n, nil
}

func (a *api) getEvents(w http.ResponseWriter, r *http.Request) {
	id, ok := a.runID(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	after, err := parseAfter(q.Get("after"))
	if err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, "after: "+err.Error())
		return
	}
	limit := defaultEventsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter,
				fmt.Sprintf("limit %q must be a whole number from 1 to %d", v, maxEventsLimit))
			return
		}
		limit = min(n, maxEventsLimit)
	}
	if _, ok := a.knownRun(w, r, id); !ok {
		return
	}
	evs, err := a.store.EventsAfter(r.Context(), id, after, limit)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	next := after
	if len(evs) > 0 {
		next = evs[len(evs)-1].Seq
	}
	writeJSON(w, http.StatusOK, apitypes.EventsJSON{RunID: id, Events: eventsJSON(evs), NextAfter: next})
}

// streamEvents serves a run's events as Server-Sent Events, each message's
// data a CloudEvent in the JSON event format (cloudEventJSON), in causal
// order (causalOrder): every event of the run, then each new one as it is
// recorded, the run's end last; then an "end" event closes the stream.
//
// It may be opened before the run is recorded (a client that has just
// submitted it): it waits for the run, at most Options.StreamWait, with
// comments meanwhile, and ends with an "error" event when it does not come.
// A run the principal may not see is waited for exactly as one never
// recorded.
//
// A message's SSE id is its event's seq. A client that reconnects with
// Last-Event-ID (an EventSource does so by itself) gets what came after
// that event in the same causal order: the run's events are replayed from
// the first through causalOrder, which is deterministic, and what was
// released up to that event is not sent again. ?after=seq instead skips
// every event recorded up to seq (what a page already shows).
//
// For a run whose agent streams, the stream also relays the model's answer
// as it grows (Options.Deltas): messages of event type "delta", data a
// events.Delta, without an id (Last-Event-ID keeps meaning the stored
// events'). A client that connects mid-turn gets the stored events, then
// the deltas of the current model call so far, then the live ones; a delta
// goes after the events it follows and never after its turn (deltaRelay).
func (a *api) streamEvents(w http.ResponseWriter, r *http.Request) {
	id, ok := a.runID(w, r)
	if !ok {
		return
	}
	var resume, after int64
	var err error
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		if resume, err = parseAfter(v); err != nil {
			writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, "Last-Event-ID: "+err.Error())
			return
		}
	} else if after, err = parseAfter(r.URL.Query().Get("after")); err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, "after: "+err.Error())
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // tell nginx-like proxies not to buffer
	w.WriteHeader(http.StatusOK)
	// Flushed with what comes next (a comment while waiting for the run,
	// or its first events): a reader sees one head whether or not the run
	// is known.
	if _, err := fmt.Fprint(w, "retry: 2000\n\n"); err != nil {
		return
	}

	if a.opts.Live != nil {
		stop := a.opts.Live.Watch(id)
		defer stop()
	}
	// The run's deltas are followed from the start (core NATS keeps none
	// for a late subscriber: the first pieces of an answer often come
	// while the stream still waits for the run to be recorded), and kept
	// apart until the run proves to be the principal's to see.
	var heldDeltas []events.Delta
	var pendingDeltas <-chan events.Delta
	if a.opts.Deltas != nil {
		held, next, stop := a.opts.Deltas.Deltas(id)
		defer stop()
		heldDeltas, pendingDeltas = held, next
	}
	var changed <-chan struct{}
	if a.opts.Changes != nil {
		ch, cancel := a.opts.Changes.Subscribe(id)
		defer cancel()
		changed = ch
	}
	poll := time.NewTicker(a.opts.Poll)
	defer poll.Stop()
	beat := time.NewTicker(a.opts.Heartbeat)
	defer beat.Stop()
	ctx := r.Context()
	// The run's deltas (set once the run is visible to the principal) and
	// what decides when each goes (deltaRelay).
	relay := newDeltaRelay()
	var deltas <-chan events.Delta
	// relayDeltas writes the deltas that may go now; false: the stream is
	// over.
	relayDeltas := func() bool {
		ds := relay.release()
		if len(ds) == 0 {
			return true
		}
		return writeDeltas(w, ds) == nil && rc.Flush() == nil
	}
	// wait waits for the next change, a poll or a heartbeat, relaying the
	// deltas that come meanwhile; false: the stream is over.
	var quiet <-chan time.Time // set while a settled run's stream waits out settleQuiet
	wait := func() bool {
		for {
			select {
			case <-ctx.Done():
				return false
			case <-a.opts.Done:
				return false // the recorder stops: the client reconnects to another one
			case d := <-deltas:
				if !relay.add(d) {
					a.log.Debug("event stream: too many deltas held; dropped", "run_id", id, "iteration", d.Iteration, "seq", d.Seq)
				}
				if !relayDeltas() {
					return false
				}
				continue // deltas need no read of the store
			case <-changed:
			case <-poll.C:
			case <-quiet:
			case <-beat.C:
				// The credentials are checked again at each heartbeat: a token
				// revoked (or expired) meanwhile ends the stream, and the
				// client's reconnection is refused.
				if _, err := a.opts.Auth.Authenticate(r); err != nil {
					a.log.Info("event stream: credentials no longer valid; closing", "run_id", id, "err", err)
					return false
				}
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
					return false
				}
			}
			return true
		}
	}

	// The run may not be recorded yet: wait for it, bounded.
	giveUp := time.Now().Add(a.opts.StreamWait)
	for {
		known, err := a.visible(ctx, id)
		if err != nil && ctx.Err() == nil {
			a.log.Warn("event stream: read failed; the client will reconnect", "run_id", id, "err", err)
			return
		}
		if known {
			break
		}
		if time.Now().After(giveUp) {
			b, _ := json.Marshal(apitypes.ErrorJSON{Error: apitypes.ErrorBody{Code: apitypes.CodeRunNotFound,
				Message: fmt.Sprintf("run %q is not recorded: it did not appear within %s", id, a.opts.StreamWait)}})
			_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
			_ = rc.Flush()
			return
		}
		if _, err := fmt.Fprint(w, ": waiting for the run to be recorded\n\n"); err != nil || rc.Flush() != nil {
			return
		}
		if !wait() {
			return
		}
	}

	// The run is the principal's to see: so are its deltas, those held of
	// its current model call first, then those that came while the stream
	// waited for the run.
	for _, d := range heldDeltas {
		relay.add(d)
	}
	deltas = pendingDeltas

	// A Last-Event-ID that is no event of the run (a client's own number)
	// resumes as after= does.
	if resume > 0 {
		found, err := a.hasEvent(ctx, id, resume)
		if err != nil {
			return
		}
		if !found {
			resume, after = 0, resume
		}
	}
	skipping := resume > 0
	order := newCausalOrder()
	send := func(evs []store.EventRow) bool {
		for _, e := range evs {
			if skipping || e.Seq <= after {
				skipping = skipping && e.Seq != resume
				relay.sent(e) // the client has it
				continue
			}
			b, err := cloudEventJSON(e)
			if err != nil {
				return false
			}
			if writeDeltas(w, relay.before(e)) != nil {
				return false
			}
			relay.sent(e)
			if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b); err != nil {
				return false
			}
		}
		return true
	}
	// The streams of a run (runs, calls, sandbox) have no order between them
	// and the recorder writes concurrently, so an event can be recorded after
	// the run's end: the stream ends once the run is settled and every event
	// its streams hold has been read here (streamsRead), or, without a NATS
	// connection to ask, once nothing new has come for settleQuiet; at the
	// latest store.SettleWait after this stream first saw its end.
	var read int64 // the seq of the last event read
	lastNew, endSeen := time.Now(), time.Time{}
	seen := map[string]uint64{} // per stream, how many of its events were read
	recheck := streamsRecheck
	for {
		evs, err := a.store.EventsAfter(ctx, id, read, streamPage)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("event stream: read failed; the client will reconnect", "run_id", id, "err", err)
			}
			return
		}
		for _, e := range evs {
			if !send(order.add(e)) {
				return
			}
			read = e.Seq
			if e.Stream != "" {
				seen[e.Stream]++ // one row per event, and per message
			}
		}
		// The deltas the events just sent let go (or those held when the
		// stream began), after them.
		if !relayDeltas() {
			return
		}
		if len(evs) > 0 {
			lastNew = time.Now()
			if rc.Flush() != nil {
				return
			}
			if len(evs) == streamPage {
				continue // more waiting
			}
		}
		// Whether the run is over is asked after new events too: its end
		// may have been among them.
		if run, terminal, complete := a.settled(ctx, id); terminal {
			if a.streamEnds(ctx, id, &endSeen, lastNew, complete, seen) {
				if !send(order.finish()) {
					return
				}
				b, _ := json.Marshal(apitypes.StreamEndJSON{RunID: id, Status: run.Status})
				_, _ = fmt.Fprintf(w, "event: end\ndata: %s\n\n", b)
				_ = rc.Flush()
				return
			}
			if complete && a.opts.JS == nil {
				// Wake when the quiet period is over, not at the next poll:
				// the run's end is held until then.
				quiet = time.After(max(settleQuiet-time.Since(lastNew), time.Millisecond))
			} else if complete {
				// Events the streams hold are being recorded, by this
				// recorder (whose commits wake the stream) or another
				// replica: look again soon, not only at the next poll,
				// and less often the longer it takes.
				quiet = time.After(recheck)
				recheck = min(2*recheck, a.opts.Poll)
			}
		}
		if !wait() {
			return
		}
	}
}

// visible reports whether the principal of ctx sees run id: its run is
// recorded and of the principal's tenant, or (for an operator) events of
// it are.
func (a *api) visible(ctx context.Context, id string) (bool, error) {
	p := auth.FromContext(ctx)
	run, err := a.store.Run(ctx, id)
	if err == nil {
		return p.Sees(run.Tenant), nil
	}
	if !errors.Is(err, store.ErrRunNotFound) {
		return false, err
	}
	if !p.AllTenants() {
		return false, nil
	}
	evs, err := a.store.EventsAfter(ctx, id, 0, 1)
	return len(evs) > 0, err
}

// hasEvent reports whether run id has an event of seq.
func (a *api) hasEvent(ctx context.Context, id string, seq int64) (bool, error) {
	evs, err := a.store.EventsAfter(ctx, id, seq-1, 1)
	return len(evs) == 1 && evs[0].Seq == seq, err
}

// settled reports whether a run has ended (terminal) and whether every tool
// call it made has its envelope (complete).
//
// A run that was never recorded (its request was refused before the
// recorder could keep it: a run is made from its request only) has ended
// when one of its first events is an end (the orchestrator's answer to the
// refused request): nothing else will come.
func (a *api) settled(ctx context.Context, id string) (run store.Run, terminal, complete bool) {
	run, err := a.store.Run(ctx, id)
	if errors.Is(err, store.ErrRunNotFound) {
		return a.endedUnrecorded(ctx, id)
	}
	if err != nil || !store.IsTerminal(run.Status) {
		return run, false, false
	}
	calls, err := a.store.ToolCalls(ctx, id)
	if err != nil {
		return run, true, false
	}
	return run, true, store.Settled(run, calls)
}

// endedUnrecorded is settled for a run with events but no run: ended when
// one of its first events (a page of them) is an end.
func (a *api) endedUnrecorded(ctx context.Context, id string) (run store.Run, terminal, complete bool) {
	evs, err := a.store.EventsAfter(ctx, id, 0, streamPage)
	if err != nil {
		return store.Run{}, false, false
	}
	for _, e := range evs {
		if isRunEnd(e.Type) {
			t, _ := events.LookupType(e.Type)
			return store.Run{RunID: id, Status: t.RunStatus}, true, true
		}
	}
	return store.Run{}, false, false
}

// settleQuiet is how long a settled run's stream waits for stragglers when
// it cannot ask the streams what they hold (no NATS connection).
const settleQuiet = 500 * time.Millisecond

// streamsRecheck is how soon a settled run's stream first asks the streams
// again when they held events of the run it had not read yet (then twice as
// late each time, up to Options.Poll).
const streamsRecheck = 20 * time.Millisecond

// streamEnds decides, for a run that has ended, whether its stream may end:
// every call has its envelope and every event of the run its streams hold
// has been read (streamsRead; without a NATS connection: nothing new came
// for settleQuiet), or store.SettleWait passed since this stream first saw
// the end (measured on this recorder's clock, not by event times).
func (a *api) streamEnds(ctx context.Context, id string, endSeen *time.Time, lastNew time.Time, complete bool, seen map[string]uint64) bool {
	if endSeen.IsZero() {
		*endSeen = time.Now()
	}
	if time.Since(*endSeen) > store.SettleWait {
		return true
	}
	if !complete {
		return false
	}
	if a.opts.JS == nil {
		return time.Since(lastNew) >= settleQuiet
	}
	all, err := a.streamsRead(ctx, id, seen)
	if err != nil {
		// Not known now: the quiet period decides, as without NATS.
		a.log.Debug("event stream: the streams could not be asked what they hold of the run", "run_id", id, "err", err)
		return time.Since(lastNew) >= settleQuiet
	}
	return all
}

// streamsRead reports whether every event of run id that its streams hold
// has been read: for each of the runs, calls and sandbox streams, the
// messages on the run's subjects, as the stream's leader counts them, are
// no more than the events of that stream read (seen). A run's events end
// with its end (nothing is published for it after that but cancel
// requests, which are read like any event), so once they are all read the
// stream is over.
func (a *api) streamsRead(ctx context.Context, id string, seen map[string]uint64) (bool, error) {
	for _, s := range []struct {
		stream string
		filter func(string) (string, error)
	}{
		{events.StreamRuns, events.RunEvents},
		{events.StreamCalls, events.CallEvents},
		{events.StreamSandbox, events.SandboxEvents},
	} {
		filter, err := s.filter(id)
		if err != nil {
			return false, err
		}
		n, err := direct.Count(ctx, a.opts.JS, s.stream, filter)
		if err != nil {
			return false, err
		}
		if n > seen[s.stream] {
			return false, nil
		}
	}
	return true, nil
}

// eventsJSON shows recorded events as the API does (never null).
func eventsJSON(evs []store.EventRow) []apitypes.EventJSON {
	out := make([]apitypes.EventJSON, len(evs))
	for i, e := range evs {
		out[i] = apitypes.EventJSON(e)
	}
	return out
}

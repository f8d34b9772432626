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

// streamEvents serves a run's events as Server-Sent Events: every recorded
// event after the Last-Event-ID header (or ?after=), then each new one as it is
// recorded. An event's SSE id is its seq, so a client that reconnects (an
// EventSource does so by itself) resumes after the last event it received.
// Once the run has ended and every event recorded so far was sent, the stream
// sends an "end" event and closes.
func (a *api) streamEvents(w http.ResponseWriter, r *http.Request) {
	id, ok := a.runID(w, r)
	if !ok {
		return
	}
	resume := r.Header.Get("Last-Event-ID")
	if resume == "" {
		resume = r.URL.Query().Get("after")
	}
	after, err := parseAfter(resume)
	if err != nil {
		writeError(w, http.StatusBadRequest, apitypes.CodeInvalidParameter, "Last-Event-ID: "+err.Error())
		return
	}
	if _, ok := a.knownRun(w, r, id); !ok {
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // tell nginx-like proxies not to buffer
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprint(w, "retry: 2000\n\n"); err != nil {
		return
	}
	_ = rc.Flush()

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
	// The streams of a run (runs, calls, sandbox) have no order between them
	// and the recorder writes concurrently, so an event can be recorded after
	// the run's end: the stream ends only once the run is settled and nothing
	// new has come for settleQuiet, or store.SettleWait after this stream first saw
	// its end.
	lastNew, endSeen := time.Now(), time.Time{}
	for {
		evs, err := a.store.EventsAfter(ctx, id, after, streamPage)
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("event stream: read failed; the client will reconnect", "run_id", id, "err", err)
			}
			return
		}
		for _, e := range evs {
			b, err := json.Marshal(apitypes.EventJSON(e))
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b); err != nil {
				return
			}
			after = e.Seq
		}
		if len(evs) > 0 {
			lastNew = time.Now()
			if rc.Flush() != nil {
				return
			}
			if len(evs) == streamPage {
				continue // more waiting
			}
		} else if run, terminal, complete := a.settled(ctx, id); terminal && a.streamEnds(&endSeen, lastNew, complete) {
			b, _ := json.Marshal(apitypes.StreamEndJSON{RunID: id, Status: run.Status})
			_, _ = fmt.Fprintf(w, "event: end\ndata: %s\n\n", b)
			_ = rc.Flush()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-a.opts.Done:
			return // the recorder stops: the client reconnects to another one
		case <-changed:
		case <-poll.C:
		case <-beat.C:
			// The credentials are checked again at each heartbeat: a token
			// revoked (or expired) meanwhile ends the stream, and the
			// client's reconnection is refused.
			if _, err := a.opts.Auth.Authenticate(r); err != nil {
				a.log.Info("event stream: credentials no longer valid; closing", "run_id", id, "err", err)
				return
			}
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
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
		if e.Type == events.TypeRunCompleted || e.Type == events.TypeRunFailed {
			t, _ := events.LookupType(e.Type)
			return store.Run{RunID: id, Status: t.RunStatus}, true, true
		}
	}
	return store.Run{}, false, false
}

// settleQuiet is how long a settled run's stream waits for stragglers.
const settleQuiet = 500 * time.Millisecond

// streamEnds decides, for a run that has ended, whether its stream may end:
// every call has its envelope and nothing new came for settleQuiet, or
// store.SettleWait passed since this stream first saw the end (measured on this
// recorder's clock, not by event times).
func (a *api) streamEnds(endSeen *time.Time, lastNew time.Time, complete bool) bool {
	if endSeen.IsZero() {
		*endSeen = time.Now()
	}
	if time.Since(*endSeen) > store.SettleWait {
		return true
	}
	return complete && time.Since(lastNew) >= settleQuiet
}

// eventsJSON shows recorded events as the API does (never null).
func eventsJSON(evs []store.EventRow) []apitypes.EventJSON {
	out := make([]apitypes.EventJSON, len(evs))
	for i, e := range evs {
		out[i] = apitypes.EventJSON(e)
	}
	return out
}

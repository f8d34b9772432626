package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
	"github.com/toolwire/toolwire/services/recorder/auth"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// maxOutputsWait bounds GET /v1/runs/{id}/outputs?wait=.
const maxOutputsWait = 60 * time.Second

// outputsPoll is how often a wait for a run's end looks at the runs stream
// when no live event has woken it (a backstop: a live event can be lost on
// a reconnect).
const outputsPoll = 250 * time.Millisecond

// parseWait reads the wait parameter: a Go duration from 0 to
// maxOutputsWait ("" is 0).
func parseWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > maxOutputsWait {
		return 0, fmt.Errorf("wait %q must be a duration from 0s to %s, such as 30s", v, maxOutputsWait)
	}
	return d, nil
}

// awaitRun is the run of GET /v1/runs/{id}/outputs?wait=: once the run has
// ended, as soon as its end is stored on the runs stream (its outputs, as
// the end carried them, are what the recorder records from it), without
// waiting for the recorder to have written it; or, when wait passes first,
// the run as it is then. A run the principal may not see, or that has no
// request, is 404 at once, as without wait.
func (a *api) awaitRun(w http.ResponseWriter, r *http.Request, wait time.Duration) (store.Run, bool) {
	id, ok := a.runID(w, r)
	if !ok {
		return store.Run{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	// The run's end, live: it wakes the wait below.
	woken := make(chan struct{}, 1)
	filter, err := events.RunEvents(id)
	if err != nil {
		notFoundRun(w, id)
		return store.Run{}, false
	}
	js := a.opts.JS
	if js != nil {
		sub, err := js.Conn().Subscribe(filter, func(m *nats.Msg) {
			if p, err := events.ParseSubject(m.Subject); err == nil && events.IsEndStatus(string(p.Verb)) {
				select {
				case woken <- struct{}{}:
				default:
				}
			}
		})
		if err != nil {
			a.log.Debug("outputs: the run's end cannot be heard live; reading the stream", "run_id", id, "err", err)
		} else {
			defer func() { _ = sub.Unsubscribe() }()
		}
	}
	// Without a NATS connection, the recorder's commits wake the wait.
	var recorded <-chan struct{}
	if a.opts.Changes != nil {
		ch, stop := a.opts.Changes.Subscribe(id)
		defer stop()
		recorded = ch
	}
	p := auth.FromContext(r.Context())
	var tenant *envelope.Tenant // the run's, once known
	poll := time.NewTicker(outputsPoll)
	defer poll.Stop()
	for {
		run, err := a.store.Run(ctx, id)
		switch {
		case err == nil:
			if !p.Sees(run.Tenant) {
				notFoundRun(w, id)
				return store.Run{}, false
			}
			if store.IsTerminal(run.Status) {
				return run, true
			}
			tenant = &run.Tenant
		case errors.Is(err, store.ErrRunNotFound), ctx.Err() != nil:
		default:
			a.internal(w, r, err)
			return store.Run{}, false
		}
		if tenant == nil && js == nil && ctx.Err() == nil {
			// Nothing to read the run's request from: it is known once
			// recorded.
			if err == nil || errors.Is(err, store.ErrRunNotFound) {
				notFoundRun(w, id)
				return store.Run{}, false
			}
		}
		if tenant == nil && js != nil {
			t, found, err := a.requestTenant(ctx, id)
			switch {
			case err != nil && ctx.Err() == nil:
				unavailable(fmt.Sprintf("the runs stream cannot be read now (%v); retry", err)).write(w)
				return store.Run{}, false
			case err == nil && (!found || !p.Sees(t)):
				notFoundRun(w, id)
				return store.Run{}, false
			case err == nil:
				tenant = &t
			}
		}
		if tenant != nil && js != nil {
			if run, ended, err := a.streamedEnd(ctx, id, *tenant); err == nil && ended {
				return run, true
			} else if err != nil && ctx.Err() == nil {
				a.log.Debug("outputs: the run's end cannot be read now", "run_id", id, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			if r.Context().Err() != nil {
				return store.Run{}, false // the client went away
			}
			// Waited enough: the run as it is (not ended; the caller
			// answers so).
			run, err := a.store.Run(r.Context(), id)
			if errors.Is(err, store.ErrRunNotFound) && tenant != nil {
				return store.Run{RunID: id, Status: store.StatusRequested, Tenant: *tenant}, true
			}
			if errors.Is(err, store.ErrRunNotFound) {
				unavailable("the run's request could not be read within the wait; retry").write(w)
				return store.Run{}, false
			}
			if err != nil {
				a.internal(w, r, err)
				return store.Run{}, false
			}
			return run, true
		case <-woken:
		case <-recorded:
		case <-poll.C:
		}
	}
}

// requestTenant is the tenant of run id's request on the runs stream;
// found is false when the stream holds none.
func (a *api) requestTenant(ctx context.Context, id string) (envelope.Tenant, bool, error) {
	subj, err := events.RunSubject(id, events.VerbRequested)
	if err != nil {
		return envelope.Tenant{}, false, nil
	}
	m, err := direct.Last(ctx, a.opts.JS, events.StreamRuns, subj)
	if errors.Is(err, direct.ErrNotStored) {
		return envelope.Tenant{}, false, nil
	}
	if err != nil {
		return envelope.Tenant{}, false, err
	}
	e, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err != nil {
		return envelope.Tenant{}, false, fmt.Errorf("%s holds an unreadable request: %w", subj, err)
	}
	var req envelope.RunRequest
	if err := events.DecodeData(e, &req); err != nil {
		return envelope.Tenant{}, false, fmt.Errorf("%s holds an unreadable request: %w", subj, err)
	}
	return req.Tenant, true, nil
}

// streamedEnd is run id as its end on the runs stream says it ended, read
// from the stream's leader, the way the recorder records it (store.RecordOf);
// ended is false when it has not ended.
func (a *api) streamedEnd(ctx context.Context, id string, tenant envelope.Tenant) (store.Run, bool, error) {
	m, err := direct.RunEnd(ctx, a.opts.JS, id)
	if err != nil || m == nil {
		return store.Run{}, false, err
	}
	e, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	if err != nil {
		return store.Run{}, false, err
	}
	rec, err := store.RecordOf(e, m.Subject)
	if err != nil {
		return store.Run{}, false, err
	}
	if rec.Run == nil || !store.IsTerminal(rec.Run.Status) {
		return store.Run{}, false, fmt.Errorf("run %s: its end %s says no end", id, m.Subject)
	}
	u := rec.Run
	return store.Run{RunID: id, Tenant: tenant, Status: u.Status, Reason: u.Reason,
		Outputs: u.Outputs, Pinned: u.Pinned, OutputsBlob: u.OutputsBlob}, true, nil
}

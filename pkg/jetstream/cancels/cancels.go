// Package cancels is what a service replica knows of the runs' cancel
// requests, heard live (pkg/events/cancel.go; docs/agent-loop.md,
// Cancellation): the runs cancelled lately, bounded in number and age, and
// the work of each run running in this replica (a call, a sandbox job, a
// model call), whose context a cancel of its run cuts with a Cause. The
// executor, the sandbox and the orchestrator each keep one Runs and Listen
// on it; nothing in it is durable (the cancel request is, on the runs
// stream).
package cancels

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Default bounds of Runs: a run's work comes within its deadline, and work
// that comes after its entry is forgotten is late, which its service checks
// against what the runs stream stores.
const (
	DefaultMax = 4096
	DefaultAge = time.Hour
)

// Cause is the cause of the context of work its run's cancellation cut.
type Cause struct{ Said string }

func (e *Cause) Error() string { return "the run was " + e.Said }

// CancelledBy returns why ctx's work was cut by its run's cancellation
// (events.CancelRequest.Said), "" when it was not.
func CancelledBy(ctx context.Context) string {
	if c, ok := errors.AsType[*Cause](context.Cause(ctx)); ok {
		return c.Said
	}
	return ""
}

type cancelled struct {
	req events.CancelRequest
	at  time.Time
}

type running struct {
	tenant envelope.Tenant
	cut    context.CancelCauseFunc
}

// Runs are the runs cancelled lately and the work of runs running here.
// The zero value is not usable: New.
type Runs struct {
	max int
	age time.Duration
	now func() time.Time

	mu      sync.Mutex
	runs    map[string]cancelled
	order   []string // run ids, oldest first: what is forgotten first
	running map[string]map[*running]struct{}
}

// New returns Runs remembering at most max runs (DefaultMax when <= 0) for
// at most age (DefaultAge when <= 0), on the clock now (time.Now when nil).
func New(max int, age time.Duration, now func() time.Time) *Runs {
	if max <= 0 {
		max = DefaultMax
	}
	if age <= 0 {
		age = DefaultAge
	}
	if now == nil {
		now = time.Now
	}
	return &Runs{max: max, age: age, now: now, runs: map[string]cancelled{}, running: map[string]map[*running]struct{}{}}
}

// Len is how many cancelled runs are remembered.
func (r *Runs) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire()
	return len(r.runs)
}

// Said returns why the run was cancelled, when a cancel of it for tenant t
// is remembered.
func (r *Runs) Said(runID string, t envelope.Tenant) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire()
	c, ok := r.runs[runID]
	if !ok || !c.req.Covers(t) {
		return "", false
	}
	return c.req.Said(), true
}

// Cancel remembers the run as cancelled and cuts the work of it running
// here that the cancel covers; it returns how much it cut.
func (r *Runs) Cancel(req events.CancelRequest) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire()
	if _, ok := r.runs[req.RunID]; !ok {
		r.order = append(r.order, req.RunID)
	}
	r.runs[req.RunID] = cancelled{req: req, at: r.now()}
	for len(r.order) > r.max {
		delete(r.runs, r.order[0])
		r.order = r.order[1:]
	}
	cause := &Cause{Said: req.Said()}
	n := 0
	for w := range r.running[req.RunID] {
		if req.Covers(w.tenant) {
			w.cut(cause)
			n++
		}
	}
	return n
}

// expire forgets the runs cancelled longer ago than the age. r.mu is held.
func (r *Runs) expire() {
	cutoff := r.now().Add(-r.age)
	for len(r.order) > 0 {
		if c, ok := r.runs[r.order[0]]; ok && c.at.After(cutoff) {
			return
		}
		delete(r.runs, r.order[0])
		r.order = r.order[1:]
	}
}

// Track registers work of run runID (of tenant t) about to start, whose
// context cut cancels. When the run is known cancelled it registers nothing
// and returns why: the work must not start. untrack forgets the work once
// it is over.
func (r *Runs) Track(runID string, t envelope.Tenant, cut context.CancelCauseFunc) (untrack func(), said string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expire()
	if c, ok := r.runs[runID]; ok && c.req.Covers(t) {
		return nil, c.req.Said()
	}
	w := &running{tenant: t, cut: cut}
	if r.running[runID] == nil {
		r.running[runID] = map[*running]struct{}{}
	}
	r.running[runID][w] = struct{}{}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.running[runID], w)
		if len(r.running[runID]) == 0 {
			delete(r.running, runID)
		}
	}, ""
}

// Listen subscribes nc to the runs' cancel requests, live and outside any
// queue group (a run's work may be on any replica), and hands each valid one
// to runs.Cancel, then to heard (with how much it cut); an invalid one goes
// to invalid. It returns once the server has the subscription; stop drains
// it.
func Listen(nc *nats.Conn, runs *Runs, heard func(req events.CancelRequest, cut int), invalid func(subject string, err error)) (stop func(), err error) {
	sub, err := nc.Subscribe(events.Filters(events.FilterRunCancelRequested)[0], func(m *nats.Msg) {
		e, err := events.Decode(m)
		var req events.CancelRequest
		if err == nil {
			req, err = events.DecodeCancel(e, m.Subject)
		}
		if err != nil {
			if invalid != nil {
				invalid(m.Subject, err)
			}
			return
		}
		n := runs.Cancel(req)
		if heard != nil {
			heard(req, n)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("cancel requests: %w", err)
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("cancel requests: %w", err)
	}
	return func() { _ = sub.Drain() }, nil
}

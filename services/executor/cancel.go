package executor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
)

// Cancelled runs (pkg/events/cancel.go; docs/agent-loop.md, Cancellation).
// Every replica subscribes to the runs' cancel requests, live and outside
// any queue group: a run's calls may run on any replica. It remembers the
// runs cancelled lately (bounded in number and age) and cancels the
// context of each call of such a run it is running, with a cause that says
// so (runCancelled): the tool stops (a worker's call is stopped on the
// worker too: workers.go), and the call is answered TIMEOUT with
// details.cancelled (events.CancelledCallError(true, ...)); a writes call
// cut short records that envelope as its outcome, so that a redelivery
// never runs it again. A call of a cancelled run that has not started is
// answered POLICY_DENIED (events.CancelledCallError(false, ...)) and never
// runs, unless its run's end is stored: then nothing of it is published
// (runover.go). A replica that missed the live request (it was down) finds
// it stored: a call delivered late or again looks for it on the runs
// stream's leader before it starts (runOver).

// Bounds of the cancelled runs a replica remembers. A run's calls come
// within its deadline; a call that comes after the entry is forgotten is a
// late one, which finds the stored request (runOver) or the run's end.
const (
	maxCancelledRuns = 4096
	cancelledRunAge  = time.Hour
)

// runCancelled is the cause of the context of a call its run's
// cancellation cut short.
type runCancelled struct{ said string }

func (e *runCancelled) Error() string { return "the run was " + e.said }

// cancelledBy returns why ctx's call was cut short by its run's
// cancellation, "" when it was not.
func cancelledBy(ctx context.Context) string {
	if rc, ok := errors.AsType[*runCancelled](context.Cause(ctx)); ok {
		return rc.said
	}
	return ""
}

// cancelledRun is a run this replica knows was cancelled.
type cancelledRun struct {
	said   string
	tenant envelope.Tenant
	at     time.Time
}

// covers reports whether the cancel was made for tenant t: the cancel's
// org, and its workspace when it names one (whoever published it checked
// that it is the run's; a call of another tenant is not the run's call).
func (c cancelledRun) covers(t envelope.Tenant) bool {
	return c.tenant.OrgID == t.OrgID && (c.tenant.WorkspaceID == "" || c.tenant.WorkspaceID == t.WorkspaceID)
}

// runningCall is a call this replica runs, which its run's cancellation
// cuts.
type runningCall struct {
	tenant envelope.Tenant
	cut    context.CancelCauseFunc
}

// cancels holds the runs cancelled lately and the calls running here, by
// run id.
type cancels struct {
	now func() time.Time

	mu      sync.Mutex
	runs    map[string]cancelledRun
	order   []string // run ids, oldest first: what is forgotten first
	running map[string]map[*runningCall]struct{}
}

func newCancels(now func() time.Time) *cancels {
	return &cancels{now: now, runs: map[string]cancelledRun{}, running: map[string]map[*runningCall]struct{}{}}
}

// said returns why the run was cancelled, when this replica knows it was
// (for a call of tenant t).
func (c *cancels) said(runID string, t envelope.Tenant) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire()
	r, ok := c.runs[runID]
	if !ok || !r.covers(t) {
		return "", false
	}
	return r.said, true
}

// cancel remembers the run as cancelled and cuts the calls of it running
// here; it returns how many it cut.
func (c *cancels) cancel(req events.CancelRequest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remember(req.RunID, cancelledRun{said: req.Said(), tenant: req.Tenant, at: c.now()})
	cause := &runCancelled{said: req.Said()}
	n := 0
	for call := range c.running[req.RunID] {
		if c.runs[req.RunID].covers(call.tenant) {
			call.cut(cause)
			n++
		}
	}
	return n
}

// remember adds a run, forgetting the oldest past the bounds. c.mu is held.
func (c *cancels) remember(runID string, r cancelledRun) {
	c.expire()
	if _, ok := c.runs[runID]; !ok {
		c.order = append(c.order, runID)
	}
	c.runs[runID] = r
	for len(c.order) > maxCancelledRuns {
		delete(c.runs, c.order[0])
		c.order = c.order[1:]
	}
}

// expire forgets the runs cancelled longer ago than cancelledRunAge. c.mu
// is held.
func (c *cancels) expire() {
	cutoff := c.now().Add(-cancelledRunAge)
	for len(c.order) > 0 {
		r, ok := c.runs[c.order[0]]
		if ok && r.at.After(cutoff) {
			return
		}
		delete(c.runs, c.order[0])
		c.order = c.order[1:]
	}
}

// track registers a call of run runID (of tenant t) about to start, whose
// context cut cancels. When the run is known cancelled it registers
// nothing and returns why: the call must not start. untrack forgets the
// call once it is over.
func (c *cancels) track(runID string, t envelope.Tenant, cut context.CancelCauseFunc) (untrack func(), said string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.runs[runID]; ok && r.covers(t) {
		return nil, r.said
	}
	call := &runningCall{tenant: t, cut: cut}
	if c.running[runID] == nil {
		c.running[runID] = map[*runningCall]struct{}{}
	}
	c.running[runID][call] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.running[runID], call)
		if len(c.running[runID]) == 0 {
			delete(c.running, runID)
		}
	}, ""
}

// watchCancels subscribes to the runs' cancel requests; the returned func
// unsubscribes, draining what was received.
func (s *Service) watchCancels() (func(), error) {
	nc := s.JS.Conn()
	sub, err := nc.Subscribe(events.Filters(events.FilterRunCancelRequested)[0], func(m *nats.Msg) {
		s.onCancel(m)
	})
	if err != nil {
		return nil, fmt.Errorf("executor: cancel requests: %w", err)
	}
	if err := nc.FlushTimeout(workerRPCTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("executor: cancel requests: %w", err)
	}
	return func() { _ = sub.Drain() }, nil
}

// onCancel handles one cancel request received live.
func (s *Service) onCancel(m *nats.Msg) {
	req, err := decodeCancel(m.Subject, m.Header, m.Data)
	if err != nil {
		s.metrics.cancelsInvalid.Inc()
		s.Log.Warn("cancel request dropped", "subject", m.Subject, "err", err)
		return
	}
	n := s.cancels.cancel(req)
	s.Log.Info("run cancelled: its calls here are stopped", "run_id", req.RunID, "cut", n, "reason", req.Said())
}

// decodeCancel decodes and checks a cancel request event.
func decodeCancel(subject string, h nats.Header, data []byte) (events.CancelRequest, error) {
	var req events.CancelRequest
	ev, err := events.Decode(&nats.Msg{Subject: subject, Header: h, Data: data})
	if err != nil {
		return req, err
	}
	if ev.Type() != events.TypeRunCancelRequested {
		return req, fmt.Errorf("event %s has type %q, want %s", ev.ID(), ev.Type(), events.TypeRunCancelRequested)
	}
	if err := events.DecodeData(ev, &req); err != nil {
		return req, err
	}
	if err := req.Validate(); err != nil {
		return req, err
	}
	want, err := events.RunSubject(req.RunID, events.VerbCancelRequested)
	if err != nil || want != subject {
		return req, fmt.Errorf("cancel of run %s on subject %s", req.RunID, subject)
	}
	return req, nil
}

// cancelStored looks for the run's cancel request on the runs stream's
// leader (a replica that was down missed it live) and, finding one made
// for tenant t, remembers it and returns why.
func (s *Service) cancelStored(ctx context.Context, runID string, t envelope.Tenant) (string, bool, error) {
	subj, err := events.RunSubject(runID, events.VerbCancelRequested)
	if err != nil {
		return "", false, err
	}
	m, err := direct.Last(ctx, s.JS, events.StreamRuns, subj)
	switch {
	case errors.Is(err, direct.ErrNotStored):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("executor: is run %s cancelled: %w", runID, err)
	}
	req, err := decodeCancel(m.Subject, m.Header, m.Data)
	if err != nil {
		s.metrics.cancelsInvalid.Inc()
		s.Log.Warn("stored cancel request ignored", "subject", m.Subject, "err", err)
		return "", false, nil
	}
	s.cancels.cancel(req)
	said, ok := s.cancels.said(runID, t)
	return said, ok, nil
}

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// Cancelled runs (pkg/events/cancel.go; docs/agent-loop.md, Cancellation).
// Every replica subscribes to the runs' cancel requests, live and outside
// any queue group, and kills the jobs of a cancelled run it runs: the job's
// context ends with a cause that says so, and the supervisor kills every
// process of the job as it does at a timeout (the runtime's stop, then the
// cgroup, the process group, the job uid's processes: process.go). The job
// is answered TIMEOUT with details.cancelled (events.CancelledCallError).
// A job of a run cancelled lately that comes after the cancel (bounded in
// number and age) is answered so without running. The executor has
// answered the job's call already (it got the cancel too); the result is
// the job's record.

// Bounds of the cancelled runs a replica remembers.
const (
	maxCancelledRuns = 4096
	cancelledRunAge  = time.Hour
)

// runCancelled is the cause of the context of a job its run's cancellation
// killed.
type runCancelled struct{ said string }

func (e *runCancelled) Error() string { return "the run was " + e.said }

// cancelledBy returns why ctx's job was killed by its run's cancellation,
// "" when it was not.
func cancelledBy(ctx context.Context) string {
	if rc, ok := errors.AsType[*runCancelled](context.Cause(ctx)); ok {
		return rc.said
	}
	return ""
}

type cancelledRun struct {
	said   string
	tenant envelope.Tenant
	at     time.Time
}

// covers reports whether the cancel was made for the tenant of a job
// (its tenant id, "org/workspace/user"): the cancel's org, and its
// workspace when it names one.
func (c cancelledRun) covers(tenantID string) bool {
	org, rest, _ := strings.Cut(tenantID, "/")
	ws, _, _ := strings.Cut(rest, "/")
	return c.tenant.OrgID == org && (c.tenant.WorkspaceID == "" || c.tenant.WorkspaceID == ws)
}

type runningJob struct {
	tenantID string
	kill     context.CancelCauseFunc
}

// jobCancels are the runs cancelled lately and the jobs running here, by
// run id.
type jobCancels struct {
	mu      sync.Mutex
	runs    map[string]cancelledRun
	order   []string // run ids, oldest first
	running map[string]map[*runningJob]struct{}
}

func newJobCancels() *jobCancels {
	return &jobCancels{runs: map[string]cancelledRun{}, running: map[string]map[*runningJob]struct{}{}}
}

// cancel remembers the run as cancelled and kills its jobs running here;
// it returns how many.
func (c *jobCancels) cancel(req events.CancelRequest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if _, ok := c.runs[req.RunID]; !ok {
		c.order = append(c.order, req.RunID)
	}
	r := cancelledRun{said: req.Said(), tenant: req.Tenant, at: now}
	c.runs[req.RunID] = r
	for len(c.order) > 0 && (len(c.order) > maxCancelledRuns || now.Sub(c.runs[c.order[0]].at) >= cancelledRunAge) {
		delete(c.runs, c.order[0])
		c.order = c.order[1:]
	}
	cause := &runCancelled{said: r.said}
	n := 0
	for j := range c.running[req.RunID] {
		if r.covers(j.tenantID) {
			j.kill(cause)
			n++
		}
	}
	return n
}

// track registers a job about to run, whose context kill cancels; when its
// run is known cancelled it registers nothing and returns why.
func (c *jobCancels) track(runID, tenantID string, kill context.CancelCauseFunc) (untrack func(), said string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.runs[runID]; ok && time.Since(r.at) < cancelledRunAge && r.covers(tenantID) {
		return nil, r.said
	}
	j := &runningJob{tenantID: tenantID, kill: kill}
	if c.running[runID] == nil {
		c.running[runID] = map[*runningJob]struct{}{}
	}
	c.running[runID][j] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.running[runID], j)
		if len(c.running[runID]) == 0 {
			delete(c.running, runID)
		}
	}, ""
}

// notRun is the error of a job of a cancelled run that did not run: a
// TIMEOUT (what a sandbox result may carry) whose details say cancelled,
// as events.CancelledCallError's do.
func notRun(said string) *envelope.ToolError {
	return envelope.NewToolError(envelope.CodeTimeout, "not run: the run was %s", said).
		WithDetails(map[string]any{"cancelled": true, "reason": said, "started": false})
}

// watchCancels subscribes to the runs' cancel requests; the returned func
// unsubscribes.
func (s *Service) watchCancels() (func(), error) {
	nc := s.JS.Conn()
	sub, err := nc.Subscribe(events.Filters(events.FilterRunCancelRequested)[0], s.onCancel)
	if err != nil {
		return nil, fmt.Errorf("sandbox: cancel requests: %w", err)
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("sandbox: cancel requests: %w", err)
	}
	return func() { _ = sub.Drain() }, nil
}

// onCancel handles one cancel request.
func (s *Service) onCancel(m *nats.Msg) {
	req, err := decodeCancel(m)
	if err != nil {
		s.metrics.cancelsInvalid.Inc()
		s.Log.Warn("cancel request dropped", "subject", m.Subject, "err", err)
		return
	}
	if n := s.cancels.cancel(req); n > 0 {
		s.Log.Info("run cancelled: its jobs here are killed", "run_id", req.RunID, "jobs", n, "reason", req.Said())
	}
}

func decodeCancel(m *nats.Msg) (events.CancelRequest, error) {
	var req events.CancelRequest
	ev, err := events.Decode(m)
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
	if want, err := events.RunSubject(req.RunID, events.VerbCancelRequested); err != nil || want != m.Subject {
		return req, fmt.Errorf("cancel of run %s on subject %s", req.RunID, m.Subject)
	}
	return req, nil
}

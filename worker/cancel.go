package worker

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/events"
)

// Cancelled calls (pkg/events/worker.go, WorkerCancel). When a run is
// cancelled, the executor that handed this worker one of its calls answers
// the call itself (cut short) and tells every replica of the queue to stop
// it: the replica running it cancels the tool's context, with a cause
// CallOf's users need not know (the context is just done). A cancel that
// comes before its call (the call waited for a free slot) is remembered a
// while, so that the call is answered without running.

// Bounds of the cancels remembered for calls not seen yet.
const (
	maxEarlyCancels = 1024
	earlyCancelAge  = time.Minute
)

// callCancelled is the cause of the context of a call the executor
// stopped.
type callCancelled struct{ said string }

func (e *callCancelled) Error() string { return "the run was " + e.said }

// cancelledBy returns why ctx's call was stopped by its run's
// cancellation, "" when it was not.
func cancelledBy(ctx context.Context) string {
	if c, ok := errors.AsType[*callCancelled](context.Cause(ctx)); ok {
		return c.said
	}
	return ""
}

type earlyCancel struct {
	said string
	at   time.Time
}

// callCancels are the calls running here and the cancels of calls not seen
// yet, by "<run_id>.<call_id>".
type callCancels struct {
	mu      sync.Mutex
	running map[string]context.CancelCauseFunc
	early   map[string]earlyCancel
	order   []string // keys of early, oldest first
}

func newCallCancels() *callCancels {
	return &callCancels{running: map[string]context.CancelCauseFunc{}, early: map[string]earlyCancel{}}
}

func callKeyOf(runID, callID string) string { return runID + "." + callID }

// track registers a call about to run, whose context cut cancels; when
// its cancel came first it registers nothing and returns why.
func (c *callCancels) track(runID, callID string, cut context.CancelCauseFunc) (untrack func(), said string) {
	key := callKeyOf(runID, callID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.early[key]; ok && time.Since(e.at) < earlyCancelAge {
		return nil, e.said
	}
	c.running[key] = cut
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.running, key)
	}, ""
}

// cancel stops the call, or remembers the cancel for when it comes.
func (c *callCancels) cancel(wc events.WorkerCancel) bool {
	key := callKeyOf(wc.RunID, wc.CallID)
	c.mu.Lock()
	defer c.mu.Unlock()
	if cut, ok := c.running[key]; ok {
		cut(&callCancelled{said: wc.Reason})
		return true
	}
	if _, ok := c.early[key]; !ok {
		c.order = append(c.order, key)
	}
	c.early[key] = earlyCancel{said: wc.Reason, at: time.Now()}
	for len(c.order) > 0 && (len(c.order) > maxEarlyCancels || time.Since(c.early[c.order[0]].at) >= earlyCancelAge) {
		delete(c.early, c.order[0])
		c.order = c.order[1:]
	}
	return false
}

// cancel handles one cancel from an executor.
func (s *server) cancel(m *nats.Msg) {
	var wc events.WorkerCancel
	if err := json.Unmarshal(m.Data, &wc); err != nil {
		s.log.Warn("cancel dropped: not one", "subject", m.Subject, "err", err)
		return
	}
	if err := wc.Validate(); err != nil {
		s.log.Warn("cancel dropped", "subject", m.Subject, "err", err)
		return
	}
	if wc.Reason == "" {
		wc.Reason = "cancelled"
	}
	if s.cancels.cancel(wc) {
		s.log.Info("call stopped: its run was cancelled", "run_id", wc.RunID, "call_id", wc.CallID, "reason", wc.Reason)
	}
}

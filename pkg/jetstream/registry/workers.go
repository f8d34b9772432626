package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/kvwatch"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// Queue liveness (docs/tools.md, Queues nobody serves): every process that
// serves a queue (the executor, a user's worker) heartbeats it in the bucket
// events.BucketWorkers, one key per queue and process, each beat carrying its
// own TTL, so that a process that dies drops out within its TTL and one that
// stops drops out at once (Leave). The Policy Guard routes a call to a queue
// only while a worker of it is live, and `toolwire tools list` and `toolwire
// validate` show which queues have none.

// Worker is one process serving one queue, as its last heartbeat says.
type Worker struct {
	Queue string `json:"queue"`
	// Instance is unique to the process: the key of its heartbeat.
	Instance string `json:"instance"`
	// ID names the process (the executor's ID: hostname-pid by default).
	ID string `json:"id"`
	// Tools are the tools the process runs (name@version), at most
	// MaxWorkerTools of them.
	Tools     []string  `json:"tools,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// SeenAt is the time of the beat; the worker counts as live until
	// SeenAt + TTL.
	SeenAt time.Time     `json:"seen_at"`
	TTL    time.Duration `json:"ttl"`
	// Remote: a worker process (package worker), which the executors hand
	// its queue's calls to; otherwise an executor running them in process.
	Remote bool `json:"remote,omitempty"`
	// Health is an executor's circuits that are not quite well (open, half
	// open, or counting failures), at most MaxWorkerTools of them; a tool
	// it does not name is healthy there. What the catalog shows as a
	// tool's health.
	Health []ToolHealth `json:"health,omitempty"`
}

// ToolHealth is one tool version's circuit in one executor
// (services/executor/health.go).
type ToolHealth struct {
	Tool                string    `json:"tool"`  // name@version
	State               string    `json:"state"` // closed, open or half_open
	ConsecutiveFailures uint32    `json:"consecutive_failures"`
	OpenUntil           time.Time `json:"open_until,omitzero"`
	LastFailure         string    `json:"last_failure,omitempty"`
}

// Bounds of a heartbeat.
const (
	MaxWorkerTools = 64
	MinWorkerTTL   = time.Second // the server expires messages by the second
	MaxWorkerTTL   = 10 * time.Minute
)

// LiveAt reports whether the worker's last beat still holds at now.
func (w *Worker) LiveAt(now time.Time) bool { return now.Before(w.SeenAt.Add(w.TTL)) }

// WorkerKey is the KV key of a worker's heartbeat on a queue:
// "<queue>.<instance>".
func WorkerKey(queue, instance string) string { return queue + "." + instance }

// Validate checks a heartbeat before it is sent.
func (w *Worker) Validate() error {
	if err := envelope.ValidateQueue(w.Queue); err != nil {
		return err
	}
	if !envelope.IsToken(w.Instance, 64, func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}) {
		return fmt.Errorf("worker instance %q must be 1-64 letters, digits, '-' or '_'", w.Instance)
	}
	if w.TTL < MinWorkerTTL || w.TTL > MaxWorkerTTL {
		return fmt.Errorf("worker ttl %s must be from %s to %s", w.TTL, MinWorkerTTL, MaxWorkerTTL)
	}
	if len(w.Tools) > MaxWorkerTools {
		return fmt.Errorf("a heartbeat names at most %d tools, not %d", MaxWorkerTools, len(w.Tools))
	}
	if len(w.Health) > MaxWorkerTools {
		return fmt.Errorf("a heartbeat gives the health of at most %d tools, not %d", MaxWorkerTools, len(w.Health))
	}
	return nil
}

// Beat publishes w's heartbeat (SeenAt is set to now), which the bucket
// keeps for w.TTL: a per-message TTL, so that the key of a worker that stops
// beating expires by itself.
func Beat(ctx context.Context, js jetstream.JetStream, w Worker, now time.Time) error {
	w.SeenAt = now.UTC()
	if err := w.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	if len(b) > provision.MaxWorkerValue {
		return fmt.Errorf("heartbeat of %d bytes: at most %d", len(b), provision.MaxWorkerValue)
	}
	// KeyValue.Put takes no TTL (only Create does): the beat is published on
	// the bucket's subject with the per-message TTL header, which is what a
	// Put with a TTL would be.
	subj := "$KV." + provision.BucketWorkers + "." + WorkerKey(w.Queue, w.Instance)
	if _, err := js.Publish(ctx, subj, b, jetstream.WithMsgTTL(w.TTL)); err != nil {
		return fmt.Errorf("heartbeat of queue %s: %w", w.Queue, err)
	}
	return nil
}

// Leave removes a worker's heartbeat: the queue loses that worker at once.
func Leave(ctx context.Context, js jetstream.JetStream, queue, instance string) error {
	kv, err := js.KeyValue(ctx, provision.BucketWorkers)
	if err != nil {
		return fmt.Errorf("open worker heartbeats: %w", err)
	}
	if err := kv.Delete(ctx, WorkerKey(queue, instance)); err != nil {
		return fmt.Errorf("leave queue %s: %w", queue, err)
	}
	return nil
}

// decodeWorker reads a heartbeat value.
func decodeWorker(b []byte) (Worker, error) {
	var w Worker
	if err := json.Unmarshal(b, &w); err != nil {
		return Worker{}, fmt.Errorf("heartbeat: %w", err)
	}
	return w, nil
}

// ListWorkers returns the live workers of every queue (their last beat
// holds at now), by queue then id.
func ListWorkers(ctx context.Context, js jetstream.JetStream, now time.Time) ([]Worker, error) {
	kv, err := js.KeyValue(ctx, provision.BucketWorkers)
	if err != nil {
		return nil, fmt.Errorf("open worker heartbeats: %w", err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list worker heartbeats: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	ws := []Worker{}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("worker heartbeat %s: %w", k, err)
		}
		if w, err := decodeWorker(e.Value()); err == nil && w.LiveAt(now) {
			ws = append(ws, w)
		}
	}
	sortWorkers(ws)
	return ws, nil
}

func sortWorkers(ws []Worker) {
	slices.SortFunc(ws, func(a, b Worker) int {
		if c := strings.Compare(a.Queue, b.Queue); c != 0 {
			return c
		}
		if c := strings.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return strings.Compare(a.Instance, b.Instance)
	})
}

// ByQueue groups workers by queue.
func ByQueue(ws []Worker) map[string][]Worker {
	m := make(map[string][]Worker)
	for _, w := range ws {
		m[w.Queue] = append(m[w.Queue], w)
	}
	return m
}

// Workers is a watched view of the heartbeats: which queues have a live
// worker now. Stop ends the watch.
type Workers struct {
	watch *kvwatch.KVWatch
	now   func() time.Time

	mu      sync.Mutex
	byKey   map[string]Worker
	changed chan struct{} // closed and replaced at every change
}

// WatchWorkers starts watching the heartbeats; it returns once the view
// holds the beats the bucket had. ctx bounds the start only. now is the
// clock the view judges liveness by (nil: time.Now).
func WatchWorkers(ctx context.Context, js jetstream.JetStream, now func() time.Time) (*Workers, error) {
	kv, err := js.KeyValue(ctx, provision.BucketWorkers)
	if err != nil {
		return nil, fmt.Errorf("open worker heartbeats: %w", err)
	}
	if now == nil {
		now = time.Now
	}
	w := &Workers{now: now, byKey: map[string]Worker{}, changed: make(chan struct{})}
	w.watch, err = kvwatch.WatchKV(ctx, kv, true, w.apply)
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Workers) apply(e jetstream.KeyValueEntry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Operation() == jetstream.KeyValuePut {
		if wk, err := decodeWorker(e.Value()); err == nil {
			w.byKey[e.Key()] = wk
		}
	} else {
		delete(w.byKey, e.Key())
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// Live returns the live workers of queue.
func (w *Workers) Live(queue string) []Worker {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var ws []Worker
	for _, wk := range w.byKey {
		if wk.Queue == queue && wk.LiveAt(now) {
			ws = append(ws, wk)
		}
	}
	sortWorkers(ws)
	return ws
}

// HealthStatus is a tool version's health across the live executors.
type HealthStatus string

// Health statuses.
const (
	Healthy     HealthStatus = "healthy"     // no executor's circuit counts a failure
	Degraded    HealthStatus = "degraded"    // some executor's circuit failed lately, or is open
	Unavailable HealthStatus = "unavailable" // every live executor's circuit is open: calls fail at once
)

// Health is a tool version's health from the executors' heartbeats.
type Health struct {
	Status HealthStatus
	// ConsecutiveFailures and LastFailure are those of the executor that
	// counts the most.
	ConsecutiveFailures uint32
	LastFailure         string
	// OpenUntil is when the first open circuit lets a trial call through
	// (zero: none is open).
	OpenUntil time.Time
}

// HealthOf reads the live executors' heartbeats ws into each tool's
// health: unavailable when every live executor's circuit for it is open
// (still open at now), degraded when some executor's is open, half open or
// counting failures, else healthy. An executor beats once per queue it
// serves: each counts once. Workers (remote) keep no circuits here.
func HealthOf(ws []Worker, now time.Time) func(ref string) Health {
	executors := map[string]bool{}
	reports := map[string]map[string]ToolHealth{} // tool -> executor -> its circuit
	for _, w := range ws {
		if w.Remote {
			continue
		}
		executors[w.Instance] = true
		for _, h := range w.Health {
			if reports[h.Tool] == nil {
				reports[h.Tool] = map[string]ToolHealth{}
			}
			reports[h.Tool][w.Instance] = h
		}
	}
	return func(ref string) Health {
		out := Health{Status: Healthy}
		open := 0
		for _, h := range reports[ref] {
			out.Status = Degraded
			if h.ConsecutiveFailures >= out.ConsecutiveFailures {
				out.ConsecutiveFailures, out.LastFailure = h.ConsecutiveFailures, h.LastFailure
			}
			if h.State == "open" && h.OpenUntil.After(now) {
				open++
				if out.OpenUntil.IsZero() || h.OpenUntil.Before(out.OpenUntil) {
					out.OpenUntil = h.OpenUntil
				}
			}
		}
		if open > 0 && open == len(executors) {
			out.Status = Unavailable
		}
		return out
	}
}

// OpenElsewhere reports whether an executor other than instance self,
// live now, says in its heartbeat that its circuit for tool (name@version)
// is open, and until when: the one open longest, with the executor. It is
// how every replica learns what one has found out: a tool that is down.
func (w *Workers) OpenElsewhere(tool, self string) (ToolHealth, Worker, bool) {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var (
		best  ToolHealth
		by    Worker
		found bool
	)
	for _, wk := range w.byKey {
		if wk.Remote || wk.Instance == self || !wk.LiveAt(now) {
			continue
		}
		for _, h := range wk.Health {
			if h.Tool == tool && h.State == "open" && h.OpenUntil.After(now) && (!found || h.OpenUntil.After(best.OpenUntil)) {
				best, by, found = h, wk, true
			}
		}
	}
	return best, by, found
}

// missing returns the queues of queues that have no live worker now, each
// once.
func (w *Workers) missing(queues []string) []string {
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var missing []string
	for _, q := range queues {
		if !slices.Contains(missing, q) && !w.hasLiveLocked(q, now) {
			missing = append(missing, q)
		}
	}
	return missing
}

// hasLiveLocked reports whether queue has a worker live at now; w.mu is
// held.
func (w *Workers) hasLiveLocked(queue string, now time.Time) bool {
	for _, wk := range w.byKey {
		if wk.Queue == queue && wk.LiveAt(now) {
			return true
		}
	}
	return false
}

// Wait waits until every queue of queues has a live worker, for at most
// bound, and returns those that have none by then (nil when all have one).
// A ctx that ends ends the wait too, with its error.
func (w *Workers) Wait(ctx context.Context, queues []string, bound time.Duration) ([]string, error) {
	// Every queue served already, as nearly always: no timers to set.
	if len(w.missing(queues)) == 0 {
		return nil, nil
	}
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	// A beat that stops holding changes nothing in the bucket until the
	// server expires it: the view is looked at again now and then.
	tick := time.NewTicker(min(bound, time.Second))
	defer tick.Stop()
	for last := false; ; {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		missing := w.missing(queues)
		if len(missing) == 0 || last {
			return missing, nil
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-deadline.C:
			last = true // one more look, then the answer
		case <-ctx.Done():
			return missing, context.Cause(ctx)
		}
	}
}

// Stop ends the watch. It is idempotent.
func (w *Workers) Stop() { w.watch.Stop() }

// WorkerLive reports whether the instance's heartbeat on queue still holds
// at now.
func WorkerLive(ctx context.Context, js jetstream.JetStream, queue, instance string, now time.Time) (bool, error) {
	kv, err := js.KeyValue(ctx, provision.BucketWorkers)
	if err != nil {
		return false, fmt.Errorf("open worker heartbeats: %w", err)
	}
	e, err := kv.Get(ctx, WorkerKey(queue, instance))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("worker heartbeat %s: %w", WorkerKey(queue, instance), err)
	}
	w, err := decodeWorker(e.Value())
	if err != nil {
		return false, nil //nolint:nilerr // a heartbeat that does not decode holds nothing
	}
	return w.LiveAt(now), nil
}

package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	fastjson "github.com/segmentio/encoding/json"
)

// stateStore keeps run states in KV, changed only by compare-and-set.
//
// It also keeps, per run, the last state this replica read or wrote and its
// revision, so that the hot path does not read KV before each write: a
// write starts from that snapshot and its compare-and-set on the revision is
// what makes it safe. When another replica changed the run meanwhile, the
// write is refused and re-applied to a fresh read. A decision not to write,
// taken on a remembered snapshot, is confirmed on a fresh read before it
// stands, so that a stale snapshot never makes an event look handled.
//
// Writes to one run are serialized in this replica and grouped: the changes
// that arrive while a write is in flight (the envelopes of a turn's parallel
// calls, say) are applied together in the next compare-and-set, instead of
// racing and retrying one by one.
//
// The states it hands out are snapshots shared between handlers: read them,
// never change them.
type stateStore struct {
	kv  jetstream.KeyValue
	max int // runs remembered at most; default maxCachedRuns

	mu   sync.Mutex
	runs map[string]*runSlot
}

// maxCachedRuns bounds the snapshots kept; beyond it, idle ones are dropped.
const maxCachedRuns = 4096

// runSlot is one run's snapshot and its queue of changes.
type runSlot struct {
	users int // handlers holding the slot; guarded by stateStore.mu

	mu      sync.Mutex
	st      *RunState // the last state read or written; nil when unknown
	rev     uint64
	queue   []*pendingChange
	writing bool
}

// pendingChange is one handler's change, waiting for its group's write.
type pendingChange struct {
	change  func(*RunState) (bool, error)
	done    chan struct{}
	st      *RunState
	rev     uint64
	err     error
	changed bool
}

var errStateExists = errors.New("run state exists")

// errNoRunState is returned for a run this orchestrator never started, such as
// the synthetic run of a single tool call (`toolwire call`).
var errNoRunState = errors.New("run has no state")

func newStateStore(kv jetstream.KeyValue) *stateStore {
	return &stateStore{kv: kv, max: maxCachedRuns, runs: map[string]*runSlot{}}
}

// acquire returns the run's slot, held until release.
func (st *stateStore) acquire(runID string) *runSlot {
	st.mu.Lock()
	defer st.mu.Unlock()
	sl := st.runs[runID]
	if sl == nil {
		if len(st.runs) >= st.max {
			st.evictLocked()
		}
		sl = &runSlot{}
		st.runs[runID] = sl
	}
	sl.users++
	return sl
}

// release lets go of a slot; the slot of an ended run is forgotten with its
// last user.
func (st *stateStore) release(runID string, sl *runSlot) {
	st.mu.Lock()
	defer st.mu.Unlock()
	sl.users--
	if sl.users > 0 {
		return
	}
	sl.mu.Lock()
	done := sl.st == nil || sl.st.Done()
	sl.mu.Unlock()
	if done && st.runs[runID] == sl {
		delete(st.runs, runID)
	}
}

// evictLocked drops idle slots until a quarter of the room is free.
func (st *stateStore) evictLocked() {
	for id, sl := range st.runs {
		if len(st.runs) < st.max*3/4 {
			return
		}
		if sl.users == 0 {
			delete(st.runs, id)
		}
	}
}

// remember records a state just read or written, unless a newer one is known.
func (sl *runSlot) remember(s *RunState, rev uint64) {
	sl.mu.Lock()
	if s == nil || rev >= sl.rev {
		sl.st, sl.rev = s, rev
	}
	sl.mu.Unlock()
}

// peek returns the last state this replica read or wrote of the run, with
// no I/O: nil when it knows none or a write of it is under way. It may be
// stale (another replica may have written since): decide nothing on it that
// a later compare-and-set does not confirm. Read it, never change it.
func (st *stateStore) peek(runID string) *RunState {
	st.mu.Lock()
	sl := st.runs[runID]
	st.mu.Unlock()
	if sl == nil {
		return nil
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.writing || len(sl.queue) > 0 {
		return nil
	}
	return sl.st
}

// get reads the run's state from KV (nil when there is none).
func (st *stateStore) get(ctx context.Context, runID string) (*RunState, uint64, error) {
	sl := st.acquire(runID)
	defer st.release(runID, sl)
	s, rev, err := st.read(ctx, runID)
	if err == nil {
		sl.remember(s, rev)
	}
	return s, rev, err
}

func (st *stateStore) read(ctx context.Context, runID string) (*RunState, uint64, error) {
	e, err := st.kv.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("load run %s: %w", runID, err)
	}
	var s RunState
	if err := fastjson.Unmarshal(e.Value(), &s); err != nil {
		return nil, 0, fmt.Errorf("decode run %s: %w", runID, err)
	}
	return &s, e.Revision(), nil
}

func (st *stateStore) create(ctx context.Context, s *RunState) (uint64, error) {
	s.UpdatedAt = time.Now().UTC()
	b, err := fastjson.Marshal(s)
	if err != nil {
		return 0, err
	}
	rev, err := st.kv.Create(ctx, s.RunID, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errStateExists
	}
	if err != nil {
		return 0, fmt.Errorf("create run %s: %w", s.RunID, err)
	}
	sl := st.acquire(s.RunID)
	sl.remember(s, rev)
	st.release(s.RunID, sl)
	return rev, nil
}

// update applies change to the run's state under compare-and-set; change
// returns false when there is nothing to write. It is called on a copy of
// the latest state, possibly more than once (after a conflicting write), and
// must not change the state when it returns an error. update returns the
// state written (or, when nothing changed, the current one) and its
// revision; errNoRunState when the run has no state.
func (st *stateStore) update(ctx context.Context, runID string, change func(s *RunState) (bool, error)) (*RunState, uint64, error) {
	sl := st.acquire(runID)
	defer st.release(runID, sl)
	pc := &pendingChange{change: change, done: make(chan struct{})}
	sl.mu.Lock()
	sl.queue = append(sl.queue, pc)
	lead := !sl.writing
	sl.writing = true
	sl.mu.Unlock()
	if lead {
		// This handler writes for every change queued meanwhile, its own
		// first, until the queue is empty.
		st.drain(context.WithoutCancel(ctx), runID, sl)
	}
	select {
	case <-pc.done:
		return pc.st, pc.rev, pc.err
	case <-ctx.Done():
		// The change may still be written; the event is redelivered and
		// finds it done.
		return nil, 0, fmt.Errorf("update run %s: %w", runID, ctx.Err())
	}
}

// drain writes the queued changes in groups until none is left.
func (st *stateStore) drain(ctx context.Context, runID string, sl *runSlot) {
	for {
		sl.mu.Lock()
		group := sl.queue
		sl.queue = nil
		if len(group) == 0 {
			sl.writing = false
			sl.mu.Unlock()
			return
		}
		base, rev := sl.st, sl.rev
		sl.mu.Unlock()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st.write(ctx, runID, sl, group, base, rev)
		cancel()
		for _, pc := range group {
			close(pc.done)
		}
	}
}

// write applies a group of changes to base (nil: read it) and writes the
// result under compare-and-set, re-reading and re-applying after a
// conflict. Each change's outcome is set on its pendingChange.
func (st *stateStore) write(ctx context.Context, runID string, sl *runSlot, group []*pendingChange, base *RunState, rev uint64) {
	fresh := base == nil
	fail := func(err error) {
		sl.remember(nil, 0)
		for _, pc := range group {
			pc.st, pc.rev, pc.err = nil, 0, err
		}
	}
	for attempt := 0; ; attempt++ {
		if base == nil {
			var err error
			if base, rev, err = st.read(ctx, runID); err != nil {
				fail(err)
				return
			}
			if base == nil {
				fail(fmt.Errorf("run %s: %w", runID, errNoRunState))
				return
			}
			fresh = true
		}
		next := base.clone()
		changed := false
		for _, pc := range group {
			ok, err := pc.change(next)
			pc.changed, pc.err = ok && err == nil, err
			changed = changed || pc.changed
		}
		if !changed {
			if !fresh {
				// Nothing to write, as this replica last saw the run: make
				// sure on a fresh read.
				base = nil
				continue
			}
			sl.remember(base, rev)
			for _, pc := range group {
				pc.st, pc.rev = base, rev
			}
			return
		}
		next.UpdatedAt = time.Now().UTC()
		b, err := fastjson.Marshal(next)
		if err != nil {
			fail(err)
			return
		}
		newRev, err := st.kv.Update(ctx, runID, b, rev)
		if err == nil {
			sl.remember(next, newRev)
			for _, pc := range group {
				pc.st, pc.rev = next, newRev
			}
			return
		}
		if !errors.Is(err, jetstream.ErrKeyExists) || attempt > 50 {
			fail(fmt.Errorf("update run %s: %w", runID, err))
			return
		}
		// Another replica changed the run meanwhile: re-read and re-apply.
		base = nil
	}
}

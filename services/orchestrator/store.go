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
// A new run's state is kept here before it is in KV (stash): its first turn
// is in the stream, and its request is held unacknowledged until the run
// ends or its state is written (flush), so that a crash meanwhile hands the
// request to a replica that rebuilds the state from the stream. Its first
// write creates it; a run that ends before any write is never written at
// all, as its end in the stream says all a later delivery needs. A one-call
// run so costs no KV write: its state is read and written by this replica
// alone, between the turn it published and the end it publishes.
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
	// unwritten: st is a stash, the state of a run this replica started
	// and has not written yet (rev is 0).
	unwritten bool
}

// pendingChange is one handler's change, waiting for its group's write.
type pendingChange struct {
	change func(*RunState) (bool, error)
	// materialize asks for a stash to be written even when change writes
	// nothing (flush).
	materialize bool
	done        chan struct{}
	st          *RunState
	rev         uint64
	err         error
	changed     bool
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

// evictLocked drops idle slots until a quarter of the room is free; a stash
// stays (there are at most as many as requests held).
func (st *stateStore) evictLocked() {
	for id, sl := range st.runs {
		if len(st.runs) < st.max*3/4 {
			return
		}
		sl.mu.Lock()
		stash := sl.unwritten
		sl.mu.Unlock()
		if sl.users == 0 && !stash {
			delete(st.runs, id)
		}
	}
}

// remember records a state just read or written, unless a newer one is
// known. A stash is replaced only by a state written (rev > 0): a failed
// write or a read that found nothing leaves it.
func (sl *runSlot) remember(s *RunState, rev uint64) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.unwritten && rev == 0 {
		return
	}
	if s == nil || rev >= sl.rev {
		sl.st, sl.rev, sl.unwritten = s, rev, false
	}
}

// stash keeps s, the state of a run this replica has just started (its
// first turn is in the stream), without writing it: the first change
// written creates it in KV (flush writes it as it is). It reports false,
// keeping nothing, when the slot knows a state of the run already (another
// delivery's, read or written): the caller then creates or reads it.
func (st *stateStore) stash(s *RunState) bool {
	sl := st.acquire(s.RunID)
	defer st.release(s.RunID, sl)
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.st != nil || sl.rev != 0 || sl.writing || len(sl.queue) > 0 {
		return false
	}
	sl.st, sl.unwritten = s, true
	return true
}

// slotOf returns the run's slot without holding it; nil when there is none.
func (st *stateStore) slotOf(runID string) *runSlot {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.runs[runID]
}

// flush writes the run's stash, if it has one that has not ended: before the
// run's request is acknowledged, after which nothing would hand the run to
// another replica if this one died.
func (st *stateStore) flush(ctx context.Context, runID string) error {
	if st == nil {
		return nil // a service without a store (a unit under test)
	}
	sl := st.slotOf(runID)
	if sl == nil {
		return nil
	}
	sl.mu.Lock()
	stash := sl.unwritten && sl.st != nil && !sl.st.Done()
	sl.mu.Unlock()
	if !stash {
		return nil
	}
	_, _, err := st.change(ctx, runID, &pendingChange{materialize: true,
		change: func(*RunState) (bool, error) { return false, nil }})
	if errors.Is(err, errNoRunState) {
		return nil // no stash by the time it was written: nothing to write
	}
	return err
}

// peek returns the last state this replica read or wrote of the run, with
// no I/O: nil when it knows none or a write of it is under way. It may be
// stale (another replica may have written since): decide nothing on it that
// a later compare-and-set does not confirm. Read it, never change it.
func (st *stateStore) peek(runID string) *RunState {
	sl := st.slotOf(runID)
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

// get reads the run's state from KV (nil when there is none); a run whose
// state is a stash here and not in KV has the stash, at revision 0.
func (st *stateStore) get(ctx context.Context, runID string) (*RunState, uint64, error) {
	sl := st.acquire(runID)
	defer st.release(runID, sl)
	s, rev, err := st.read(ctx, runID)
	if err != nil {
		return s, rev, err
	}
	sl.remember(s, rev)
	if s == nil {
		sl.mu.Lock()
		if sl.unwritten {
			s = sl.st
		}
		sl.mu.Unlock()
	}
	return s, rev, nil
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
	return st.change(ctx, runID, &pendingChange{change: change})
}

// change queues pc and waits for its group's write (update).
func (st *stateStore) change(ctx context.Context, runID string, pc *pendingChange) (*RunState, uint64, error) {
	sl := st.acquire(runID)
	defer st.release(runID, sl)
	pc.done = make(chan struct{})
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
		base, rev, stash := sl.st, sl.rev, sl.unwritten
		sl.mu.Unlock()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if stash {
			st.writeStash(ctx, runID, sl, group, base)
		} else {
			st.write(ctx, runID, sl, group, base, rev)
		}
		cancel()
		for _, pc := range group {
			close(pc.done)
		}
	}
}

// writeStash applies a group of changes to the run's stash. A run they end is
// not written (its end in the stream is what a later delivery reads), unless
// its calls may wait for an approval; one they change otherwise, or a flush,
// is created in KV. When KV holds the run already (another replica rebuilt it
// from the stream), the group is applied to that state instead, as write
// does after a conflict.
func (st *stateStore) writeStash(ctx context.Context, runID string, sl *runSlot, group []*pendingChange, stash *RunState) {
	next := stash.clone()
	changed, materialize := false, false
	for _, pc := range group {
		ok, err := pc.change(next)
		pc.changed, pc.err = ok && err == nil, err
		changed = changed || pc.changed
		materialize = materialize || pc.materialize
	}
	setAll := func(s *RunState, rev uint64) {
		for _, pc := range group {
			pc.st, pc.rev = s, rev
		}
	}
	switch {
	case !changed && !materialize:
		if !stash.Done() {
			// A decision not to write stands on the stash only while KV
			// holds no state of the run: another replica may have rebuilt
			// it from the stream and moved it on.
			cur, _, err := st.read(ctx, runID)
			if err != nil {
				failAll(group, err)
				return
			}
			if cur != nil {
				st.dropStash(sl)
				st.write(ctx, runID, sl, group, nil, 0)
				return
			}
		}
		setAll(stash, 0)
		return
	case changed && next.Done() && !mayWaitForApproval(next.Policy):
		// Not written. Nothing but a duplicate delivery can have taken
		// the run to another replica meanwhile (its request is held here,
		// and it has no approval events): that replica's handler writes
		// what it makes of the run, from the stream, which holds this end.
		// A run whose calls may wait for an approval is written all the
		// same: its approval events may be handled on another replica,
		// and only the write orders them after its end.
		sl.mu.Lock()
		sl.st = next
		sl.mu.Unlock()
		setAll(next, 0)
		return
	}
	next.UpdatedAt = time.Now().UTC() // next is a copy: the stash is shared
	b, err := fastjson.Marshal(next)
	if err != nil {
		failAll(group, err)
		return
	}
	// Revision 0: written only if KV holds no state of the run.
	rev, err := st.kv.Update(ctx, runID, b, 0)
	switch {
	case err == nil:
		sl.remember(next, rev)
		setAll(next, rev)
	case errors.Is(err, jetstream.ErrKeyExists):
		// Rebuilt from the stream by another replica meanwhile: the stash
		// gives way to it.
		st.dropStash(sl)
		st.write(ctx, runID, sl, group, nil, 0)
	default:
		failAll(group, fmt.Errorf("create run %s: %w", runID, err))
	}
}

// failAll sets err as the outcome of every change of group.
func failAll(group []*pendingChange, err error) {
	for _, pc := range group {
		pc.st, pc.rev, pc.err = nil, 0, err
	}
}

// dropStash forgets the slot's stash: KV holds the run.
func (st *stateStore) dropStash(sl *runSlot) {
	sl.mu.Lock()
	sl.st, sl.rev, sl.unwritten = nil, 0, false
	sl.mu.Unlock()
}

// write applies a group of changes to base (nil: read it) and writes the
// result under compare-and-set, re-reading and re-applying after a
// conflict. Each change's outcome is set on its pendingChange.
func (st *stateStore) write(ctx context.Context, runID string, sl *runSlot, group []*pendingChange, base *RunState, rev uint64) {
	fresh := base == nil
	fail := func(err error) {
		sl.remember(nil, 0)
		failAll(group, err)
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

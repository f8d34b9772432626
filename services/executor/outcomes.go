package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
)

// States of an outcome record.
const (
	outcomeClaimed = "claimed" // a replica is running the call
	outcomeDone    = "done"    // the call's envelope is final
)

// MsgOutcomeUnknown is the error message of a writes call whose executor
// stopped while running it: whether its effect happened is unknown, and it is
// not run again (a tool that declares idempotent retries is, within the
// bounds of retry.go, and ends so only past them).
const MsgOutcomeUnknown = "outcome unknown: the executor stopped during the call; it was not retried"

// outcomeRecord is the record of a writes call in the KV bucket
// toolwire_outcomes, keyed "<run_id>.<call_id>". Created (claimed) before the
// tool runs, refreshed by heartbeats while it runs, retaken for another run
// when its claimer stopped and the tool declares idempotent retries
// (retry.go), and finally replaced by the call's envelope (done). Every
// change is a compare-and-set.
type outcomeRecord struct {
	State     string                 `json:"state"`
	Owner     string                 `json:"owner"`
	ClaimedAt time.Time              `json:"claimed_at"`
	Beats     int                    `json:"beats,omitempty"`
	Envelope  *envelope.ToolEnvelope `json:"envelope,omitempty"`
	// Attempt is the run of the tool the claim is of, when not the first
	// (absent: 1): a tool that declares idempotent retries is run again by
	// the delivery that finds its claimer stopped (retake).
	Attempt int `json:"attempt,omitempty"`
	// Started is when the call's first run was claimed, kept by every
	// retry; zero: ClaimedAt. The call's timeout counts from it.
	Started time.Time `json:"started,omitzero"`
}

// run is the run of the tool the record is of: 1 for the first.
func (r outcomeRecord) run() int { return max(r.Attempt, 1) }

// firstStart is when the call's first run was claimed.
func (r outcomeRecord) firstStart() time.Time {
	if r.Started.IsZero() {
		return r.ClaimedAt
	}
	return r.Started
}

// outcomes implements exactly-once execution of writes tools across replicas
// and redeliveries.
type outcomes struct {
	kv    jetstream.KeyValue
	owner string // replica id and a nonce: unique per process start
	lease time.Duration
	now   func() time.Time
	log   *slog.Logger
	// life is the executor's lifetime: the heartbeats of claims run on it.
	life context.Context

	// unrecorded holds the envelopes of writes calls this process finished
	// but could not record (the bucket did not answer in time), by key: a
	// retry of the call in this process records the real outcome instead
	// of declaring it unknown. Bounded by maxUnrecorded.
	mu         sync.Mutex
	unrecorded map[string]envelope.ToolEnvelope
	// unconfirmed holds, by key, the claims this process sent whose answer
	// it did not get (the write may be stored or not): the tool did not run
	// after them, so a retry here may take such a claim over rather than
	// wait a lease for its heartbeat and declare the call unknown. Bounded
	// by maxUnrecorded.
	unconfirmed map[string][]time.Time
}

// maxUnrecorded bounds outcomes.unrecorded; past it, the oldest calls are
// left to be declared unknown.
const maxUnrecorded = 1024

// keepUnrecorded remembers env, the outcome of key that could not be
// recorded.
func (o *outcomes) keepUnrecorded(key string, env envelope.ToolEnvelope) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.unrecorded == nil {
		o.unrecorded = map[string]envelope.ToolEnvelope{}
	}
	makeRoom(o.unrecorded, key)
	o.unrecorded[key] = env
}

// makeRoom drops an entry of m, when it is full (maxUnrecorded), for key to be
// added.
func makeRoom[V any](m map[string]V, key string) {
	if _, ok := m[key]; ok || len(m) < maxUnrecorded {
		return
	}
	for k := range m {
		delete(m, k)
		return
	}
}

// takeUnrecorded returns (and forgets) the unrecorded outcome of key.
func (o *outcomes) takeUnrecorded(key string) (envelope.ToolEnvelope, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	env, ok := o.unrecorded[key]
	delete(o.unrecorded, key)
	return env, ok
}

func outcomeKey(runID, callID string) string { return runID + "." + callID }

// errClaimTaken is returned by claim when another delivery holds the record.
var errClaimTaken = errors.New("claim taken")

// claim creates the claim of key for this replica. errClaimTaken: a record
// exists (another delivery claimed or finished the call). A claim of this
// process's own whose answer was lost (a node's loss cut the connection
// after the write) is taken over (takeOver), not waited on.
func (o *outcomes) claim(ctx context.Context, key string, at time.Time) (uint64, outcomeRecord, error) {
	rec := outcomeRecord{State: outcomeClaimed, Owner: o.owner, ClaimedAt: at.UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, rec, err
	}
	rev, err := o.kv.Create(ctx, key, b)
	switch {
	case err == nil:
		o.takeUnconfirmed(key)
		return rev, rec, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		if rev, ok, err := o.takeOver(ctx, key, b); err != nil || ok {
			if err != nil {
				o.keepUnconfirmed(key, rec.ClaimedAt)
			}
			return rev, rec, err
		}
		return 0, rec, errClaimTaken
	}
	o.keepUnconfirmed(key, rec.ClaimedAt)
	return 0, rec, fmt.Errorf("claim %s: %w", key, err)
}

// takeOver replaces, by compare-and-set, a claim of key that is one this
// process sent without learning whether it was stored (unconfirmed): as
// nothing ran after it, the call is this delivery's to run. ok is false when
// the record is anything else (another delivery's claim, or an outcome).
func (o *outcomes) takeOver(ctx context.Context, key string, claim []byte) (rev uint64, ok bool, err error) {
	o.mu.Lock()
	sent := len(o.unconfirmed[key]) > 0
	o.mu.Unlock()
	if !sent {
		return 0, false, nil // no read for the usual case: another delivery's claim
	}
	rec, e, found, err := o.get(ctx, key)
	if err != nil || !found || rec.State != outcomeClaimed || rec.Owner != o.owner || !o.unanswered(key, rec.ClaimedAt) {
		return 0, false, err
	}
	rev, err = o.kv.Update(ctx, key, claim, e.Revision())
	switch {
	case err == nil:
		o.takeUnconfirmed(key)
		o.log.Warn("a writes call's claim, sent by this process without an answer, is taken over: the tool did not run after it",
			"key", key, "claimed_at", rec.ClaimedAt)
		return rev, true, nil
	case isConflict(err):
		return 0, false, nil // changed meanwhile (declared unknown): taken
	}
	return 0, false, fmt.Errorf("claim %s: %w", key, err)
}

// keepUnconfirmed remembers a claim of key sent at at whose answer was lost.
func (o *outcomes) keepUnconfirmed(key string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.unconfirmed == nil {
		o.unconfirmed = map[string][]time.Time{}
	}
	makeRoom(o.unconfirmed, key)
	o.unconfirmed[key] = append(o.unconfirmed[key], at.UTC())
}

// unanswered reports whether this process sent the claim of key made at at
// and did not get its answer.
func (o *outcomes) unanswered(key string, at time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.ContainsFunc(o.unconfirmed[key], at.Equal)
}

// takeUnconfirmed returns (and forgets) the unanswered claims of key.
func (o *outcomes) takeUnconfirmed(key string) []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	at := o.unconfirmed[key]
	delete(o.unconfirmed, key)
	return at
}

// get reads the record of key; found false when there is none.
func (o *outcomes) get(ctx context.Context, key string) (rec outcomeRecord, entry jetstream.KeyValueEntry, found bool, err error) {
	e, err := o.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, nil, false, nil
	}
	if err != nil {
		return rec, nil, false, fmt.Errorf("outcome %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return rec, nil, false, fmt.Errorf("outcome %s: %w", key, err)
	}
	if rec.State == outcomeDone && rec.Envelope == nil {
		return rec, nil, false, fmt.Errorf("outcome %s: done without an envelope", key)
	}
	return rec, e, true, nil
}

// heldClaim is a claim this replica holds while its tool runs: a heartbeat
// keeps it alive. lost is closed when another replica declared the call's
// outcome unknown (the heartbeats did not reach the store in time).
type heldClaim struct {
	o    *outcomes
	key  string
	rec  outcomeRecord
	stop chan struct{}
	done chan struct{}
	lost chan struct{}

	mu  sync.Mutex
	rev uint64
}

// hold starts the heartbeat of a claim created at rev. The heartbeat runs
// on the executor's lifetime, not the call's context (a shutdown's drain
// deadline must not silence it while the tool still runs); release stops it.
func (o *outcomes) hold(key string, rev uint64, rec outcomeRecord) *heldClaim {
	h := &heldClaim{
		o: o, key: key, rev: rev, rec: rec,
		stop: make(chan struct{}), done: make(chan struct{}), lost: make(chan struct{}),
	}
	go h.beat(o.life)
	return h
}

func (h *heldClaim) beat(ctx context.Context) {
	defer close(h.done)
	// It ends with ctx too: the executor stopped while the tool still ran,
	// and no beat can reach the store any more.
	every(ctx, h.stop, h.o.lease/3, func() bool {
		h.mu.Lock()
		h.rec.Beats++
		b, err := json.Marshal(h.rec)
		rev := h.rev
		h.mu.Unlock()
		if err != nil {
			return false
		}
		wctx, cancel := context.WithTimeout(ctx, h.o.lease/3)
		next, err := h.o.kv.Update(wctx, h.key, b, rev)
		cancel()
		switch {
		case err == nil:
			h.mu.Lock()
			h.rev = next
			h.mu.Unlock()
		case isConflict(err):
			h.o.log.Error("claim of a writes call was taken over: its outcome was declared unknown", "key", h.key)
			close(h.lost)
			return false
		default:
			h.o.log.Warn("claim heartbeat failed; retrying", "key", h.key, "err", err)
		}
		return true
	})
}

// setRun makes the claim's record say run n, from the next heartbeat on: a
// worker's call handed over again (workers.go) is a run too.
func (h *heldClaim) setRun(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rec.Started, h.rec.Attempt = h.rec.firstStart(), n
}

// release stops the heartbeat and returns the claim's latest revision.
func (h *heldClaim) release() uint64 {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rev
}

// finish records env as the call's outcome, replacing the claim at rev. When
// another replica declared the outcome unknown meanwhile, that record stands
// and its envelope is returned instead: every delivery publishes the same.
func (o *outcomes) finish(ctx context.Context, key string, rev uint64, env envelope.ToolEnvelope) (envelope.ToolEnvelope, error) {
	b, err := json.Marshal(outcomeRecord{State: outcomeDone, Owner: o.owner, ClaimedAt: env.TStart, Envelope: &env})
	if err != nil {
		return env, err
	}
	backoff := 20 * time.Millisecond
	for range maxCASAttempts {
		_, err = o.kv.Update(ctx, key, b, rev)
		if err == nil {
			return env, nil
		}
		if consume.IsTransient(err) && ctx.Err() == nil {
			// The bucket did not answer (a leader election, a node
			// restarting): the same write again, until ctx ends. The
			// claim is ours meanwhile: its call is not redelivered while
			// its handler runs.
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		if !isConflict(err) {
			return env, fmt.Errorf("record outcome %s: %w", key, err)
		}
		rec, e, found, gerr := o.get(ctx, key)
		switch {
		case gerr != nil:
			return env, gerr
		case found && rec.State == outcomeDone:
			o.log.Error("a writes call finished after its outcome was declared unknown; the recorded outcome stands", "key", key)
			return *rec.Envelope, nil
		case found && rec.State == outcomeClaimed && rec.Owner == o.owner:
			// Our own heartbeat landed although its reply was lost.
			rev = e.Revision()
		default:
			return env, fmt.Errorf("record outcome %s: %w", key, err)
		}
	}
	return env, fmt.Errorf("record outcome %s: %d conflicting updates in a row", key, maxCASAttempts)
}

// resolve answers a delivery that found the call's record: a finished call's
// envelope; for another delivery's claim, it waits while the claim's
// heartbeat goes on and, once the heartbeat has stopped for a whole lease
// (the claimer crashed or was cut off), records and returns an UNKNOWN
// envelope (unknown builds it). It never runs the tool. found false: the
// record vanished (expired), or it is a claim this process sent without
// getting its answer (the delivery claims the call again, and claim takes
// it over).
func (o *outcomes) resolve(ctx context.Context, key string, unknown func(rec outcomeRecord) envelope.ToolEnvelope) (env envelope.ToolEnvelope, recorded bool, found bool, err error) {
	r, err := o.settle(ctx, key, func(rec outcomeRecord, _ string) envelope.ToolEnvelope { return unknown(rec) }, nil)
	return r.env, r.recorded, r.found, err
}

// staleClaim is the claim of a call whose claimer stopped during it, at the
// revision it was read: a retry replaces it (retake) by compare-and-set.
type staleClaim struct {
	rev uint64
	rec outcomeRecord
}

// settlement is what settle found.
type settlement struct {
	env envelope.ToolEnvelope
	// recorded: env is the call's recorded outcome, not one declared
	// unknown just now.
	recorded bool
	// found false: there is no record to answer from (see resolve).
	found bool
	// stale, when set, is the claim of a claimer that stopped, which retry
	// allowed to run again: env is not set, and the call is the
	// delivery's to retake.
	stale *staleClaim
}

// retryRule says whether a call whose claimer stopped during it (rec) may
// run again; why says why not, for the UNKNOWN envelope and the log.
type retryRule func(rec outcomeRecord) (ok bool, why string)

// settle is resolve with a retry rule: a stale claim that retry allows is
// returned (settlement.stale) rather than declared unknown; one it refuses
// is declared unknown, unknown getting its reason. retry nil: never.
func (o *outcomes) settle(ctx context.Context, key string, unknown func(rec outcomeRecord, why string) envelope.ToolEnvelope, retry retryRule) (settlement, error) {
	var seenRev uint64
	var seenAt time.Time
	poll := max(o.lease/10, 5*time.Millisecond)
	for {
		rec, e, ok, err := o.get(ctx, key)
		if err != nil || !ok {
			return settlement{found: ok}, err
		}
		if rec.State == outcomeDone {
			return settlement{env: *rec.Envelope, recorded: true, found: true}, nil
		}
		if rec.Owner == o.owner && rec.State == outcomeClaimed && o.unanswered(key, rec.ClaimedAt) {
			// This process's claim whose answer it lost: nothing ran after
			// it, and claim takes it over.
			return settlement{}, nil
		}
		if rec.Owner == o.owner {
			if done, ok := o.takeUnrecorded(key); ok {
				// This process ran the call and could not record its
				// outcome: it records it now, rather than declaring
				// unknown what it knows.
				final, err := o.finish(ctx, key, e.Revision(), done)
				if err != nil {
					o.keepUnrecorded(key, done)
					return settlement{found: true}, err
				}
				return settlement{env: final, recorded: true, found: true}, nil
			}
		}
		now := o.now()
		if e.Revision() != seenRev {
			seenRev, seenAt = e.Revision(), now
		}
		// Stale: no heartbeat seen for a lease on this replica's clock, or
		// the last one is two leases old by the server's timestamp.
		if now.Sub(seenAt) >= o.lease || now.Sub(e.Created()) >= 2*o.lease {
			why := ""
			if retry != nil {
				var again bool
				if again, why = retry(rec); again {
					return settlement{found: true, stale: &staleClaim{rev: e.Revision(), rec: rec}}, nil
				}
			}
			u := unknown(rec, why)
			taken, err := o.declareUnknown(ctx, key, staleClaim{rev: e.Revision(), rec: rec}, u, why)
			if err != nil {
				return settlement{found: true}, err
			}
			if !taken {
				continue // the claimer beat or finished just now
			}
			return settlement{env: u, found: true}, nil
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return settlement{found: true}, fmt.Errorf("wait for the claim of %s: %w", key, ctx.Err())
		case <-t.C:
		}
	}
}

// declareUnknown records u, an UNKNOWN envelope, as the outcome of the call
// whose stale claim is c. ok false: the record changed since it was read
// (the claimer beat or finished, or another delivery settled it).
func (o *outcomes) declareUnknown(ctx context.Context, key string, c staleClaim, u envelope.ToolEnvelope, why string) (ok bool, err error) {
	rec := c.rec
	b, err := json.Marshal(outcomeRecord{State: outcomeDone, Owner: rec.Owner, ClaimedAt: rec.ClaimedAt, Beats: rec.Beats,
		Attempt: rec.Attempt, Started: rec.Started, Envelope: &u})
	if err != nil {
		return false, err
	}
	_, err = o.kv.Update(ctx, key, b, c.rev)
	switch {
	case err == nil:
		log := o.log.Error
		if why != "" {
			log = o.log.Warn // a retry was possible and refused: said why
		}
		log("a writes call's executor stopped during the call; its outcome is recorded as unknown and it is not run again",
			"key", key, "claimed_by", rec.Owner, "claimed_at", rec.ClaimedAt, "run", rec.run(), "not_retried", why)
		return true, nil
	case isConflict(err):
		return false, nil
	}
	return false, fmt.Errorf("record unknown outcome %s: %w", key, err)
}

// retake replaces a stale claim of key by this replica's claim of the call's
// next run, made at at, by compare-and-set: the tool declares idempotent
// retries and runs again. errClaimTaken: the record changed since it was
// read (the claimer was alive after all, or another delivery settled it).
func (o *outcomes) retake(ctx context.Context, key string, c staleClaim, at time.Time) (uint64, outcomeRecord, error) {
	rec := outcomeRecord{State: outcomeClaimed, Owner: o.owner, ClaimedAt: at.UTC(),
		Attempt: c.rec.run() + 1, Started: c.rec.firstStart().UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, rec, err
	}
	rev, err := o.kv.Update(ctx, key, b, c.rev)
	switch {
	case err == nil:
		o.log.Warn("a writes call's executor stopped during the call; its tool declares idempotent retries, so it runs again with the same idempotency key",
			"key", key, "claimed_by", c.rec.Owner, "claimed_at", c.rec.ClaimedAt, "run", rec.Attempt)
		return rev, rec, nil
	case isConflict(err):
		return 0, rec, errClaimTaken
	}
	return 0, rec, fmt.Errorf("retake claim %s: %w", key, err)
}

// unknownOutcome is the envelope of a writes call whose executor stopped
// during it.
func unknownOutcome(base envelope.ToolEnvelope, rec outcomeRecord, tEnd time.Time) envelope.ToolEnvelope {
	return unknownRetry(base, rec, tEnd, "")
}

// unknownRetry is unknownOutcome, for a tool that declares idempotent
// retries and was not retried, and why (empty: the tool declares none).
func unknownRetry(base envelope.ToolEnvelope, rec outcomeRecord, tEnd time.Time, why string) envelope.ToolEnvelope {
	env := base
	if start := rec.firstStart(); !start.IsZero() {
		env.TStart = start.UTC()
	}
	env.Attempt = 0
	if rec.run() > 1 {
		env.Attempt = rec.run()
	}
	env.TEnd = tEnd
	if env.TEnd.Before(env.TStart) {
		env.TEnd = env.TStart
	}
	env.Output = nil
	details := map[string]any{"outcome": "unknown", "claimed_by": rec.Owner, "claimed_at": rec.ClaimedAt.UTC()}
	if why != "" {
		details["not_retried"] = why
	}
	env.Error = envelope.NewToolError(envelope.CodeUnknown, "%s", MsgOutcomeUnknown).WithDetails(details)
	return env
}

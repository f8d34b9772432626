package executor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Retries of idempotent writes tools (docs/tools.md, Exactly-once writes): a
// writes call whose claimer stopped during it ends UNKNOWN, unless its tool
// declares metadata.idempotent; then the delivery that finds the stale claim
// runs it again under the same idempotency key (an http tool's
// Idempotency-Key is <run_id>.<call_id> on every run), within these bounds.
const (
	// maxWriteRuns bounds the runs of one call of an idempotent writes
	// tool: the first and two retries.
	maxWriteRuns = 3
	// minRetryShare is the least share of its timeout a call must have
	// left for a retry: less would end in a TIMEOUT that says less than
	// UNKNOWN does.
	minRetryShare = 10
)

// writeRetryRule is the retry rule of a call of def delivered for the
// delivery-th time, nil when def does not declare idempotent retries. A
// retry needs a run left (maxWriteRuns), a delivery left after this one
// (maxDeliver: should the retry fail to record its outcome, the next
// delivery still settles the call), and time: the call's timeout counts from
// its first run, and at least a tenth of it must remain.
func (s *Service) writeRetryRule(def *envelope.ToolDefinition, delivery uint64) retryRule {
	if !def.RetriesWrites() {
		return nil
	}
	return func(rec outcomeRecord) (bool, string) {
		if rec.run() >= maxWriteRuns {
			return false, fmt.Sprintf("the tool ran %d times, the most a call may", rec.run())
		}
		if delivery >= maxDeliver {
			return false, fmt.Sprintf("delivery %d is the call's last (%d)", delivery, maxDeliver)
		}
		timeout := def.Timeout()
		if left := rec.firstStart().Add(timeout).Sub(s.now()); left < timeout/minRetryShare {
			return false, fmt.Sprintf("%s of the call's %s timeout is left", max(left, 0).Round(time.Millisecond), timeout)
		}
		return true, ""
	}
}

// runTimeout is the time a run of def may take: its timeout, and for a
// retry what is left of it since the call's first run.
func (s *Service) runTimeout(def *envelope.ToolDefinition, rec outcomeRecord) time.Duration {
	timeout := def.Timeout()
	if rec.run() == 1 {
		return timeout
	}
	return max(rec.firstStart().Add(timeout).Sub(s.now()), time.Millisecond)
}

// refuseRetry ends a call whose stale claim (c) its rule allowed to run again,
// when the pipeline refused the run (te: blocked, its circuit open, a secret
// missing ...): the first run's outcome stays unknown, and te says why it
// was not retried. handled false: the record changed meanwhile, and the
// delivery is answered from it like any other.
func (s *Service) refuseRetry(ctx context.Context, res *execResult, key string, c staleClaim, te *envelope.ToolError, log *slog.Logger) (execResult, error) {
	why := "the retry was refused: " + te.Message
	u := unknownRetry(res.env, c.rec, s.now().UTC(), why)
	ok, err := s.outcomes.declareUnknown(ctx, key, c, u, why)
	if err != nil {
		return *res, err
	}
	if ok {
		s.metrics.writeReplays.WithLabelValues(res.label, "unknown").Inc()
		res.env, res.recorded = u, true
		return *res, nil
	}
	handled, _, err := s.replayWrite(ctx, res, key, nil, log)
	if err == nil && !handled {
		err = fmt.Errorf("claim %s: stale, then gone", key)
	}
	return *res, err
}

// reruns counts the runs of a call within one delivery: a worker's call
// handed over again after its worker died (toolapi.Context.Rerun).
type reruns struct {
	mu      sync.Mutex
	rule    retryRule
	claim   *heldClaim
	rec     outcomeRecord // the claim's, at the current run
	retried prometheus.Counter
	log     *slog.Logger
}

// rerunFunc is toolapi.Context.Rerun for a call of a tool with retry rule
// rule, held by claim: nil when the tool declares no idempotent retries.
// The envelope's attempt is then run().
func (s *Service) rerunFunc(rule retryRule, claim *heldClaim, rec outcomeRecord, label string, log *slog.Logger) (func() bool, *reruns) {
	if rule == nil || claim == nil {
		return nil, nil
	}
	r := &reruns{rule: rule, claim: claim, rec: rec, retried: s.metrics.writeReplays.WithLabelValues(label, "retried"), log: log}
	return r.next, r
}

func (r *reruns) next() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok, why := r.rule(r.rec); !ok {
		r.log.Warn("the call's worker stopped during it; not handed over again", "run", r.rec.run(), "not_retried", why)
		return false
	}
	r.rec.Started, r.rec.Attempt = r.rec.firstStart(), r.rec.run()+1
	r.claim.setRun(r.rec.Attempt)
	r.retried.Inc()
	r.log.Warn("the call's worker stopped during it; its tool declares idempotent retries, so it is handed over again", "run", r.rec.Attempt)
	return true
}

// run is the call's current run; 0 for none (a nil reruns).
func (r *reruns) run() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.run()
}

package executor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

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

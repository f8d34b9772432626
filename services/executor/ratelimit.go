package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/ratebucket"
)

// maxCASAttempts bounds the compare-and-set retries of one update of a shared
// KV record; each conflict means another replica made progress.
const maxCASAttempts = 64

// rateLimiter keeps one token bucket per tenant and tool in the KV bucket
// toolwire_rate, shared by every replica and updated only by compare-and-set
// on the entry's revision: two replicas taking the last token at once cannot
// both succeed.
type rateLimiter struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// take takes one token from the bucket of tenantID and tool under lim. It
// returns 0 when the call may go ahead, or how long until a token is back.
func (l *rateLimiter) take(ctx context.Context, tenantID, tool string, lim *envelope.RateLimit) (time.Duration, error) {
	key := ratebucket.Key(tenantID, tool)
	for range maxCASAttempts {
		var st ratebucket.State
		var rev uint64
		e, err := l.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			st = ratebucket.Full(lim)
		case err != nil:
			return 0, fmt.Errorf("rate limit %s: %w", key, err)
		default:
			rev = e.Revision()
			st = ratebucket.Decode(e.Value(), lim)
		}
		now := l.now().UTC()
		if wait := st.Wait(lim, now); wait > 0 {
			return wait, nil
		}
		st = st.Refilled(lim, now)
		st.Tokens--
		if st.At.IsZero() || now.After(st.At) {
			st.At = now
		}
		b, err := json.Marshal(st)
		if err != nil {
			return 0, fmt.Errorf("rate limit %s: %w", key, err)
		}
		if rev == 0 {
			_, err = l.kv.Create(ctx, key, b)
		} else {
			_, err = l.kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return 0, nil
		}
		if !isConflict(err) {
			return 0, fmt.Errorf("rate limit %s: %w", key, err)
		}
		// Another replica took a token meanwhile: read again.
	}
	return 0, fmt.Errorf("rate limit %s: %d conflicting updates in a row", key, maxCASAttempts)
}

// isConflict reports whether a KV write lost a compare-and-set race.
func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// retryAfterSeconds rounds a wait up to the millisecond, in seconds.
func retryAfterSeconds(d time.Duration) float64 {
	return math.Ceil(float64(d)/float64(time.Millisecond)) / 1000
}

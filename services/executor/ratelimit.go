package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
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

// bucketState is a token bucket as stored: its tokens at time At.
type bucketState struct {
	Tokens float64   `json:"tokens"`
	At     time.Time `json:"at"`
}

// rateKey is the KV key of the bucket of a tenant and tool: the tool's name
// (all its versions share the bucket) and a hash of the tenant id (tenant ids
// hold characters keys cannot).
func rateKey(tenantID, tool string) string {
	h := sha256.Sum256([]byte(tenantID))
	return tool + "." + hex.EncodeToString(h[:16])
}

// take takes one token from the bucket of tenantID and tool under lim. It
// returns 0 when the call may go ahead, or how long until a token is back.
func (l *rateLimiter) take(ctx context.Context, tenantID, tool string, lim *envelope.RateLimit) (time.Duration, error) {
	key := rateKey(tenantID, tool)
	burst := float64(lim.Burst)
	for range maxCASAttempts {
		var st bucketState
		var rev uint64
		e, err := l.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			st = bucketState{Tokens: burst}
		case err != nil:
			return 0, fmt.Errorf("rate limit %s: %w", key, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &st); err != nil || math.IsNaN(st.Tokens) {
				// A damaged bucket starts over full rather than blocking the tool.
				st = bucketState{Tokens: burst}
			}
		}
		now := l.now().UTC()
		if !st.At.IsZero() && now.After(st.At) {
			st.Tokens += now.Sub(st.At).Seconds() * lim.PerS
		}
		st.Tokens = min(st.Tokens, burst)
		if st.Tokens < 1 {
			wait := time.Duration((1 - st.Tokens) / lim.PerS * float64(time.Second))
			return max(wait, time.Millisecond), nil
		}
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

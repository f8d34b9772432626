package envelope

import (
	"fmt"
	"math"
	"time"
)

// Bounds of a RateLimit.
const (
	// MaxRateLimitBurst bounds RateLimit.Burst.
	MaxRateLimitBurst = 1_000_000
	// MinRateLimitPerS is the slowest refill a RateLimit may declare: one call
	// a day.
	MinRateLimitPerS = 1.0 / (24 * 60 * 60)
	// MaxRateLimitPerS bounds RateLimit.PerS.
	MaxRateLimitPerS = 1_000_000.0
)

// RateLimit is a tool's rate limit: a token bucket per tenant and tool that
// holds at most Burst calls and refills at PerS calls per second. The executor
// keeps the buckets in the JetStream KV bucket toolwire_rate, shared by all
// its replicas; a call that finds its bucket empty fails with RATE_LIMIT and
// a retry_after_s.
type RateLimit struct {
	// PerS is the sustained rate in calls per second (fractions allowed: 0.5
	// is one call every two seconds).
	PerS float64 `json:"per_s"`
	// Burst is the bucket's size: how many calls may run back to back.
	Burst int `json:"burst"`
}

// Validate checks the limit's numbers.
func (r *RateLimit) Validate() error {
	if math.IsNaN(r.PerS) || r.PerS < MinRateLimitPerS || r.PerS > MaxRateLimitPerS {
		return fmt.Errorf("rate_limit.per_s %v: want a number from %g (one call a day) to %g", r.PerS, MinRateLimitPerS, MaxRateLimitPerS)
	}
	if r.Burst < 1 || r.Burst > MaxRateLimitBurst {
		return fmt.Errorf("rate_limit.burst %d: want a whole number from 1 to %d", r.Burst, MaxRateLimitBurst)
	}
	return nil
}

// Interval is the time in which one call's token comes back.
func (r *RateLimit) Interval() time.Duration {
	return time.Duration(float64(time.Second) / r.PerS)
}

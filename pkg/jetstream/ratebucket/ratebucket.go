// Package ratebucket is the stored form of a tool's rate limit for one
// tenant: a token bucket in the KV bucket toolwire_rate
// (provision.BucketRate). The executor takes tokens from it (by
// compare-and-set, services/executor/ratelimit.go); the recorder's catalog
// reads it to say when a tenant's limit resets.
package ratebucket

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Key is the KV key of the bucket of a tenant (its envelope.Tenant ID) and
// a tool: the tool's name (all its versions share the bucket) and a hash of
// the tenant id (tenant ids hold characters keys cannot).
func Key(tenantID, tool string) string {
	h := sha256.Sum256([]byte(tenantID))
	return tool + "." + hex.EncodeToString(h[:16])
}

// State is a token bucket as stored: its tokens at time At.
type State struct {
	Tokens float64   `json:"tokens"`
	At     time.Time `json:"at"`
}

// Full is the state of a bucket nobody has taken from: lim's burst.
func Full(lim *envelope.RateLimit) State { return State{Tokens: float64(lim.Burst)} }

// Decode reads a stored state; a damaged one is full (a damaged bucket
// starts over rather than blocking the tool).
func Decode(b []byte, lim *envelope.RateLimit) State {
	var st State
	if err := json.Unmarshal(b, &st); err != nil || math.IsNaN(st.Tokens) || math.IsInf(st.Tokens, 0) {
		return Full(lim)
	}
	st.Tokens = max(st.Tokens, 0) // a bucket is never taken below empty
	return st
}

// Refilled is the bucket at now: refilled at lim.PerS since At, never beyond
// lim.Burst.
func (s State) Refilled(lim *envelope.RateLimit, now time.Time) State {
	if !s.At.IsZero() && now.After(s.At) {
		s.Tokens += now.Sub(s.At).Seconds() * lim.PerS
	}
	s.Tokens = min(s.Tokens, float64(lim.Burst))
	return s
}

// maxWait bounds Wait: a day, the slowest refill a limit may declare
// (envelope.MinRateLimitPerS).
const maxWait = 24 * time.Hour

// Wait is how long after now until the bucket, as refilled at now, holds a
// whole token: 0 when it holds one.
func (s State) Wait(lim *envelope.RateLimit, now time.Time) time.Duration {
	r := s.Refilled(lim, now)
	if r.Tokens >= 1 {
		return 0
	}
	ns := (1 - r.Tokens) / lim.PerS * float64(time.Second)
	if ns >= float64(maxWait) {
		return maxWait
	}
	return max(time.Duration(ns), time.Millisecond)
}

// Package bench is the harness behind `toolwire bench`: it starts the pipeline
// in process and measures it against a raw JetStream baseline taken in the
// same run, on the same server, with the same client settings, so that every
// figure can be read as a ratio.
package bench

import (
	"sort"
	"time"
)

// Dist summarizes latency samples.
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_us"`
	P90 float64 `json:"p90_us"`
	P99 float64 `json:"p99_us"`
	Max float64 `json:"max_us"`
}

func distOf(samples []time.Duration) Dist {
	if len(samples) == 0 {
		return Dist{}
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := int(p * float64(len(s)-1))
		return float64(s[i]) / float64(time.Microsecond)
	}
	return Dist{N: len(s), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: float64(s[len(s)-1]) / float64(time.Microsecond)}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

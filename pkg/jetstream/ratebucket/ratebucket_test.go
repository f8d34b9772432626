package ratebucket_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/ratebucket"
)

func TestBucket(t *testing.T) {
	lim := &envelope.RateLimit{PerS: 2, Burst: 3} // a token every 500ms
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		st     ratebucket.State
		at     time.Duration
		tokens float64
		wait   time.Duration
	}{
		{"never used: full", ratebucket.Full(lim), 0, 3, 0},
		{"empty, just now", ratebucket.State{Tokens: 0, At: t0}, 0, 0, 500 * time.Millisecond},
		{"empty, refilling", ratebucket.State{Tokens: 0, At: t0}, 200 * time.Millisecond, 0.4, 300 * time.Millisecond},
		{"a token back", ratebucket.State{Tokens: 0, At: t0}, 500 * time.Millisecond, 1, 0},
		{"never beyond the burst", ratebucket.State{Tokens: 2, At: t0}, time.Hour, 3, 0},
		{"a clock behind the state's", ratebucket.State{Tokens: 0.5, At: t0.Add(time.Second)}, 0, 0.5, 250 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := t0.Add(tc.at)
			require.InDelta(t, tc.tokens, tc.st.Refilled(lim, now).Tokens, 1e-9)
			require.InDelta(t, float64(tc.wait), float64(tc.st.Wait(lim, now)), float64(time.Microsecond))
		})
	}
}

func TestKey(t *testing.T) {
	a, b := ratebucket.Key("org/ws/u", "search"), ratebucket.Key("org/ws/", "search")
	require.NotEqual(t, a, b, "each user of a workspace has a bucket")
	require.True(t, strings.HasPrefix(a, "search."), a)
	require.Len(t, strings.TrimPrefix(a, "search."), 32)
	require.NotContains(t, a, "/", "a tenant id's characters never reach the key")
}

// FuzzDecode: whatever the bucket holds, the state read is a number of
// tokens a wait can be computed from.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"tokens":1.5,"at":"2030-01-01T00:00:00Z"}`, `{"tokens":"NaN"}`, `{"tokens":1e400}`, `null`, `[]`, ``, `{"at":"x"}`} {
		f.Add([]byte(s))
	}
	lim := &envelope.RateLimit{PerS: 1, Burst: 5}
	f.Fuzz(func(t *testing.T, b []byte) {
		st := ratebucket.Decode(b, lim)
		r := st.Refilled(lim, time.Now())
		if r.Tokens > 5 || r.Tokens != r.Tokens {
			t.Fatalf("Decode(%q) refills to %v tokens", b, r.Tokens)
		}
		if w := st.Wait(lim, time.Now()); w < 0 {
			t.Fatalf("Decode(%q): wait %s", b, w)
		}
	})
}

// TestDecodeDamaged: what no executor writes reads as a bucket that
// blocks for no longer than the slowest limit.
func TestDecodeDamaged(t *testing.T) {
	lim := &envelope.RateLimit{PerS: 1, Burst: 5}
	now := time.Now()
	for in, tokens := range map[string]float64{`{"tokens":-1e308}`: 0, `not json`: 5, `{"tokens":1e400}`: 5, `{"tokens":2}`: 2} {
		st := ratebucket.Decode([]byte(in), lim)
		require.InDelta(t, tokens, st.Tokens, 1e-9, in)
		require.LessOrEqual(t, st.Wait(lim, now), time.Second, in)
	}
}

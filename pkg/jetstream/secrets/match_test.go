package secrets

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The automaton finds, at every end position, the longest pattern ending
// there, as a naive search does.
func TestMatcherAgainstNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abc"[rng.IntN(3)]
		}
		return string(b)
	}
	for round := 0; round < 500; round++ {
		var pats []string
		var ids []int32
		for i := 0; i < 1+rng.IntN(6); i++ {
			pats = append(pats, word(1+rng.IntN(5)))
			ids = append(ids, int32(i))
		}
		m := newMatcher(pats, ids)
		text := word(rng.IntN(40))
		var want []match
		for end := 1; end <= len(text); end++ {
			best := match{start: end}
			for i, p := range pats {
				if strings.HasSuffix(text[:end], p) && end-len(p) < best.start {
					best = match{start: end - len(p), end: end, id: firstID(pats, ids, p, i)}
				}
			}
			if best.end != 0 {
				want = append(want, best)
			}
		}
		got := m.find(text)
		require.ElementsMatch(t, want, got, "patterns %q, text %q", pats, text)
		require.Equal(t, len(want) > 0, m.any(text))
	}
}

func firstID(pats []string, ids []int32, p string, i int) int32 {
	for j := 0; j < i; j++ {
		if pats[j] == p {
			return ids[j]
		}
	}
	return ids[i]
}

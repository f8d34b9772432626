package executor

import (
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestScrubberBuiltOncePerSetOfValues: the same resolved values (in any map
// order) get the scrubber built for them the first time; other values, or
// the same value under another name, get one of their own; the cache stays
// bounded.
func TestScrubberBuiltOncePerSetOfValues(t *testing.T) {
	r := &secretResolver{}
	a := r.scrubber(map[string]string{"API_KEY": "sk-live-0123456789", "OTHER": "hunter2-hunter2"})
	b := r.scrubber(map[string]string{"OTHER": "hunter2-hunter2", "API_KEY": "sk-live-0123456789"})
	require.Same(t, a, b)
	require.NotSame(t, a, r.scrubber(map[string]string{"API_KEY": "sk-live-0123456780", "OTHER": "hunter2-hunter2"}))
	require.NotSame(t, a, r.scrubber(map[string]string{"KEY": "sk-live-0123456789", "OTHER": "hunter2-hunter2"}))

	out := a.String("token " + base64.StdEncoding.EncodeToString([]byte("sk-live-0123456789")))
	require.NotContains(t, out, base64.StdEncoding.EncodeToString([]byte("sk-live-0123456789")))

	for i := range 2 * maxScrubbers {
		r.scrubber(map[string]string{"K": fmt.Sprintf("value-number-%d", i)})
		require.LessOrEqual(t, len(r.scrubbers), maxScrubbers)
	}
}

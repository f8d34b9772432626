package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSetOneProcessGC: dev and bench raise GOGC and set a soft memory limit,
// unless GOGC or GOMEMLIMIT is in the environment.
func TestSetOneProcessGC(t *testing.T) {
	percent := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	})
	for _, tc := range []struct {
		name        string
		env         map[string]string
		wantChanged bool
	}{
		{"defaults", nil, true},
		{"GOGC chosen", map[string]string{"GOGC": "150"}, false},
		{"GOMEMLIMIT chosen", map[string]string{"GOMEMLIMIT": "512MiB"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(123)
			debug.SetMemoryLimit(7 << 30)
			changed := setOneProcessGC(func(k string) string { return tc.env[k] })
			require.Equal(t, tc.wantChanged, changed)
			gotPercent := debug.SetGCPercent(100)
			gotLimit := debug.SetMemoryLimit(-1)
			if tc.wantChanged {
				require.Equal(t, oneProcessGCPercent, gotPercent)
				require.Equal(t, int64(oneProcessMemoryLimit), gotLimit)
			} else {
				require.Equal(t, 123, gotPercent, "the runtime was left as the environment set it")
				require.Equal(t, int64(7<<30), gotLimit)
			}
		})
	}
}

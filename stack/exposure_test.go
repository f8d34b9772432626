package stack_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/stack"
)

// TestRecorderExposure: the stack (toolwire dev) serves the recorder without
// configuration on loopback, refuses a non-loopback address without
// authentication, before starting anything, with the way to configure it,
// and serves it there with TOOLWIRE_AUTH=on or the loud opt-out.
func TestRecorderExposure(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	db := func() string { return "sqlite:" + filepath.Join(t.TempDir(), "recorder.db") }

	_, err := stack.Start(t.Context(), stack.Options{DataDir: t.TempDir(), DatabaseURL: db(), HTTPListen: "0.0.0.0:0", Getenv: env(nil)})
	require.ErrorIs(t, err, recorder.ErrExposed)
	require.ErrorContains(t, err, "TOOLWIRE_AUTH=on")
	require.ErrorContains(t, err, "TOOLWIRE_INSECURE_NO_AUTH=1")

	for _, vars := range []map[string]string{nil, {recorder.EnvAuth: "on"}, {recorder.EnvInsecureNoAuth: "1"}} {
		listen := "0.0.0.0:0"
		if vars == nil {
			listen = "" // loopback by default
		}
		st := startStack(t, stack.Options{DatabaseURL: db(), HTTPListen: listen, Getenv: env(vars)})
		require.NotEmpty(t, st.HTTPURL, "%v", vars)
	}
}

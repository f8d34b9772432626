package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBenchHTTPFrontDoor: `toolwire bench --http-only` times one-call runs
// from submit to outputs over NATS and over the HTTP front door (a bearer
// token; the outputs waited for, and the event stream to the run's end
// event then the outputs) on one pipeline, and reports the p50s and their
// ratios, in the table and the JSON.
func TestBenchHTTPFrontDoor(t *testing.T) {
	out := filepath.Join(t.TempDir(), "bench.json")
	stdout, stderr, err := runCLI(t, "", "bench", "--http-only", "--http-samples", "3", "--json", out)
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, "ratio p50 HTTP / NATS, submit to outputs")
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var got struct {
		HTTP httpBenchReport `json:"http_front_door"`
	}
	require.NoError(t, json.Unmarshal(b, &got))
	r := got.HTTP
	require.Equal(t, 3, r.NATS.N)
	require.Equal(t, 3, r.HTTP.N)
	require.Equal(t, 3, r.HTTPStreamed.N)
	require.Positive(t, r.NATS.P50)
	require.Greater(t, r.HTTP.P50, r.HTTPWaitSubmit.P50, "the total holds its phases")
	require.Greater(t, r.HTTPStreamed.P50, r.HTTPSubmit.P50, "the total holds its phases")
	require.Positive(t, r.HTTPStream.P50)
	require.InDelta(t, r.HTTP.P50/r.NATS.P50, r.RatioP50, 1e-9)
	require.InDelta(t, r.HTTPStreamed.P50/r.NATS.P50, r.RatioStreamP50, 1e-9)
	require.Equal(t, r.RatioP50 <= httpTarget, r.Met)

	_, _, err = runCLI(t, "", "bench", "--http-only", "--http-samples", "0")
	require.ErrorContains(t, err, "--http-only needs --http-samples above 0")
}

package executor

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
)

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    func(t *testing.T, c Config)
		wantErr []string
	}{
		{
			name: "defaults",
			want: func(t *testing.T, c Config) {
				require.Equal(t, DefaultConcurrency, c.Concurrency)
				require.Equal(t, DefaultSource, c.Source)
				require.NotEmpty(t, c.ID)
				require.Contains(t, c.ID, "-")
			},
		},
		{
			name: "set",
			env:  map[string]string{EnvConcurrency: " 8 ", EnvID: "executor-7"},
			want: func(t *testing.T, c Config) {
				require.Equal(t, 8, c.Concurrency)
				require.Equal(t, "executor-7", c.ID)
			},
		},
		{name: "not a number", env: map[string]string{EnvConcurrency: "many"}, wantErr: []string{EnvConcurrency, `"many"`, "whole number from 1 to 4096"}},
		{name: "zero", env: map[string]string{EnvConcurrency: "0"}, wantErr: []string{EnvConcurrency, `"0"`}},
		{name: "negative", env: map[string]string{EnvConcurrency: "-3"}, wantErr: []string{EnvConcurrency}},
		{name: "too many", env: map[string]string{EnvConcurrency: "4097"}, wantErr: []string{EnvConcurrency, "4096"}},
		{name: "bad id", env: map[string]string{EnvID: "a\nb"}, wantErr: []string{EnvID, "printable"}},
		{
			name: "runtime defaults",
			want: func(t *testing.T, c Config) {
				require.Equal(t, 64<<10, c.MaxOutputBytes)
				require.Equal(t, 16<<10, c.PreviewBytes)
				require.Equal(t, 5, c.CircuitFailures)
				require.Equal(t, 30*time.Second, c.CircuitOpen)
				require.Equal(t, 15*time.Second, c.ClaimLease)
				require.Equal(t, 30*time.Second, c.AckWait)
				require.Equal(t, 250*time.Millisecond, c.StartedAfter)
				require.Equal(t, []string{"default"}, c.Queues)
			},
		},
		{
			name: "started after set",
			env:  map[string]string{EnvStartedAfter: "1s"},
			want: func(t *testing.T, c Config) { require.Equal(t, time.Second, c.StartedAfter) },
		},
		{
			name: "started at once",
			env:  map[string]string{EnvStartedAfter: "0"},
			want: func(t *testing.T, c Config) { require.Negative(t, c.StartedAfter) },
		},
		{name: "started after negative", env: map[string]string{EnvStartedAfter: "-1s"}, wantErr: []string{EnvStartedAfter, "from 0"}},
		{name: "started after too long", env: map[string]string{EnvStartedAfter: "1m"}, wantErr: []string{EnvStartedAfter}},
		{name: "started after not a duration", env: map[string]string{EnvStartedAfter: "5"}, wantErr: []string{EnvStartedAfter, "want a duration from 0s to 10s"}},
		{
			name: "runtime set",
			env: map[string]string{
				EnvMaxOutputBytes: "131072", EnvPreviewBytes: "4096", EnvCircuitFailures: "3",
				EnvCircuitOpen: "1m", EnvClaimLease: "5s", EnvAckWait: "10s",
			},
			want: func(t *testing.T, c Config) {
				require.Equal(t, 128<<10, c.MaxOutputBytes)
				require.Equal(t, 4096, c.PreviewBytes)
				require.Equal(t, 3, c.CircuitFailures)
				require.Equal(t, time.Minute, c.CircuitOpen)
				require.Equal(t, 5*time.Second, c.ClaimLease)
				require.Equal(t, 10*time.Second, c.AckWait)
			},
		},
		{
			name: "small max output shrinks the default preview",
			env:  map[string]string{EnvMaxOutputBytes: "1000"},
			want: func(t *testing.T, c Config) {
				require.Equal(t, 1000, c.MaxOutputBytes)
				require.Equal(t, 1000, c.PreviewBytes)
			},
		},
		{name: "max output not a number", env: map[string]string{EnvMaxOutputBytes: "2MB"}, wantErr: []string{EnvMaxOutputBytes, `"2MB"`, "whole number from 1 to 196608"}},
		{name: "max output above 192 KiB", env: map[string]string{EnvMaxOutputBytes: "196609"}, wantErr: []string{EnvMaxOutputBytes, "196608"}},
		{
			name: "queues",
			env:  map[string]string{EnvQueues: " default , gpu,batch_2"},
			want: func(t *testing.T, c Config) { require.Equal(t, []string{"default", "gpu", "batch_2"}, c.Queues) },
		},
		{name: "queue not a subject token", env: map[string]string{EnvQueues: "default,GPU.big"}, wantErr: []string{EnvQueues, `queue "GPU.big"`}},
		{name: "queue twice", env: map[string]string{EnvQueues: "gpu,gpu"}, wantErr: []string{EnvQueues, `queue "gpu" is listed twice`}},
		{name: "preview larger than max", env: map[string]string{EnvMaxOutputBytes: "100", EnvPreviewBytes: "200"}, wantErr: []string{"preview bytes 200"}},
		{name: "zero failures", env: map[string]string{EnvCircuitFailures: "0"}, wantErr: []string{EnvCircuitFailures}},
		{name: "open not a duration", env: map[string]string{EnvCircuitOpen: "30"}, wantErr: []string{EnvCircuitOpen, "for example 30s"}},
		{name: "lease too short", env: map[string]string{EnvClaimLease: "1ms"}, wantErr: []string{EnvClaimLease}},
		{name: "ack wait too long", env: map[string]string{EnvAckWait: "2h"}, wantErr: []string{EnvAckWait}},
		{
			name:    "every problem at once",
			env:     map[string]string{EnvConcurrency: "x", EnvID: strings.Repeat("i", 200)},
			wantErr: []string{EnvConcurrency, EnvID},
		},
		// The web tools' and the MCP servers' variables: package standard's
		// TestConfigFromEnv.
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if len(tc.wantErr) > 0 {
				require.Error(t, err)
				for _, s := range tc.wantErr {
					require.ErrorContains(t, err, s)
				}
				return
			}
			require.NoError(t, err)
			tc.want(t, c)
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "zero means defaults", cfg: Config{}},
		{name: "valid", cfg: Config{Concurrency: 4, Source: "/x", ID: "a"}},
		{name: "negative concurrency", cfg: Config{Concurrency: -1}, wantErr: "concurrency -1"},
		{name: "too much concurrency", cfg: Config{Concurrency: MaxConcurrency + 1}, wantErr: "concurrency"},
		{name: "source with control character", cfg: Config{Source: "/x\x00"}, wantErr: "source"},
		{name: "source with spaces", cfg: Config{Source: " /x"}, wantErr: "source"},
		{name: "negative max output", cfg: Config{MaxOutputBytes: -1}, wantErr: "max output bytes -1"},
		{name: "max output above 192 KiB", cfg: Config{MaxOutputBytes: MaxMaxOutputBytes + 1}, wantErr: "max output bytes 196609: want 1 to 196608"},
		{name: "queues", cfg: Config{Queues: []string{"default", "gpu"}}},
		{name: "bad queue", cfg: Config{Queues: []string{"default", ""}}, wantErr: `queue ""`},
		{name: "queue twice", cfg: Config{Queues: []string{"a", "a"}}, wantErr: `queue "a" is listed twice`},
		{name: "negative lease", cfg: Config{ClaimLease: -time.Second}, wantErr: "claim lease -1s"},
		{name: "circuit open too long", cfg: Config{CircuitOpen: 2 * time.Hour}, wantErr: "circuit open 2h0m0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestEnvVars(t *testing.T) {
	servicetest.VarsTakeEffect(t, EnvVars(), ConfigFromEnv)
}

// TestBuild: Build reads the environment, and its options override it.
func TestBuild(t *testing.T) {
	env := eventstest.Start(t)
	d := testDeps(t, env, nil)
	d.Getenv = servicetest.Getenv(map[string]string{EnvConcurrency: "3", EnvMaxOutputBytes: "1000"})
	s, err := Build(d)
	require.NoError(t, err)
	require.Equal(t, 3, s.Config().Concurrency)
	require.Equal(t, 1000, s.Config().MaxOutputBytes)
	s, err = Build(d, func(c *Config) { c.Concurrency = 5 })
	require.NoError(t, err)
	require.Equal(t, 5, s.Config().Concurrency, "an option overrides the environment")
	require.Equal(t, 1000, s.Config().MaxOutputBytes)

	d.Getenv = servicetest.Getenv(map[string]string{EnvConcurrency: "x"})
	_, err = Build(d)
	require.ErrorContains(t, err, "executor configuration: TOOLWIRE_EXECUTOR_CONCURRENCY")
}

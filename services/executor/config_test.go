package executor

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
			name:    "every problem at once",
			env:     map[string]string{EnvConcurrency: "x", EnvID: strings.Repeat("i", 200)},
			wantErr: []string{EnvConcurrency, EnvID},
		},
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
	require.Equal(t, []string{EnvConcurrency, EnvID}, EnvVars())
}

package policy_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/policy"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want policy.Config
		err  string
	}{
		{name: "defaults", want: policy.Config{Source: "/toolwire/policy", Concurrency: 32}},
		{name: "concurrency", env: map[string]string{policy.EnvConcurrency: "8"},
			want: policy.Config{Source: "/toolwire/policy", Concurrency: 8}},
		{name: "not a number", env: map[string]string{policy.EnvConcurrency: "many"},
			err: `TOOLWIRE_POLICY_CONCURRENCY="many": want a number from 1 to 4096`},
		{name: "zero", env: map[string]string{policy.EnvConcurrency: "0"},
			err: `TOOLWIRE_POLICY_CONCURRENCY="0": want a number from 1 to 4096`},
		{name: "too many", env: map[string]string{policy.EnvConcurrency: "5000"},
			err: `TOOLWIRE_POLICY_CONCURRENCY="5000": want a number from 1 to 4096`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.ConfigFromEnv(env(tt.env))
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.NoError(t, got.Validate())
		})
	}
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, policy.Config{}.Validate())
	require.EqualError(t, policy.Config{Concurrency: -1}.Validate(), "policy: concurrency -1: want 1 to 4096")
}

func TestEnvVars(t *testing.T) {
	require.Equal(t, []string{"TOOLWIRE_POLICY_CONCURRENCY"}, policy.EnvVars())
}

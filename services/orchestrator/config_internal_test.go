package orchestrator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
)

func TestProvidersFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   map[string]string
		names []string
		err   string
	}{
		{name: "nothing set", names: nil},
		{name: "openai key", env: map[string]string{"OPENAI_API_KEY": "sk-x"}, names: []string{"openai"}},
		{name: "a local compatible server without a key", env: map[string]string{"OPENAI_BASE_URL": "http://localhost:11434/v1"}, names: []string{"openai"}},
		{name: "both", env: map[string]string{"OPENAI_API_KEY": "sk-x", "ANTHROPIC_API_KEY": "sk-ant-x", "TOOLWIRE_MODEL_RETRIES": "0"}, names: []string{"anthropic", "openai"}},
		{name: "anthropic base URL alone is not enough", env: map[string]string{"ANTHROPIC_BASE_URL": "http://proxy:4000"}, names: nil},
		{name: "bad base URL", env: map[string]string{"OPENAI_BASE_URL": "localhost:11434"}, err: `OPENAI_BASE_URL="localhost:11434": want an http(s) URL`},
		{name: "bad anthropic base URL", env: map[string]string{"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "ftp://x"}, err: "ANTHROPIC_BASE_URL"},
		{name: "bad retries", env: map[string]string{"OPENAI_API_KEY": "k", "TOOLWIRE_MODEL_RETRIES": "many"}, err: "TOOLWIRE_MODEL_RETRIES"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.NoError(t, p.Validate())
			require.ElementsMatch(t, append([]string{scripted.Name}, tc.names...), p.serving().Names())
		})
	}
}

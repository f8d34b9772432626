package orchestrator_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/orchestrator"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestPricesFor(t *testing.T) {
	p := orchestrator.DefaultPrices()
	p["openai/gpt-4o"] = orchestrator.Price{InputPerMTok: 9, OutputPerMTok: 9}
	for _, tc := range []struct {
		provider, model string
		want            orchestrator.Price
		priced          bool
	}{
		{"openai", "gpt-4o-mini", orchestrator.Price{InputPerMTok: 0.15, OutputPerMTok: 0.60}, true},
		{"openai", "gpt-4o", orchestrator.Price{InputPerMTok: 9, OutputPerMTok: 9}, true},
		{"azure", "gpt-4o", orchestrator.Price{InputPerMTok: 2.5, OutputPerMTok: 10}, true},
		{"openai", "gpt-4o-2024-08-06", orchestrator.Price{InputPerMTok: 9, OutputPerMTok: 9}, true},
		{"openai", "gpt-4o-mini-2024-07-18", orchestrator.Price{InputPerMTok: 0.15, OutputPerMTok: 0.60}, true},
		{"anthropic", "claude-sonnet-4-5-20250929", orchestrator.Price{InputPerMTok: 3, OutputPerMTok: 15}, true},
		{"anthropic", "claude-sonnet-4-20250514", orchestrator.Price{InputPerMTok: 3, OutputPerMTok: 15}, true},
		{"openai", "llama3.1:8b", orchestrator.Price{}, false},
		{"scripted", "anything", orchestrator.Price{}, true},
		{"replay", "gpt-4o-mini-x", orchestrator.Price{InputPerMTok: 0.15, OutputPerMTok: 0.60}, true},
	} {
		got, ok := p.For(tc.provider, tc.model)
		require.Equal(t, tc.priced, ok, "%s/%s", tc.provider, tc.model)
		require.Equal(t, tc.want, got, "%s/%s", tc.provider, tc.model)
	}
	require.InDelta(t, 0.00021, orchestrator.Price{InputPerMTok: 0.15, OutputPerMTok: 0.6}.Cost(1000, 100), 1e-12)
}

func TestPricesFromEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"my-model": {"input_per_mtok": 1, "output_per_mtok": 2}}`), 0o600))
	for _, tc := range []struct {
		name, value string
		check       func(t *testing.T, p orchestrator.Prices)
		err         string
	}{
		{name: "unset", check: func(t *testing.T, p orchestrator.Prices) { require.Equal(t, orchestrator.DefaultPrices(), p) }},
		{name: "inline JSON adds and replaces", value: `{"gpt-4o": {"input_per_mtok": 1, "output_per_mtok": 1}, "scripted/priced": {"input_per_mtok": 5, "output_per_mtok": 0}}`,
			check: func(t *testing.T, p orchestrator.Prices) {
				require.Equal(t, orchestrator.Price{InputPerMTok: 1, OutputPerMTok: 1}, p["gpt-4o"])
				got, _ := p.For("scripted", "priced")
				require.Equal(t, orchestrator.Price{InputPerMTok: 5}, got)
				require.Equal(t, orchestrator.DefaultPrices()["gpt-4o-mini"], p["gpt-4o-mini"], "the rest stay")
			}},
		{name: "a file", value: file, check: func(t *testing.T, p orchestrator.Prices) {
			require.Equal(t, orchestrator.Price{InputPerMTok: 1, OutputPerMTok: 2}, p["my-model"])
		}},
		{name: "missing file", value: "/nonexistent/prices.json", err: `TOOLWIRE_PRICES="/nonexistent/prices.json": open /nonexistent/prices.json`},
		{name: "not JSON", value: `{"gpt-4o": `, err: `TOOLWIRE_PRICES="{\"gpt-4o\":": price table: want`},
		{name: "unknown field", value: `{"gpt-4o": {"input": 1}}`, err: `unknown field "input"`},
		{name: "negative", value: `{"gpt-4o": {"input_per_mtok": -1, "output_per_mtok": 1}}`, err: `"gpt-4o": prices must be finite numbers, zero or more`},
		{name: "trailing", value: `{} {}`, err: "trailing content"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := orchestrator.ConfigFromEnv(env(map[string]string{orchestrator.EnvPrices: tc.value}))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			tc.check(t, c.Prices)
		})
	}
}

func FuzzParsePrices(f *testing.F) {
	for _, s := range []string{`{}`, `{"m":{"input_per_mtok":1,"output_per_mtok":2}}`, `{"m":{"input_per_mtok":-1}}`, `[]`, `{"":{}}`, `{"m":{"input_per_mtok":1e400}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := orchestrator.ParsePrices(b)
		if err != nil {
			return
		}
		// What parses is valid, and prices nothing at a negative cost.
		require.NoError(t, p.Validate())
		for _, pr := range p {
			require.GreaterOrEqual(t, pr.Cost(1000, 1000), 0.0)
		}
	})
}

func TestConfigFromEnv(t *testing.T) {
	c, err := orchestrator.ConfigFromEnv(env(map[string]string{"TOOLWIRE_ORCHESTRATOR_CONCURRENCY": "8", "TOOLWIRE_MODEL_TIMEOUT": "30s",
		"OPENAI_API_KEY": "sk-x", "TOOLWIRE_PRICES": `{"x": {"input_per_mtok": 1, "output_per_mtok": 1}}`,
		"TOOLWIRE_RUN_DEADLINE": "10m", "TOOLWIRE_RUN_TIMER_AFTER": "5s"}))
	require.NoError(t, err)
	require.Equal(t, 8, c.Concurrency)
	require.Equal(t, 10*time.Minute, c.RunDeadline)
	require.Equal(t, 5*time.Second, c.TimerAfter)
	require.Equal(t, "sk-x", c.OpenAI.APIKey)
	require.Contains(t, c.Prices, "x")
	now, err := orchestrator.ConfigFromEnv(env(map[string]string{"TOOLWIRE_RUN_TIMER_AFTER": "0"}))
	require.NoError(t, err)
	require.Negative(t, now.TimerAfter, "0: at once")

	_, err = orchestrator.ConfigFromEnv(env(map[string]string{"TOOLWIRE_ORCHESTRATOR_CONCURRENCY": "0", "TOOLWIRE_MODEL_TIMEOUT": "soon",
		"TOOLWIRE_PRICES": "{", "OPENAI_BASE_URL": "nope", "TOOLWIRE_RUN_DEADLINE": "25h", "TOOLWIRE_RUN_TIMER_AFTER": "2m"}))
	for _, s := range []string{"TOOLWIRE_ORCHESTRATOR_CONCURRENCY", "TOOLWIRE_MODEL_TIMEOUT", "TOOLWIRE_PRICES", "OPENAI_BASE_URL", "TOOLWIRE_RUN_DEADLINE",
		"TOOLWIRE_RUN_TIMER_AFTER"} {
		require.ErrorContains(t, err, s, "every problem is reported at once")
	}
	var names []string
	for _, v := range orchestrator.EnvVars() {
		names = append(names, v.Name)
	}
	require.Subset(t, names, []string{"OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "TOOLWIRE_PRICES", "TOOLWIRE_MODEL_RETRIES"})
}

func TestEnvVars(t *testing.T) {
	servicetest.VarsTakeEffect(t, orchestrator.EnvVars(), orchestrator.ConfigFromEnv)
}

// Validate refuses what New cannot run with, whether it came from the
// environment or from an option.
func TestConfigValidate(t *testing.T) {
	require.NoError(t, orchestrator.Config{}.Validate())
	for _, tc := range []struct {
		cfg orchestrator.Config
		err string
	}{
		{orchestrator.Config{Concurrency: -1}, "concurrency -1: want 1 to 4096"},
		{orchestrator.Config{ModelTimeout: 2 * time.Hour}, "model timeout 2h0m0s: want up to 1h0m0s"},
		{orchestrator.Config{AckWait: -time.Second}, "ack wait -1s: want a positive duration"},
		{orchestrator.Config{RunDeadline: 25 * time.Hour}, "run deadline 25h0m0s: want 1s to 24h0m0s"},
		{orchestrator.Config{RunDeadline: time.Millisecond}, "run deadline 1ms: want 1s to 24h0m0s"},
		{orchestrator.Config{TimerAfter: 2 * time.Minute}, "timer after 2m0s: want up to 1m0s"},
		{orchestrator.Config{OpenAI: provider.Config{BaseURL: "localhost:11434"}},
			`OpenAI base URL "localhost:11434": want an http(s) URL such as http://localhost:11434/v1`},
		{orchestrator.Config{Providers: orchestrator.Providers{"mine": nil}}, `provider "mine" is nil`},
		{orchestrator.Config{Prices: orchestrator.Prices{"m": {InputPerMTok: -1}}}, `"m": prices must be finite numbers, zero or more`},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.err)
	}
}

package orchestrator

import (
	"errors"
	"net/url"

	"github.com/toolwire/toolwire/pkg/service"
)

// Environment variables of the model providers.
const (
	EnvOpenAIKey        = "OPENAI_API_KEY"
	EnvOpenAIBaseURL    = "OPENAI_BASE_URL"
	EnvAnthropicKey     = "ANTHROPIC_API_KEY"
	EnvAnthropicBaseURL = "ANTHROPIC_BASE_URL"
)

func providerEnvVars() []service.Var {
	return []service.Var{
		{Name: EnvOpenAIKey, Help: "serves the openai provider (OpenAI Chat Completions) with this API key", Example: "sk-example"},
		{Name: EnvOpenAIBaseURL, Help: "base URL of the openai provider: any server that speaks Chat Completions (vLLM, Ollama, LiteLLM); serves the provider even without a key",
			Example: "http://localhost:11434/v1"},
		{Name: EnvAnthropicKey, Help: "serves the anthropic provider (Anthropic Messages) with this API key", Example: "sk-ant-example"},
		{Name: EnvAnthropicBaseURL, Help: "base URL of the anthropic provider (default https://api.anthropic.com)", Example: "http://llm-proxy:4000"},
		{Name: EnvModelRetries, Help: "retries of a failed model request, with back-off that respects Retry-After (0 to 20, default 3)", Example: "5"},
	}
}

// readProviders reads the model providers' settings: "openai" is served when
// OPENAI_API_KEY or OPENAI_BASE_URL is set, "anthropic" when
// ANTHROPIC_API_KEY is (ANTHROPIC_BASE_URL optional), each retrying
// TOOLWIRE_MODEL_RETRIES times. The scripted provider is always served; none
// of them needs a key.
func readProviders(e *service.Env, c *Config) {
	e.String(EnvOpenAIKey, &c.OpenAI.APIKey)
	e.String(EnvAnthropicKey, &c.Anthropic.APIKey)
	for _, v := range []struct {
		name string
		dst  *string
	}{{EnvOpenAIBaseURL, &c.OpenAI.BaseURL}, {EnvAnthropicBaseURL, &c.Anthropic.BaseURL}} {
		if u, ok := e.Lookup(v.name); ok {
			e.Check(v.name, u, checkBaseURL(u))
			*v.dst = u
		}
	}
	retries := -1
	e.Int(EnvModelRetries, 0, maxModelRetries, &retries)
	if retries >= 0 {
		if retries == 0 {
			retries = -1 // the adapters' "none"
		}
		c.OpenAI.MaxRetries, c.Anthropic.MaxRetries = retries, retries
	}
}

var errBaseURL = errors.New("want an http(s) URL such as http://localhost:11434/v1")

func checkBaseURL(v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errBaseURL
	}
	return nil
}

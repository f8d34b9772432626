package orchestrator

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Environment variables of the model providers.
const (
	EnvOpenAIKey        = "OPENAI_API_KEY"
	EnvOpenAIBaseURL    = "OPENAI_BASE_URL"
	EnvAnthropicKey     = "ANTHROPIC_API_KEY"
	EnvAnthropicBaseURL = "ANTHROPIC_BASE_URL"
)

// ProviderEnvVars lists the variables ProvidersFromEnv reads.
func ProviderEnvVars() []string {
	return []string{EnvOpenAIKey, EnvOpenAIBaseURL, EnvAnthropicKey, EnvAnthropicBaseURL, EnvModelRetries}
}

// ProvidersFromEnv builds the model providers the environment configures:
// "openai" when OPENAI_API_KEY or OPENAI_BASE_URL is set (a local
// OpenAI-compatible server may need no key), "anthropic" when
// ANTHROPIC_API_KEY is set (ANTHROPIC_BASE_URL optional), each retrying
// TOOLWIRE_MODEL_RETRIES times (default 3). The scripted provider is always
// there; none of them needs a key.
func ProvidersFromEnv(getenv func(string) string) (Providers, error) {
	p := Providers{}
	retries := 0
	if v := strings.TrimSpace(getenv(EnvModelRetries)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 20 {
			return nil, fmt.Errorf("%s=%q: want a number from 0 to 20", EnvModelRetries, v)
		}
		retries = n
		if n == 0 {
			retries = -1 // none
		}
	}
	if key, base := strings.TrimSpace(getenv(EnvOpenAIKey)), strings.TrimSpace(getenv(EnvOpenAIBaseURL)); key != "" || base != "" {
		if err := checkBaseURL(EnvOpenAIBaseURL, base); err != nil {
			return nil, err
		}
		p[OpenAIProviderName] = NewOpenAIProvider(OpenAIConfig{APIKey: key, BaseURL: base, MaxRetries: retries})
	}
	if key := strings.TrimSpace(getenv(EnvAnthropicKey)); key != "" {
		base := strings.TrimSpace(getenv(EnvAnthropicBaseURL))
		if err := checkBaseURL(EnvAnthropicBaseURL, base); err != nil {
			return nil, err
		}
		p[AnthropicProviderName] = NewAnthropicProvider(AnthropicConfig{APIKey: key, BaseURL: base, MaxRetries: retries})
	}
	return p, nil
}

func checkBaseURL(name, v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s=%q: want an http(s) URL such as http://localhost:11434/v1", name, v)
	}
	return nil
}

package orchestrator

// The model adapters the orchestrator serves, and the environment that
// configures them.

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
	"github.com/toolwire/toolwire/services/orchestrator/provider/anthropic"
	"github.com/toolwire/toolwire/services/orchestrator/provider/openai"
	"github.com/toolwire/toolwire/services/orchestrator/provider/scripted"
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

// ErrUnknownProvider is returned for a model provider no adapter serves.
var ErrUnknownProvider = errors.New("unknown model provider")

// Providers maps a provider name (agent.model.provider) to its adapter.
type Providers map[string]provider.Provider

// Get returns the named provider.
func (p Providers) Get(name string) (provider.Provider, error) {
	if pr, ok := p[name]; ok {
		return pr, nil
	}
	return nil, fmt.Errorf("%w %q (available: %v)", ErrUnknownProvider, name, p.Names())
}

// Names returns the provider names, sorted.
func (p Providers) Names() []string {
	return slices.Sorted(maps.Keys(p))
}

// serving returns the model adapters the service serves: those the
// configuration sets up (always "scripted"; "openai" and "anthropic" when
// configured), then c.Providers over them.
func (c Config) serving() Providers {
	p := Providers{scripted.Name: scripted.Provider{}}
	if c.OpenAI.APIKey != "" || c.OpenAI.BaseURL != "" {
		p[openai.Name] = openai.New(c.OpenAI)
	}
	if c.Anthropic.APIKey != "" {
		p[anthropic.Name] = anthropic.New(c.Anthropic)
	}
	maps.Copy(p, c.Providers)
	return p
}

// providerHint says how to make a well-known provider available.
func providerHint(name string) string {
	switch name {
	case openai.Name:
		return "; set " + EnvOpenAIKey + " (and optionally " + EnvOpenAIBaseURL + ") in the orchestrator's environment"
	case anthropic.Name:
		return "; set " + EnvAnthropicKey + " in the orchestrator's environment"
	}
	return ""
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

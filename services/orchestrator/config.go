package orchestrator

import (
	"fmt"
	"strconv"
	"time"
)

// Environment variables of the orchestrator (besides the common ones).
const (
	EnvConcurrency  = "TOOLWIRE_ORCHESTRATOR_CONCURRENCY"
	EnvModelTimeout = "TOOLWIRE_MODEL_TIMEOUT"
)

// EnvVars lists the orchestrator's own environment variables.
func EnvVars() []string { return []string{EnvConcurrency, EnvModelTimeout} }

// Config configures the orchestrator.
type Config struct {
	Source            string        // CloudEvents source; default /toolwire/orchestrator
	Concurrency       int           // handlers at once per consumer; default 64
	ModelTimeout      time.Duration // bound on one model call; default 2m
	TracesURLTemplate string        // e.g. http://jaeger:16686/trace/{trace_id}
	Providers         Providers     // model adapters by name; "scripted" is always there
}

// ConfigFromEnv reads the orchestrator's configuration.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{}
	if v := getenv(EnvConcurrency); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4096 {
			return c, fmt.Errorf("%s=%q: want a number from 1 to 4096", EnvConcurrency, v)
		}
		c.Concurrency = n
	}
	if v := getenv(EnvModelTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("%s=%q: want a positive duration like 2m", EnvModelTimeout, v)
		}
		c.ModelTimeout = d
	}
	return c, nil
}

func (c Config) withDefaults() Config {
	if c.Source == "" {
		c.Source = "/toolwire/orchestrator"
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.ModelTimeout <= 0 {
		c.ModelTimeout = 2 * time.Minute
	}
	p := Providers{ScriptedProviderName: ScriptedProvider{}}
	for k, v := range c.Providers {
		p[k] = v
	}
	c.Providers = p
	return c
}

package policy

import (
	"fmt"
	"strconv"
)

// EnvConcurrency sets Config.Concurrency.
const EnvConcurrency = "TOOLWIRE_POLICY_CONCURRENCY"

// Defaults of Config.
const (
	DefaultSource      = "/toolwire/policy"
	DefaultConcurrency = 32
	maxConcurrency     = 4096
)

// Config configures the Policy Guard service. Zero values mean the defaults.
type Config struct {
	// Source is the CloudEvents source of the events the guard publishes.
	Source string
	// Concurrency is how many checks each of the guard's two consumers handles
	// at once in this replica.
	Concurrency int
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Source == "" {
		c.Source = DefaultSource
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	c = c.WithDefaults()
	if c.Concurrency < 1 || c.Concurrency > maxConcurrency {
		return fmt.Errorf("policy: concurrency %d: want 1 to %d", c.Concurrency, maxConcurrency)
	}
	return nil
}

// ConfigFromEnv reads the configuration from the environment; unset
// variables take their defaults.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	if v := getenv(EnvConcurrency); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxConcurrency {
			return Config{}, fmt.Errorf("%s=%q: want a number from 1 to %d", EnvConcurrency, v, maxConcurrency)
		}
		c.Concurrency = n
	}
	return c.WithDefaults(), nil
}

// EnvVars lists the variables ConfigFromEnv reads, besides the common ones of
// every service (service.CommonEnvVars).
func EnvVars() []string { return []string{EnvConcurrency} }

package executor

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvConcurrency = "TOOLWIRE_EXECUTOR_CONCURRENCY" // tool calls in flight per replica
	EnvID          = "TOOLWIRE_EXECUTOR_ID"          // replica id; default hostname-pid
)

// Defaults and limits of Config.
const (
	DefaultConcurrency = 64
	// MaxConcurrency bounds Concurrency: one replica never holds more calls in
	// flight than the shared consumer allows across all replicas.
	MaxConcurrency = maxAckPending
	DefaultSource  = "/toolwire/executor"
	maxIDLen       = 128
)

// Config configures the executor.
type Config struct {
	// Concurrency is the number of tool calls one replica runs at once.
	Concurrency int
	// Source is the CloudEvents source of the events the executor publishes.
	Source string
	// ID names this replica in call.started events; default hostname-pid.
	ID string
}

// EnvVars lists the environment variables ConfigFromEnv reads, for docs and
// deployment checks.
func EnvVars() []string { return []string{EnvConcurrency, EnvID} }

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	return Config{Concurrency: DefaultConcurrency, Source: DefaultSource, ID: defaultID()}
}

func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "executor"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Source == "" {
		c.Source = DefaultSource
	}
	if c.ID == "" {
		c.ID = defaultID()
	}
	return c
}

// Validate checks the configuration; zero fields mean their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d: want 1 to %d", c.Concurrency, MaxConcurrency))
	}
	if strings.TrimSpace(c.Source) != c.Source || strings.ContainsFunc(c.Source, unicode.IsControl) {
		errs = append(errs, fmt.Errorf("source %q: must not hold spaces at its ends or control characters", c.Source))
	}
	if len(c.ID) > maxIDLen || strings.ContainsFunc(c.ID, unicode.IsControl) {
		errs = append(errs, fmt.Errorf("id %q: want at most %d printable characters", c.ID, maxIDLen))
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment, with defaults,
// and reports every bad value at once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	var errs []error
	if v := strings.TrimSpace(getenv(EnvConcurrency)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxConcurrency {
			errs = append(errs, fmt.Errorf("%s=%q: want a whole number from 1 to %d", EnvConcurrency, v, MaxConcurrency))
		} else {
			c.Concurrency = n
		}
	}
	if v := getenv(EnvID); v != "" {
		if len(v) > maxIDLen || strings.ContainsFunc(v, unicode.IsControl) {
			errs = append(errs, fmt.Errorf("%s=%q: want at most %d printable characters", EnvID, v, maxIDLen))
		} else {
			c.ID = v
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	return c, c.Validate()
}

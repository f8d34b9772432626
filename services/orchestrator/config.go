package orchestrator

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Environment variables of the orchestrator (besides the common ones and the
// providers' own, see ProviderEnvVars).
const (
	EnvConcurrency  = "TOOLWIRE_ORCHESTRATOR_CONCURRENCY"
	EnvModelTimeout = "TOOLWIRE_MODEL_TIMEOUT"
	EnvModelRetries = "TOOLWIRE_MODEL_RETRIES"
)

// EnvVars lists the orchestrator's own environment variables.
func EnvVars() []string {
	return append([]string{EnvConcurrency, EnvModelTimeout, EnvPrices}, ProviderEnvVars()...)
}

// Defaults.
const (
	DefaultModelTimeout = 2 * time.Minute
	DefaultModelRetries = 3
	// MaxModelAttempts bounds how often the model call of one iteration may
	// be started: a call that keeps getting interrupted (its replica dies
	// every time) ends the run instead of looping.
	MaxModelAttempts = 5
)

// Config configures the orchestrator.
type Config struct {
	Source            string        // CloudEvents source; default /toolwire/orchestrator
	Concurrency       int           // handlers at once per consumer; default 64
	ModelTimeout      time.Duration // bound on one model call, retries included; default 2m
	TracesURLTemplate string        // e.g. http://jaeger:16686/trace/{trace_id}
	Providers         Providers     // model adapters by name; "scripted" is always there
	// Prices is the model price table; default DefaultPrices.
	Prices Prices
	// AckWait is how long a delivery may stay unacknowledged before another
	// replica gets it (a live handler keeps extending it). Default
	// ModelTimeout + 30s for verdicts (they wait for the model), at most 30s
	// for tool completions and approvals.
	AckWait time.Duration
	// InstanceID names this replica in the run state's model claims; default
	// host name, process id and a random suffix.
	InstanceID string
	// Faults injects failures at named points: tests only.
	Faults Faults
}

// ConfigFromEnv reads the orchestrator's configuration, its price table and
// its model providers (ProvidersFromEnv) from the environment.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{}
	var errs []error
	if v := getenv(EnvConcurrency); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4096 {
			errs = append(errs, fmt.Errorf("%s=%q: want a number from 1 to 4096", EnvConcurrency, v))
		}
		c.Concurrency = n
	}
	if v := getenv(EnvModelTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a positive duration like 2m", EnvModelTimeout, v))
		}
		c.ModelTimeout = d
	}
	var err error
	if c.Prices, err = PricesFromEnv(getenv); err != nil {
		errs = append(errs, err)
	}
	if c.Providers, err = ProvidersFromEnv(getenv); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Source == "" {
		c.Source = "/toolwire/orchestrator"
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.ModelTimeout <= 0 {
		c.ModelTimeout = DefaultModelTimeout
	}
	if c.AckWait <= 0 {
		c.AckWait = c.ModelTimeout + 30*time.Second
	}
	if c.Prices == nil {
		c.Prices = DefaultPrices()
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.InstanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	p := Providers{ScriptedProviderName: ScriptedProvider{}}
	for k, v := range c.Providers {
		p[k] = v
	}
	c.Providers = p
	return c
}

// claimLease is how long a model claim holds: the model call is bounded by
// ModelTimeout, and recording its turn takes a moment more.
func (c Config) claimLease() time.Duration {
	return c.ModelTimeout + min(2*time.Second, c.ModelTimeout)
}

// shortAckWait is the ack wait of the consumers whose handlers never call the
// model.
func (c Config) shortAckWait() time.Duration { return min(c.AckWait, 30*time.Second) }

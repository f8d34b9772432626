package executor

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvConcurrency = "TOOLWIRE_EXECUTOR_CONCURRENCY" // tool calls in flight per replica
	EnvID          = "TOOLWIRE_EXECUTOR_ID"          // replica id; default hostname-pid
	// EnvMaxOutputBytes is the size above which an output is truncated and
	// stored as a blob.
	EnvMaxOutputBytes = "TOOLWIRE_MAX_OUTPUT_BYTES"
	// EnvPreviewBytes is how much of a truncated output the envelope keeps.
	EnvPreviewBytes = "TOOLWIRE_OUTPUT_PREVIEW_BYTES"
	// EnvCircuitFailures is how many consecutive failures open a tool's circuit.
	EnvCircuitFailures = "TOOLWIRE_EXECUTOR_CIRCUIT_FAILURES"
	// EnvCircuitOpen is how long an open circuit refuses calls (a duration).
	EnvCircuitOpen = "TOOLWIRE_EXECUTOR_CIRCUIT_OPEN"
	// EnvClaimLease is how long a writes call's claim lives without a
	// heartbeat before another replica declares its outcome unknown.
	EnvClaimLease = "TOOLWIRE_EXECUTOR_CLAIM_LEASE"
	// EnvAckWait is the shared consumer's ack wait (all replicas must agree).
	EnvAckWait = "TOOLWIRE_EXECUTOR_ACK_WAIT"
	// EnvStartedAfter sets Config.StartedAfter (a duration; 0 publishes
	// call.started before the tool runs).
	EnvStartedAfter = "TOOLWIRE_EXECUTOR_STARTED_AFTER"
)

// Defaults and limits of Config.
const (
	DefaultConcurrency = 64
	// MaxConcurrency bounds Concurrency: one replica never holds more calls in
	// flight than the shared consumer allows across all replicas.
	MaxConcurrency = maxAckPending
	DefaultSource  = "/toolwire/executor"
	maxIDLen       = 128

	// DefaultMaxOutputBytes is the spec's max_output_bytes (5.4): 2 MiB.
	DefaultMaxOutputBytes = 2 << 20
	// MaxMaxOutputBytes bounds MaxOutputBytes (1 GiB).
	MaxMaxOutputBytes = 1 << 30
	// DefaultPreviewBytes is how much of a truncated output the envelope keeps.
	DefaultPreviewBytes = 16 << 10
	// DefaultCircuitFailures is how many consecutive failures open a circuit.
	DefaultCircuitFailures = 5
	// DefaultCircuitOpen is how long an open circuit refuses calls.
	DefaultCircuitOpen = 30 * time.Second
	// DefaultClaimLease is the lease of a writes call's claim.
	DefaultClaimLease = 15 * time.Second
	// DefaultAckWait is the shared consumer's ack wait.
	DefaultAckWait = 30 * time.Second
	// DefaultStartedAfter is how long a call runs before its call.started
	// goes out on its own.
	DefaultStartedAfter = 5 * time.Millisecond
)

// Config configures the executor.
type Config struct {
	// Concurrency is the number of tool calls one replica runs at once.
	Concurrency int
	// Source is the CloudEvents source of the events the executor publishes.
	Source string
	// ID names this replica in call.started events; default hostname-pid.
	ID string
	// MaxOutputBytes is the spec's max_output_bytes: a larger output is
	// stored whole as a blob and the envelope keeps a preview. An output is
	// also truncated when its envelope would not fit in one NATS message (the
	// server's max_payload, 1 MiB by default). Default 2 MiB.
	MaxOutputBytes int
	// PreviewBytes is how many bytes of a truncated output its preview keeps
	// (cut back to fit the message when needed). Default 16 KiB.
	PreviewBytes int
	// CircuitFailures is how many consecutive PROVIDER_ERROR, NETWORK_ERROR or
	// TIMEOUT outcomes of one tool open its circuit. Default 5.
	CircuitFailures int
	// CircuitOpen is how long an open circuit answers PROVIDER_ERROR at once
	// before letting one trial call through. Default 30s.
	CircuitOpen time.Duration
	// ClaimLease is how long the claim of a writes call lives without a
	// heartbeat (sent every third of it while the tool runs) before a
	// redelivery declares the outcome unknown. Default 15s.
	ClaimLease time.Duration
	// AckWait is the shared consumer's ack wait: how long a replica that
	// stopped answering holds a call before JetStream redelivers it. Every
	// replica must use the same value. Default 30s.
	AckWait time.Duration
	// StartedAfter is how long a call runs before its call.started is
	// published on its own. A call that ends sooner publishes call.started
	// together with call.completed, started first, in one flush: the
	// timeline learns of a quick call once, and the call's path to its
	// envelope carries no second publish (t_start in the event is the
	// tool's start either way). Default 5ms; negative: call.started goes out
	// before the tool runs.
	StartedAfter time.Duration
}

// EnvVars lists the environment variables ConfigFromEnv reads, for docs and
// deployment checks.
func EnvVars() []string {
	return []string{EnvConcurrency, EnvID, EnvMaxOutputBytes, EnvPreviewBytes, EnvCircuitFailures, EnvCircuitOpen, EnvClaimLease, EnvAckWait, EnvStartedAfter}
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	return Config{}.withDefaults()
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
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.PreviewBytes == 0 {
		c.PreviewBytes = min(DefaultPreviewBytes, c.MaxOutputBytes)
	}
	if c.CircuitFailures == 0 {
		c.CircuitFailures = DefaultCircuitFailures
	}
	if c.CircuitOpen == 0 {
		c.CircuitOpen = DefaultCircuitOpen
	}
	if c.ClaimLease == 0 {
		c.ClaimLease = DefaultClaimLease
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.StartedAfter == 0 {
		c.StartedAfter = DefaultStartedAfter
	}
	return c
}

// Bounds of the durations and sizes of Config.
const (
	minDuration        = 10 * time.Millisecond
	maxCircuitOpen     = time.Hour
	maxClaimLease      = time.Hour
	maxAckWait         = time.Hour
	maxCircuitFailures = 1000
	maxStartedAfter    = 10 * time.Second
)

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
	if c.MaxOutputBytes < 1 || c.MaxOutputBytes > MaxMaxOutputBytes {
		errs = append(errs, fmt.Errorf("max output bytes %d: want 1 to %d", c.MaxOutputBytes, MaxMaxOutputBytes))
	}
	if c.PreviewBytes < 1 || c.PreviewBytes > c.MaxOutputBytes {
		errs = append(errs, fmt.Errorf("preview bytes %d: want 1 to max output bytes (%d)", c.PreviewBytes, c.MaxOutputBytes))
	}
	if c.CircuitFailures < 1 || c.CircuitFailures > maxCircuitFailures {
		errs = append(errs, fmt.Errorf("circuit failures %d: want 1 to %d", c.CircuitFailures, maxCircuitFailures))
	}
	errs = append(errs,
		checkDuration("circuit open", c.CircuitOpen, maxCircuitOpen),
		checkDuration("claim lease", c.ClaimLease, maxClaimLease),
		checkDuration("ack wait", c.AckWait, maxAckWait))
	if c.StartedAfter > maxStartedAfter {
		errs = append(errs, fmt.Errorf("started after %s: want at most %s", c.StartedAfter, maxStartedAfter))
	}
	return errors.Join(errs...)
}

func checkDuration(what string, d, limit time.Duration) error {
	if d < minDuration || d > limit {
		return fmt.Errorf("%s %s: want %s to %s", what, d, minDuration, limit)
	}
	return nil
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
	errs = append(errs,
		envInt(getenv, EnvMaxOutputBytes, 1, MaxMaxOutputBytes, &c.MaxOutputBytes),
		envInt(getenv, EnvPreviewBytes, 1, MaxMaxOutputBytes, &c.PreviewBytes),
		envInt(getenv, EnvCircuitFailures, 1, maxCircuitFailures, &c.CircuitFailures),
		envDuration(getenv, EnvCircuitOpen, maxCircuitOpen, &c.CircuitOpen),
		envDuration(getenv, EnvClaimLease, maxClaimLease, &c.ClaimLease),
		envDuration(getenv, EnvAckWait, maxAckWait, &c.AckWait),
		envStartedAfter(getenv, &c.StartedAfter))
	if strings.TrimSpace(getenv(EnvPreviewBytes)) == "" {
		c.PreviewBytes = min(DefaultPreviewBytes, c.MaxOutputBytes)
	}
	if v := getenv(EnvID); v != "" {
		if len(v) > maxIDLen || strings.ContainsFunc(v, unicode.IsControl) {
			errs = append(errs, fmt.Errorf("%s=%q: want at most %d printable characters", EnvID, v, maxIDLen))
		} else {
			c.ID = v
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// envStartedAfter reads EnvStartedAfter: a duration up to maxStartedAfter,
// 0 meaning at once (a negative StartedAfter).
func envStartedAfter(getenv func(string) string, dst *time.Duration) error {
	v := strings.TrimSpace(getenv(EnvStartedAfter))
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > maxStartedAfter {
		return fmt.Errorf("%s=%q: want a duration from 0 (before the tool runs) to %s, for example 5ms", EnvStartedAfter, v, maxStartedAfter)
	}
	if d == 0 {
		d = -1
	}
	*dst = d
	return nil
}

// envInt reads a whole number from lo to hi into dst when the variable is set.
func envInt(getenv func(string) string, name string, lo, hi int, dst *int) error {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return fmt.Errorf("%s=%q: want a whole number from %d to %d", name, v, lo, hi)
	}
	*dst = n
	return nil
}

// envDuration reads a Go duration (for example 30s) into dst when the
// variable is set.
func envDuration(getenv func(string) string, name string, hi time.Duration, dst *time.Duration) error {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < minDuration || d > hi {
		return fmt.Errorf("%s=%q: want a duration from %s to %s, for example 30s", name, v, minDuration, hi)
	}
	*dst = d
	return nil
}

package recorder

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Environment variables read by ConfigFromEnv.
const (
	// EnvDatabaseURL names the database: sqlite:<path> for a SQLite file, or
	// Postgres, as a URL
	// (postgres://user@host:5432/db?sslmode=disable) or a keyword/value string.
	EnvDatabaseURL = "DATABASE_URL"
	// EnvBatch sets Config.Batch.
	EnvBatch = "TOOLWIRE_RECORDER_BATCH"
	// EnvPoll sets Config.Poll: a duration such as 20ms, or 0 to have each
	// event pushed as it is stored.
	EnvPoll = "TOOLWIRE_RECORDER_POLL"
)

// Defaults of Config.
const (
	DefaultBatch = 1024
	maxBatch     = 4096
	// DefaultPoll is how often the recorder fetches the events waiting.
	DefaultPoll = 20 * time.Millisecond
	maxPoll     = 5 * time.Second
)

// ErrNoDatabase is returned when no database is configured.
var ErrNoDatabase = errors.New("recorder: " + EnvDatabaseURL + " is required: set it to a Postgres URL such as postgres://user@host:5432/toolwire?sslmode=disable, or to sqlite:<path> for a SQLite file")

// Config configures the recorder. Zero values mean the defaults.
type Config struct {
	// DatabaseURL is the Postgres connection string, or sqlite:<path>
	// (required).
	DatabaseURL string
	// Batch is the most events written in one transaction. Under load the
	// recorder groups the events it holds into one commit; each is
	// acknowledged only after that commit. Each poll fetches up to Batch
	// events per stream (at most 512). Default 1024: with 256, a burst of
	// 840 one-call runs/s (13,000 events/s) left the recorder 0.4-0.9 s
	// behind after five seconds on two CPUs; with 1024, 20-30 ms.
	Batch int
	// Poll is how often the recorder fetches the events waiting (up to Batch
	// at once per stream), instead of having each event pushed to it as it
	// is stored: the recorder is off the agent loop's critical path, and
	// waking once per interval with a batch costs the services it shares a
	// server (and CPUs) with far less than a wake-up per event, and gives
	// the database bigger transactions. It adds at most Poll to the
	// recorder's lag. Zero means DefaultPoll; negative, push each event.
	Poll time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.Poll == 0 {
		c.Poll = DefaultPoll
	}
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, ErrNoDatabase)
	}
	if c.Batch < 1 || c.Batch > maxBatch {
		errs = append(errs, fmt.Errorf("recorder: batch %d: want 1 to %d", c.Batch, maxBatch))
	}
	if c.Poll > maxPoll {
		errs = append(errs, fmt.Errorf("recorder: poll %s: want at most %s", c.Poll, maxPoll))
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment; unset variables
// take their defaults. DATABASE_URL is required.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{DatabaseURL: getenv(EnvDatabaseURL)}
	var errs []error
	if v := getenv(EnvBatch); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxBatch {
			errs = append(errs, fmt.Errorf("%s=%q: want a number from 1 to %d", EnvBatch, v, maxBatch))
		}
		c.Batch = n
	}
	if v := getenv(EnvPoll); v != "" {
		d, err := time.ParseDuration(v)
		switch {
		case v == "0":
			c.Poll = -1
		case err != nil || d <= 0 || d > maxPoll:
			errs = append(errs, fmt.Errorf("%s=%q: want a duration up to %s such as 20ms, or 0 to push each event", EnvPoll, v, maxPoll))
		default:
			c.Poll = d
		}
	}
	if c.DatabaseURL == "" {
		errs = append(errs, ErrNoDatabase)
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	c = c.WithDefaults()
	return c, c.Validate()
}

// EnvVars lists the variables ConfigFromEnv reads, besides the common ones of
// every service (service.CommonEnvVars).
func EnvVars() []string { return []string{EnvDatabaseURL, EnvBatch, EnvPoll} }

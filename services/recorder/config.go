package recorder

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/recorder/api"
)

// Environment variables read by ConfigFromEnv.
const (
	// EnvDatabaseURL sets Config.DatabaseURL: sqlite:<path> for a SQLite
	// file, or Postgres, as a URL
	// (postgres://user@host:5432/db?sslmode=disable) or a keyword/value string.
	EnvDatabaseURL = "DATABASE_URL"
	// EnvBatch sets Config.Batch.
	EnvBatch = "TOOLWIRE_RECORDER_BATCH"
	// EnvPoll sets Config.Poll: a duration such as 20ms, or 0 to have each
	// event pushed as it is stored.
	EnvPoll = "TOOLWIRE_RECORDER_POLL"
	// EnvAdminToken sets Config.AdminToken.
	EnvAdminToken = api.AdminTokenVar
	// EnvDatabaseWait sets Config.DatabaseWait.
	EnvDatabaseWait = "TOOLWIRE_RECORDER_DATABASE_WAIT"
)

// Defaults of Config.
const (
	DefaultBatch = 1024
	maxBatch     = 4096
	// DefaultPoll is how often the recorder fetches the events waiting.
	DefaultPoll = 20 * time.Millisecond
	maxPoll     = 5 * time.Second
	// DefaultDatabaseWait is how long Start waits for the database.
	DefaultDatabaseWait = 30 * time.Second
	minDatabaseWait     = time.Second
	maxDatabaseWait     = time.Hour
)

// ErrNoDatabase is returned when no database is configured.
var ErrNoDatabase = errors.New("recorder: " + EnvDatabaseURL + " is required: set it to a Postgres URL such as postgres://user@host:5432/toolwire?sslmode=disable, or to sqlite:<path> for a SQLite file")

// Config configures the recorder. Zero values mean the defaults.
type Config struct {
	// DatabaseURL is the Postgres connection string, or sqlite:<path>
	// (required: New refuses a config without it).
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
	// AdminToken turns the registry's admin routes of the API on
	// (/v1/admin/tools): they then require it as a bearer token. "" leaves
	// them off.
	AdminToken string
	// DatabaseWait bounds how long Start waits for the database to answer
	// (a database starting beside the recorder takes a few seconds); then
	// Start fails with what to check. Default 30s; 1s to 1h.
	DatabaseWait time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.Poll = cmp.Or(c.Poll, DefaultPoll)
	c.DatabaseWait = cmp.Or(c.DatabaseWait, DefaultDatabaseWait)
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
	if c.DatabaseWait < minDatabaseWait || c.DatabaseWait > maxDatabaseWait {
		errs = append(errs, fmt.Errorf("recorder: database wait %s: want %s to %s", c.DatabaseWait, minDatabaseWait, maxDatabaseWait))
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment; unset
// variables take their defaults. Every bad value is reported at once.
// DATABASE_URL may be unset here (an option may fill it in): New refuses a
// configuration without it.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	e := service.NewEnv(getenv)
	e.String(EnvDatabaseURL, &c.DatabaseURL)
	e.Int(EnvBatch, 1, maxBatch, &c.Batch)
	if v, ok := e.Lookup(EnvPoll); ok {
		d, err := time.ParseDuration(v)
		switch {
		case v == "0":
			c.Poll = -1
		case err != nil || d <= 0 || d > maxPoll:
			e.Fail(EnvPoll, v, fmt.Sprintf("want a duration up to %s such as 20ms, or 0 to push each event", maxPoll))
		default:
			c.Poll = d
		}
	}
	e.String(EnvAdminToken, &c.AdminToken)
	e.Duration(EnvDatabaseWait, minDatabaseWait, maxDatabaseWait, &c.DatabaseWait)
	return c.WithDefaults(), e.Err()
}

// EnvVars documents the variables ConfigFromEnv reads, besides the common
// ones of every service (service.CommonEnvVars).
func EnvVars() []service.Var {
	return []service.Var{
		{Name: EnvDatabaseURL, Help: "the recorder's database (required): a Postgres URL, or sqlite:<path> for a SQLite file (one recorder process)",
			Example: "postgres://toolwire@postgres:5432/toolwire?sslmode=disable"},
		{Name: EnvBatch, Help: "most events written in one transaction (1 to 4096; default 1024)", Example: "256"},
		{Name: EnvPoll, Help: "how often the recorder fetches the events waiting (up to 5s; default 20ms); 0 has each event pushed as it is stored",
			Example: "100ms"},
		{Name: EnvAdminToken, Help: "turns the registry's admin routes (/v1/admin/tools) on; they require it as a bearer token (default: off)",
			Example: "an-admin-token"},
		{Name: EnvDatabaseWait, Help: "how long start-up waits for the database to answer before it fails saying what to check (1s to 1h; default 30s)",
			Example: "2m"},
	}
}

package executor

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// Environment variables read by ConfigFromEnv, besides the master keys' (see
// package secrets): EnvVars lists them all. Those of the standard families
// (the web tools', those passed to stdio MCP servers) are package
// standard's.
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
	// EnvQueues lists the queues the executor serves, comma-separated
	// (Config.Queues).
	EnvQueues = "TOOLWIRE_EXECUTOR_QUEUES"
	// EnvHeartbeat is how often the executor heartbeats its queues
	// (Config.Heartbeat).
	EnvHeartbeat = "TOOLWIRE_EXECUTOR_HEARTBEAT"
)

// Defaults and limits of Config.
const (
	DefaultConcurrency = 64
	// MaxConcurrency bounds Concurrency: one replica never holds more calls in
	// flight than the shared consumer allows across all replicas.
	MaxConcurrency = maxAckPending
	DefaultSource  = "/toolwire/executor"
	maxIDLen       = 128

	// DefaultMaxOutputBytes is the largest output an envelope carries
	// inline: 64 KiB, an ordinary API answer, while a web page or a file goes
	// to the blob store. Every completed event carries its envelope to the
	// orchestrator, the recorder and every watcher, so the output inline
	// weighs on every one of them; the model still gets the whole output (up
	// to its own limit) from the blob.
	DefaultMaxOutputBytes = 64 << 10
	// MaxMaxOutputBytes bounds MaxOutputBytes: 192 KiB, so that a completed
	// event stays well under 256 KiB (the bound of contract v2 on every
	// event: no event grows with tool output) with 64 KiB left for the rest
	// of the envelope (the input the model sent, an error's details, the
	// attachments) and the CloudEvents headers.
	MaxMaxOutputBytes = 192 << 10
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
	// DefaultStartedAfter is how long a call runs before its call.started is
	// published: a quarter second. A quicker call needs no event to say it
	// began, since its envelope carries t_start; a call that runs longer is
	// one a person watching the timeline would notice, and it shows as
	// running there until it completes.
	DefaultStartedAfter = 250 * time.Millisecond
	// maxQueues bounds Queues: each is a consumer of its own.
	maxQueues = 64
	// DefaultHeartbeat is how often the executor heartbeats its queues: a
	// worker that dies drops out of its queues within three of them.
	DefaultHeartbeat = 5 * time.Second
	// heartbeatTTLs is how many heartbeats a beat outlives: two may be lost
	// (a slow NATS, a pause) before a live worker counts as gone.
	heartbeatTTLs = 3
)

// Config configures the executor. Zero fields take their defaults.
type Config struct {
	// Queues are the queues whose approved calls the executor runs
	// (toolwire.call.<run>.<call>.approved.<queue>), each through a durable
	// consumer that every replica serving it shares (DurableFor). Default
	// [envelope.DefaultQueue], the queue of every tool that names none. A
	// call on a served queue whose tool this executor cannot run (another
	// kind, a builtin it lacks) is answered with an error envelope.
	Queues []string
	// Concurrency is the number of tool calls one replica runs at once on
	// each of its queues.
	Concurrency int
	// Source is the CloudEvents source of the events the executor publishes.
	Source string
	// ID names this replica in call.started events; default hostname-pid.
	ID string
	// MaxOutputBytes is max_output_bytes (docs/tools.md, Truncation): a
	// larger output is stored whole as a blob and the envelope keeps a
	// preview, so that the envelope's output never weighs more than this.
	// An output is also truncated when its envelope would not fit in one
	// NATS message (the server's max_payload, 1 MiB by default; a large
	// input can do that). Default 64 KiB (DefaultMaxOutputBytes), at most
	// 192 KiB (MaxMaxOutputBytes).
	MaxOutputBytes int
	// PreviewBytes is how many bytes of a truncated output its preview keeps
	// (cut back so that the preview, escaped as a JSON string, stays within
	// MaxOutputBytes and the message). Default 16 KiB.
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
	// published. A call that ends sooner publishes no call.started at all:
	// its envelope carries t_start, so the event would tell a watcher
	// nothing the completed event does not, and it would be one more stored
	// event per call on the hot path. A call still running after it is
	// announced while it runs, so the timeline shows a slow call running
	// live. Default 250ms (DefaultStartedAfter): below what a person notices
	// on a timeline. Negative: call.started goes out before the tool runs,
	// for every call.
	//
	// A call that resolved secrets publishes its call.started whatever its
	// duration (with its completed event, started first, when quick): the
	// started event is where the scope each secret came from, and any
	// warning about it, are recorded, and the envelope has no place for
	// them.
	StartedAfter time.Duration
	// Heartbeat is how often the executor heartbeats each queue it serves
	// (registry.Beat), each beat holding for three of them: the Policy
	// Guard routes calls only to a queue with a live worker, and `toolwire
	// tools list` shows each queue's workers. Default 5s; 1s to 3m.
	Heartbeat time.Duration

	// Keyring holds the master keys that open the secrets tools declare
	// (required_secrets); nil: a tool that needs a secret fails with
	// AUTH_REQUIRED. ConfigFromEnv reads it from TOOLWIRE_MASTER_KEYS.
	Keyring *secrets.Keyring
	// MasterKeyID is TOOLWIRE_MASTER_KEY_ID as set: the current one of
	// several master keys. The executor only opens secrets, with whichever
	// key sealed them; the id matters only in reading several keys, where
	// the keyring needs it.
	MasterKeyID string
	// Tools are in-process tools (a worker's, a test's; package testtools),
	// run beside the families'. Each is keyed by its definition's builtin
	// implementation key, and its definition is ensured in the registry at
	// Start.
	Tools []toolapi.Tool
	// Families are the tool families the executor runs beside Tools: their
	// in-process tools and the kinds that run registry entries of kind
	// http, mcp or sandbox. None: the executor runs only Tools, and answers
	// a call of an entry of those kinds with an error envelope (a worker).
	// The executor binary's are package standard's.
	Families []Family
}

// Option adjusts a Config: the one Build read from the environment, or any
// (Config.With).
type Option func(*Config)

// With returns c with opts applied in order.
func (c Config) With(opts ...Option) Config {
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithQueues sets the queues the executor serves (Config.Queues), replacing
// those read from the environment.
func WithQueues(queues ...string) Option {
	return func(c *Config) { c.Queues = append([]string(nil), queues...) }
}

// WithTools adds in-process tools (Config.Tools).
func WithTools(tools ...toolapi.Tool) Option {
	return func(c *Config) { c.Tools = append(c.Tools, tools...) }
}

// WithFamilies adds tool families (Config.Families).
func WithFamilies(fams ...Family) Option {
	return func(c *Config) { c.Families = append(c.Families, fams...) }
}

// WithKeyring gives the executor the master keys that open secrets
// (Config.Keyring), replacing those read from the environment.
func WithKeyring(k *secrets.Keyring) Option {
	return func(c *Config) { c.Keyring = k }
}

func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "executor"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if len(c.Queues) == 0 {
		c.Queues = []string{envelope.DefaultQueue}
	}
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.Source = cmp.Or(c.Source, DefaultSource)
	c.ID = cmp.Or(c.ID, defaultID())
	c.MaxOutputBytes = cmp.Or(c.MaxOutputBytes, DefaultMaxOutputBytes)
	c.PreviewBytes = cmp.Or(c.PreviewBytes, min(DefaultPreviewBytes, c.MaxOutputBytes))
	c.CircuitFailures = cmp.Or(c.CircuitFailures, DefaultCircuitFailures)
	c.CircuitOpen = cmp.Or(c.CircuitOpen, DefaultCircuitOpen)
	c.ClaimLease = cmp.Or(c.ClaimLease, DefaultClaimLease)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	c.StartedAfter = cmp.Or(c.StartedAfter, DefaultStartedAfter)
	c.Heartbeat = cmp.Or(c.Heartbeat, DefaultHeartbeat)
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
	// A beat's TTL (three heartbeats) is within registry's bounds.
	minHeartbeat = time.Second
	maxHeartbeat = 3 * time.Minute
)

// Validate checks the configuration; zero fields mean their defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	errs := []error{c.validateQueues()}
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
	if c.Heartbeat < minHeartbeat || c.Heartbeat > maxHeartbeat {
		errs = append(errs, fmt.Errorf("heartbeat %s: want %s to %s", c.Heartbeat, minHeartbeat, maxHeartbeat))
	}
	if c.StartedAfter > maxStartedAfter {
		errs = append(errs, fmt.Errorf("started after %s: want at most %s", c.StartedAfter, maxStartedAfter))
	}
	return errors.Join(errs...)
}

// validateQueues checks Queues: valid queue names, each once.
func (c Config) validateQueues() error {
	var errs []error
	if len(c.Queues) > maxQueues {
		errs = append(errs, fmt.Errorf("%d queues: want at most %d", len(c.Queues), maxQueues))
	}
	seen := map[string]bool{}
	for _, q := range c.Queues {
		if err := envelope.ValidateQueue(q); err != nil {
			errs = append(errs, err)
		} else if seen[q] {
			errs = append(errs, fmt.Errorf("queue %q is listed twice", q))
		}
		seen[q] = true
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
	var c Config
	e := service.NewEnv(getenv)
	if v, ok := e.Lookup(EnvQueues); ok {
		e.List(EnvQueues, &c.Queues)
		e.Check(EnvQueues, v, Config{Queues: c.Queues}.validateQueues())
	}
	e.Int(EnvConcurrency, 1, MaxConcurrency, &c.Concurrency)
	e.Text(EnvID, maxIDLen, &c.ID)
	e.Int(EnvMaxOutputBytes, 1, MaxMaxOutputBytes, &c.MaxOutputBytes)
	e.Int(EnvPreviewBytes, 1, MaxMaxOutputBytes, &c.PreviewBytes)
	e.Int(EnvCircuitFailures, 1, maxCircuitFailures, &c.CircuitFailures)
	e.Duration(EnvCircuitOpen, minDuration, maxCircuitOpen, &c.CircuitOpen)
	e.Duration(EnvClaimLease, minDuration, maxClaimLease, &c.ClaimLease)
	e.Duration(EnvAckWait, minDuration, maxAckWait, &c.AckWait)
	e.Duration(EnvHeartbeat, minHeartbeat, maxHeartbeat, &c.Heartbeat)
	// 0 means before the tool runs: a negative StartedAfter.
	startedAfter := time.Duration(-1)
	e.Duration(EnvStartedAfter, 0, maxStartedAfter, &startedAfter)
	switch {
	case startedAfter == 0:
		c.StartedAfter = -1
	case startedAfter > 0:
		c.StartedAfter = startedAfter
	}

	e.String(secrets.EnvMasterKeyID, &c.MasterKeyID)
	if _, ok := e.Lookup(secrets.EnvMasterKeys); ok {
		k, err := secrets.ParseKeyring(e.Raw(secrets.EnvMasterKeys), c.MasterKeyID)
		// The keys are secret: the problem is named, the value never shown.
		e.Check(secrets.EnvMasterKeys, "(not shown)", err)
		c.Keyring = k
	}
	c = c.WithDefaults()
	if err := e.Err(); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// EnvVars documents the variables ConfigFromEnv reads, besides the common
// ones of every service (service.CommonEnvVars). The executor binary reads
// those of the standard families too: standard.EnvVars lists them all.
func EnvVars() []service.Var {
	return []service.Var{
		{Name: EnvQueues, Help: "the queues whose approved calls this executor runs, comma-separated (default \"default\", the queue of every tool that names none)", Example: "default,gpu"},
		{Name: EnvConcurrency, Help: "tool calls one replica runs at once on each of its queues (default 64)", Example: "16"},
		{Name: EnvID, Help: "this replica's name in call.started events (default hostname-pid)", Example: "executor-7"},
		{Name: EnvMaxOutputBytes, Help: "outputs larger than this are stored as blobs and the envelope keeps a preview (default 65536, at most 196608)", Example: "131072"},
		{Name: EnvPreviewBytes, Help: "bytes of a truncated output its preview keeps (default 16384)", Example: "4096"},
		{Name: EnvCircuitFailures, Help: "consecutive PROVIDER_ERROR, NETWORK_ERROR or TIMEOUT outcomes that open a tool's circuit (default 5)", Example: "3"},
		{Name: EnvCircuitOpen, Help: "how long an open circuit refuses calls (default 30s)", Example: "1m"},
		{Name: EnvClaimLease, Help: "how long a writes call's claim lives without a heartbeat (default 15s)", Example: "5s"},
		{Name: EnvAckWait, Help: "the shared consumer's ack wait, the same on every replica (default 30s)", Example: "10s"},
		{Name: EnvHeartbeat, Help: "how often the executor heartbeats the queues it serves; a beat holds for three (default 5s, 1s to 3m)", Example: "2s"},
		{Name: EnvStartedAfter, Help: "how long a call runs before its call.started is published; a quicker call publishes none (its envelope has t_start); 0: before the tool runs, for every call (default 250ms)", Example: "0"},
		{Name: secrets.EnvMasterKeys, Help: "the master keys that open the tools' secrets, id:base64key,... (unset: tools that need secrets fail with AUTH_REQUIRED)", Example: "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="},
		{Name: secrets.EnvMasterKeyID, Help: "the current one of several master keys", Example: "k1"},
	}
}

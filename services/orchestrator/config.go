package orchestrator

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

// Environment variables of the orchestrator (besides the common ones of
// service.CommonEnvVars; the model providers' are in providers.go).
const (
	EnvConcurrency      = "TOOLWIRE_ORCHESTRATOR_CONCURRENCY"
	EnvModelTimeout     = "TOOLWIRE_MODEL_TIMEOUT"
	EnvModelRetries     = "TOOLWIRE_MODEL_RETRIES"
	EnvStartedAfter     = "TOOLWIRE_RUN_STARTED_AFTER"
	EnvModelOutputBytes = "TOOLWIRE_MODEL_OUTPUT_BYTES"
	EnvRunDeadline      = "TOOLWIRE_RUN_DEADLINE"
	EnvAckWait          = "TOOLWIRE_ORCHESTRATOR_ACK_WAIT"
	EnvTimerAfter       = "TOOLWIRE_RUN_TIMER_AFTER"
	EnvCancelGrace      = "TOOLWIRE_CANCEL_GRACE"
)

// Defaults and bounds of Config.
const (
	DefaultSource       = "/toolwire/orchestrator"
	DefaultConcurrency  = 64
	DefaultModelTimeout = 2 * time.Minute
	// DefaultStartedAfter is how long a run's first model call runs before
	// the run's started event goes out: a run whose first answer comes
	// sooner needs none (its first turn says it started), one that waits
	// longer shows as running where a human would notice the wait.
	DefaultStartedAfter = 250 * time.Millisecond
	// DefaultModelOutputBytes is the most of one tool output the model is
	// given: an output stored as a blob (larger than the executor's inline
	// limit) is read back whole up to this size, else its preview is given.
	DefaultModelOutputBytes = 256 << 10

	// DefaultRunDeadline is how long a run may take from its request when
	// the request sets no deadline_s: a run still going then ends failed
	// (TIMEOUT) with what it was waiting for.
	DefaultRunDeadline = 30 * time.Minute
	// DefaultAckWait is how long a delivery may stay unacknowledged before
	// another replica gets it: what a killed replica holds up. A handler
	// that runs longer (a model call) keeps its message with the runner's
	// in-progress heartbeat, every third of it.
	DefaultAckWait = 30 * time.Second
	maxAckWait     = time.Hour
	// DefaultTimerAfter is how long a run goes before its deadline timer is
	// stored (reaper.go): most runs end sooner and store none. Its request
	// stays unacknowledged meanwhile (a crash redelivers it, which arms the
	// timer), so it also bounds how long a request is held: with the runs
	// consumer's 4,096 unacknowledged requests, a ceiling of 4,096 new runs
	// per second that all last longer, well above what one replica serves.
	DefaultTimerAfter = time.Second
	maxTimerAfter     = time.Minute
	// DefaultCancelGrace is how long a cancelled run waits for the
	// envelopes of its calls being stopped before it ends without them
	// (cancel.go).
	DefaultCancelGrace = 10 * time.Second
	maxCancelGrace     = 10 * time.Minute

	maxStartedAfter     = time.Minute
	maxRunDeadline      = envelope.MaxDeadlineS * time.Second
	maxModelOutputBytes = 8 << 20

	maxConcurrency  = 4096
	maxModelTimeout = time.Hour
	maxModelRetries = 20
)

// Config configures the orchestrator. Zero values mean the defaults.
type Config struct {
	Source            string        // CloudEvents source; default /toolwire/orchestrator
	Concurrency       int           // handlers at once per consumer; default 64
	ModelTimeout      time.Duration // bound on one model call, retries included; default 2m
	TracesURLTemplate string        // e.g. http://jaeger:16686/trace/{trace_id}; default Deps.Common's
	// OpenAI configures the "openai" adapter, served when its APIKey or
	// BaseURL is set (a local OpenAI-compatible server may need no key).
	OpenAI provider.Config
	// Anthropic configures the "anthropic" adapter, served when its APIKey
	// is set.
	Anthropic provider.Config
	// Providers adds model adapters by provider name (agent.model.provider),
	// replacing a configured one of the same name; "scripted" is always
	// served. In the Config of a Service, it holds every adapter served.
	Providers Providers
	// Prices is the model price table; default DefaultPrices.
	Prices Prices
	// StartedAfter is how long a run's first model call runs before the
	// run's started event is published (default DefaultStartedAfter;
	// negative: at once).
	StartedAfter time.Duration
	// ModelOutputBytes is the most of one tool output the model is given
	// (default DefaultModelOutputBytes).
	ModelOutputBytes int
	// AckWait is how long a delivery may stay unacknowledged before another
	// replica gets it: a live handler keeps extending it (the runner's
	// in-progress heartbeat), so it bounds only what a dead replica holds
	// up. Default DefaultAckWait; at most 30s for approvals.
	AckWait time.Duration
	// TimerAfter is how long a run goes before its deadline timer is stored
	// (default DefaultTimerAfter; negative: at once, with its first turn). A
	// run that ends sooner stores none; its request is acknowledged when
	// it ends, or when the timer is stored.
	TimerAfter time.Duration
	// RunDeadline is how long a run may take from its request when the
	// request sets no deadline_s (default DefaultRunDeadline, at most a
	// day).
	RunDeadline time.Duration
	// CancelGrace is how long a cancelled run waits for the envelopes of
	// its calls being stopped (default DefaultCancelGrace).
	CancelGrace time.Duration
	// InstanceID names this replica in its logs ("orchestrator started"); default
	// host name, process id and a random suffix.
	InstanceID string
	// Faults injects failures at named points: tests only.
	Faults Faults
}

// ConfigFromEnv reads the configuration from the environment: the
// orchestrator's own variables, the price table (EnvPrices) and the model
// providers' settings (providers.go). Unset variables keep their defaults;
// every bad value is reported at once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{Prices: DefaultPrices()}
	e := service.NewEnv(getenv)
	e.Int(EnvConcurrency, 1, maxConcurrency, &c.Concurrency)
	e.Duration(EnvModelTimeout, time.Millisecond, maxModelTimeout, &c.ModelTimeout)
	durationOrNow(e, EnvStartedAfter, maxStartedAfter, &c.StartedAfter)
	e.Int(EnvModelOutputBytes, 1, maxModelOutputBytes, &c.ModelOutputBytes)
	e.Duration(EnvRunDeadline, time.Second, maxRunDeadline, &c.RunDeadline)
	e.Duration(EnvAckWait, time.Second, maxAckWait, &c.AckWait)
	durationOrNow(e, EnvTimerAfter, maxTimerAfter, &c.TimerAfter)
	e.Duration(EnvCancelGrace, time.Second, maxCancelGrace, &c.CancelGrace)
	readPrices(e, c.Prices)
	readProviders(e, &c)
	return c, e.Err()
}

// durationOrNow reads a wait of at most hi into dst, "0" meaning at once
// (-1: zero is the default's).
func durationOrNow(e *service.Env, name string, hi time.Duration, dst *time.Duration) {
	if v, ok := e.Lookup(name); ok && v == "0" {
		*dst = -1
		return
	}
	e.Duration(name, time.Millisecond, hi, dst)
}

// EnvVars documents the variables ConfigFromEnv reads, besides the common
// ones of every service (service.CommonEnvVars).
func EnvVars() []service.Var {
	return append([]service.Var{
		{Name: EnvConcurrency, Help: "handlers each of the orchestrator's consumers runs at once per replica (default 64)", Example: "16"},
		{Name: EnvModelTimeout, Help: "bound on one model call, the adapter's retries included (default 2m)", Example: "30s"},
		{Name: EnvStartedAfter, Help: "how long a run's first model call runs before the run's started event goes out; 0: at once (default 250ms)", Example: "1s"},
		{Name: EnvModelOutputBytes, Help: "the most of one tool output the model is given; a larger output reaches it as its preview (default 262144)", Example: "65536"},
		{Name: EnvRunDeadline, Help: "how long a run may take from its request when the request sets no deadline_s; a run still going then ends failed with code TIMEOUT and what it waited for (default 30m, at most 24h)", Example: "10m"},
		{Name: EnvTimerAfter, Help: "how long a run goes before its deadline timer is stored; a run that ends sooner stores none, and its request stays unacknowledged until then; 0: at once (default 1s)", Example: "5s"},
		{Name: EnvCancelGrace, Help: "how long a cancelled run waits for the envelopes of the calls being stopped before it ends without them (default 10s)", Example: "30s"},
		{Name: EnvAckWait, Help: "how long a delivery stays with a replica that neither acknowledges nor extends it (a killed one) before another gets it; live handlers extend it (default 30s)", Example: "10s"},
		{Name: EnvPrices, Help: "model price table, JSON or the path of a JSON file: {\"model\" or \"provider/model\": {\"input_per_mtok\": n, \"output_per_mtok\": n}}, over the built-in prices",
			Example: `{"my-model": {"input_per_mtok": 1, "output_per_mtok": 2}}`},
	}, providerEnvVars()...)
}

// WithDefaults fills the zero fields with their defaults.
func (c Config) WithDefaults() Config {
	c.Source = cmp.Or(c.Source, DefaultSource)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.CancelGrace = cmp.Or(c.CancelGrace, DefaultCancelGrace)
	c.ModelTimeout = cmp.Or(c.ModelTimeout, DefaultModelTimeout)
	c.StartedAfter = cmp.Or(c.StartedAfter, DefaultStartedAfter)
	c.ModelOutputBytes = cmp.Or(c.ModelOutputBytes, DefaultModelOutputBytes)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	c.TimerAfter = cmp.Or(c.TimerAfter, DefaultTimerAfter)
	c.RunDeadline = cmp.Or(c.RunDeadline, DefaultRunDeadline)
	if c.Prices == nil {
		c.Prices = DefaultPrices()
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.InstanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Concurrency < 1 || c.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d: want 1 to %d", c.Concurrency, maxConcurrency))
	}
	if c.ModelTimeout < 0 || c.ModelTimeout > maxModelTimeout {
		errs = append(errs, fmt.Errorf("model timeout %s: want up to %s", c.ModelTimeout, maxModelTimeout))
	}
	if c.StartedAfter > maxStartedAfter {
		errs = append(errs, fmt.Errorf("started after %s: want up to %s", c.StartedAfter, maxStartedAfter))
	}
	if c.ModelOutputBytes < 0 || c.ModelOutputBytes > maxModelOutputBytes {
		errs = append(errs, fmt.Errorf("model output bytes %d: want up to %d", c.ModelOutputBytes, maxModelOutputBytes))
	}
	if c.RunDeadline < time.Second || c.RunDeadline > maxRunDeadline {
		errs = append(errs, fmt.Errorf("run deadline %s: want 1s to %s", c.RunDeadline, maxRunDeadline))
	}
	if c.AckWait < 0 {
		errs = append(errs, fmt.Errorf("ack wait %s: want a positive duration", c.AckWait))
	}
	if c.TimerAfter > maxTimerAfter {
		errs = append(errs, fmt.Errorf("timer after %s: want up to %s", c.TimerAfter, maxTimerAfter))
	}
	if err := c.Prices.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, u := range []struct{ what, url string }{{"OpenAI base URL", c.OpenAI.BaseURL}, {"Anthropic base URL", c.Anthropic.BaseURL}} {
		if err := checkBaseURL(u.url); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", u.what, u.url, err))
		}
	}
	for name, p := range c.Providers {
		if p == nil {
			errs = append(errs, fmt.Errorf("provider %q is nil", name))
		}
	}
	return errors.Join(errs...)
}

// shortAckWait is the ack wait of the consumers whose handlers never call the
// model.
func (c Config) shortAckWait() time.Duration { return min(c.AckWait, 30*time.Second) }

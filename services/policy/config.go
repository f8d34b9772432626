package policy

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/toolwire/toolwire/pkg/service"
)

// Environment variables of the policy service.
const (
	// EnvConcurrency sets Config.Concurrency.
	EnvConcurrency = "TOOLWIRE_POLICY_CONCURRENCY"
	// EnvApprovalSweep sets Config.ApprovalSweep (a Go duration).
	EnvApprovalSweep = "TOOLWIRE_APPROVAL_SWEEP"
	// EnvPreviewTimeout sets Config.PreviewTimeout (a Go duration).
	EnvPreviewTimeout = "TOOLWIRE_PREVIEW_TIMEOUT"
	// EnvQueueWait sets Config.QueueWait (a Go duration).
	EnvQueueWait = "TOOLWIRE_POLICY_QUEUE_WAIT"
)

// Defaults of Config.
const (
	DefaultSource      = "/toolwire/policy"
	DefaultConcurrency = 32
	maxConcurrency     = 4096
	// DefaultApprovalSweep is how often pending approvals are checked for
	// their deadline.
	DefaultApprovalSweep = 500 * time.Millisecond
	// DefaultPreviewTimeout bounds the wait for a tool's dry run.
	DefaultPreviewTimeout = 5 * time.Second
	minSweep              = 10 * time.Millisecond
	maxSweep              = time.Minute
	maxPreviewTimeout     = time.Minute
	// DefaultQueueWait bounds the wait for a live worker of a call's queue:
	// long enough for a worker that restarts, short beside a run's deadline.
	DefaultQueueWait = 15 * time.Second
	minQueueWait     = 10 * time.Millisecond
	maxQueueWait     = 10 * time.Minute
)

// Config configures the Policy Guard service. Zero values mean the defaults.
type Config struct {
	// Source is the CloudEvents source of the events the guard publishes.
	Source string
	// Concurrency is how many checks each of the guard's consumers handles
	// at once in this replica.
	Concurrency int
	// ApprovalSweep is how often this replica looks for pending approvals
	// past their deadline (a denial). The deadline is honoured to within it.
	ApprovalSweep time.Duration
	// PreviewTimeout bounds the wait for a tool's dry run when an approval
	// request asks for one.
	PreviewTimeout time.Duration
	// QueueWait bounds the wait for a live worker of an approved call's
	// queue (registry.Workers: the heartbeats of the processes serving
	// it). A call whose queue has none by then is answered at once with a
	// PROVIDER_ERROR envelope that names the queue, rather than left in a
	// queue nobody serves until its run's deadline. Default 15s.
	QueueWait time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Source = cmp.Or(c.Source, DefaultSource)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.ApprovalSweep = cmp.Or(c.ApprovalSweep, DefaultApprovalSweep)
	c.PreviewTimeout = cmp.Or(c.PreviewTimeout, DefaultPreviewTimeout)
	c.QueueWait = cmp.Or(c.QueueWait, DefaultQueueWait)
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Concurrency < 1 || c.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d: want 1 to %d", c.Concurrency, maxConcurrency))
	}
	if c.ApprovalSweep < minSweep || c.ApprovalSweep > maxSweep {
		errs = append(errs, fmt.Errorf("approval sweep %s: want %s to %s", c.ApprovalSweep, minSweep, maxSweep))
	}
	if c.PreviewTimeout < 0 || c.PreviewTimeout > maxPreviewTimeout {
		errs = append(errs, fmt.Errorf("preview timeout %s: want up to %s", c.PreviewTimeout, maxPreviewTimeout))
	}
	if c.QueueWait < minQueueWait || c.QueueWait > maxQueueWait {
		errs = append(errs, fmt.Errorf("queue wait %s: want %s to %s", c.QueueWait, minQueueWait, maxQueueWait))
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment; unset
// variables take their defaults. Every bad value is reported at once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	e := service.NewEnv(getenv)
	e.Int(EnvConcurrency, 1, maxConcurrency, &c.Concurrency)
	e.Duration(EnvApprovalSweep, minSweep, maxSweep, &c.ApprovalSweep)
	e.Duration(EnvPreviewTimeout, time.Millisecond, maxPreviewTimeout, &c.PreviewTimeout)
	e.Duration(EnvQueueWait, minQueueWait, maxQueueWait, &c.QueueWait)
	return c.WithDefaults(), e.Err()
}

// EnvVars documents the variables ConfigFromEnv reads, besides the common
// ones of every service (service.CommonEnvVars).
func EnvVars() []service.Var {
	return []service.Var{
		{Name: EnvConcurrency, Help: "checks each of the guard's consumers handles at once per replica (default 32)", Example: "8"},
		{Name: EnvApprovalSweep, Help: "how often pending approvals are checked for their deadline (default 500ms)", Example: "2s"},
		{Name: EnvPreviewTimeout, Help: "bound on the wait for a tool's dry run asked by an approval (default 5s)", Example: "1s"},
		{Name: EnvQueueWait, Help: "bound on the wait for a live worker of an approved call's queue; then the call fails with PROVIDER_ERROR naming the queue (default 15s)", Example: "30s"},
	}
}

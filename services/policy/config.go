package policy

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/rules"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/services/policy/pii"
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
	// EnvPII sets Config.PII.Kinds: all, none, or kinds separated by commas.
	EnvPII = "TOOLWIRE_POLICY_PII"
	// EnvPIIOrgs sets Config.PII.Orgs: ORG=KINDS;ORG=KINDS.
	EnvPIIOrgs = "TOOLWIRE_POLICY_PII_ORGS"
	// EnvGates sets Config.GateOverrides: ORG:AUTONOMY/RISK=GATE;...
	EnvGates = "TOOLWIRE_POLICY_GATES"
	// EnvPIIRegion sets Config.PII.Region.
	EnvPIIRegion = "TOOLWIRE_POLICY_PII_REGION"
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
	// PII is the personal data an approval's arguments summary strips.
	PII PIIConfig
	// GateOverrides change cells of the gate matrix for some orgs
	// (rules.ParseGateOverrides); the default matrix otherwise.
	GateOverrides []rules.GateOverride
}

// PIIConfig says which personal data (package pii) approval summaries
// strip, for every org and for some.
type PIIConfig struct {
	// Kinds are stripped for every org not in Orgs; nil means every kind,
	// an empty list none.
	Kinds []pii.Kind
	// Orgs overrides Kinds for the orgs it names (an empty list: none).
	Orgs map[string][]pii.Kind
	// Region reads phone numbers without a country code (ISO 3166-1
	// alpha-2); default US.
	Region string
}

// scanners are the scanners of c: one for every org, and one for each
// org Orgs names.
func (c PIIConfig) scanners() (def *pii.Scanner, orgs map[string]*pii.Scanner) {
	region := cmp.Or(c.Region, pii.DefaultRegion)
	def = pii.New(c.Kinds...).WithRegion(region) // nil: every kind
	orgs = map[string]*pii.Scanner{}
	for org, kinds := range c.Orgs {
		orgs[org] = pii.New(append([]pii.Kind{}, kinds...)...).WithRegion(region)
	}
	return def, orgs
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
	if v, ok := e.Lookup(EnvPII); ok {
		kinds, err := pii.ParseKinds(v)
		if err != nil {
			e.Fail(EnvPII, v, err.Error())
		}
		c.PII.Kinds = kinds
	}
	if v, ok := e.Lookup(EnvPIIOrgs); ok {
		c.PII.Orgs = map[string][]pii.Kind{}
		for part := range strings.SplitSeq(v, ";") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			org, list, found := strings.Cut(part, "=")
			org = strings.TrimSpace(org)
			kinds, err := pii.ParseKinds(list)
			switch {
			case !found || org == "":
				e.Fail(EnvPIIOrgs, v, fmt.Sprintf("%q: want ORG=KINDS, such as acme=email,phone", part))
			case err != nil:
				e.Fail(EnvPIIOrgs, v, fmt.Sprintf("%s: %v", org, err))
			default:
				c.PII.Orgs[org] = kinds
			}
		}
	}
	if v, ok := e.Lookup(EnvGates); ok {
		o, err := rules.ParseGateOverrides(v)
		if err != nil {
			e.Fail(EnvGates, v, err.Error())
		}
		c.GateOverrides = o
	}
	if v, ok := e.Lookup(EnvPIIRegion); ok {
		if len(v) != 2 || !isLetter(v[0]) || !isLetter(v[1]) {
			e.Fail(EnvPIIRegion, v, "want a two-letter region code such as GB")
		}
		c.PII.Region = strings.ToUpper(v)
	}
	return c.WithDefaults(), e.Err()
}

// EnvVars documents the variables ConfigFromEnv reads, besides the common
// ones of every service (service.CommonEnvVars).
func EnvVars() []service.Var {
	return []service.Var{
		{Name: EnvConcurrency, Help: "checks each of the guard's consumers handles at once per replica (default 32)", Example: "8"},
		{Name: EnvApprovalSweep, Help: "how often pending approvals are checked for their deadline (default 500ms)", Example: "2s"},
		{Name: EnvPreviewTimeout, Help: "bound on the wait for a tool's dry run asked by an approval (default 5s)", Example: "1s"},
		{Name: EnvPII, Help: "the personal data an approval's arguments summary strips: all (the default), none, or kinds separated by commas: email, iban, card, national_id, ip, phone",
			Example: "email,card,national_id"},
		{Name: EnvPIIOrgs, Help: "per org, what " + EnvPII + " says for the others: ORG=KINDS separated by semicolons",
			Example: "acme=email,phone;lab=none"},
		{Name: EnvGates, Help: "orgs' overrides of the gate matrix (docs/policy.md, Gates): ORG:AUTONOMY/RISK=GATE separated by semicolons, * for any autonomy or risk; gates auto, preview, confirm, deny",
			Example: "acme:*/high=confirm;acme:autonomous/critical=deny"},
		{Name: EnvPIIRegion, Help: "the region of phone numbers written without a country code, in summaries (default US)", Example: "GB"},
		{Name: EnvQueueWait, Help: "bound on the wait for a live worker of an approved call's queue; then the call fails with PROVIDER_ERROR naming the queue (default 15s)", Example: "30s"},
	}
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

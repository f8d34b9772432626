package provision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/events"
)

// The timers' stream (package timers): one message per armed timer with a
// per-message TTL on its own subject; when the TTL runs out the server stores
// a subject delete marker in its place, which fires the timer.
const (
	StreamTimers   = "TOOLWIRE_TIMERS"
	SubjectsTimers = events.Prefix + ".timer.>"
)

// KV buckets and the object stores (docs/architecture.md, State).
const (
	BucketRunState = "toolwire_run_state" // orchestrator run state, CAS on revision
	BucketTools    = "toolwire_tools"     // tool registry, name.version keys
	BucketCache    = "toolwire_cache"     // executor tool cache, per-key TTL
	BucketRate     = "toolwire_rate"      // rate-limit token buckets, CAS
	// BucketDLQAudit records every replay of a dead letter: what, why,
	// who, when (consume.ReplayDeadLetterAs).
	BucketDLQAudit = "toolwire_dlq_audit"
	BucketSecrets  = "toolwire_secrets" // sealed secrets
	// BucketSecretNames holds the keys of BucketSecrets without their
	// values: which scopes hold which secret, for readers that must know
	// that and nothing more (the recorder's tool catalog).
	BucketSecretNames = "toolwire_secret_names"
	BucketOutcomes    = "toolwire_outcomes" // outcomes of side-effecting calls
	BucketWorkers     = "toolwire_workers"  // worker heartbeats, queue.instance keys, per-key TTL
	ObjectBlobs       = "toolwire_blobs"    // oversized outputs
	// ObjectDeadLetters holds the whole of a dead letter too large for a
	// message of its own (dlq.go); nothing serves it over HTTP.
	ObjectDeadLetters = "toolwire_dead_letters"
)

// MaxWorkerValue bounds one worker heartbeat in BucketWorkers.
const MaxWorkerValue = 16 << 10

// StoreConfig sets the durability of what Provision creates.
type StoreConfig struct {
	// Replicas of every stream, bucket and store: 1 embedded, 3 on a cluster.
	Replicas int
	// MaxAge is how long events are retained: long enough for the recorder to
	// catch up after an outage. Default 7 days.
	MaxAge time.Duration
	// MaxBytes bounds each event stream's size on disk; the oldest events
	// go first past it. 0: no bound but MaxAge.
	MaxBytes int64
	// Duplicates is the window in which a re-published event id is dropped.
	// Default 10 minutes, or MaxAge when that is shorter.
	Duplicates time.Duration
	// Memory stores everything in memory instead of files (benchmarks only).
	Memory bool
	// Lower lets Provision lower the replicas or limits of what exists (an
	// operator's `toolwire provision --lower`); without it, Provision refuses
	// to, with a *LoweringError, and changes nothing.
	Lower bool
}

func (c StoreConfig) withDefaults() StoreConfig {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 7 * 24 * time.Hour
	}
	if c.Duplicates <= 0 {
		// JetStream refuses a duplicate window longer than the max age.
		c.Duplicates = min(10*time.Minute, c.MaxAge)
	}
	return c
}

// Validate checks the configuration.
func (c StoreConfig) Validate() error {
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("replicas %d: must be between 1 and 5", c.Replicas)
	}
	if c.MaxBytes < 0 {
		return fmt.Errorf("max bytes %d: must not be negative (0: no bound)", c.MaxBytes)
	}
	if d := c.withDefaults(); d.Duplicates > d.MaxAge {
		return fmt.Errorf("duplicate window %s must not exceed max age %s", d.Duplicates, d.MaxAge)
	}
	return nil
}

// maxBytes is MaxBytes as JetStream takes it (-1: no bound).
func (c StoreConfig) maxBytes() int64 {
	if c.MaxBytes == 0 {
		return -1
	}
	return c.MaxBytes
}

func (c StoreConfig) storage() jetstream.StorageType {
	if c.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// StreamConfigs returns the configurations of toolwire's streams.
func (c StoreConfig) StreamConfigs() []jetstream.StreamConfig {
	c = c.withDefaults()
	mk := func(name, subj, desc string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:        name,
			Description: desc,
			Subjects:    []string{subj},
			Retention:   jetstream.LimitsPolicy,
			Storage:     c.storage(),
			Replicas:    c.Replicas,
			MaxAge:      c.MaxAge,
			Duplicates:  c.Duplicates,
			MaxBytes:    c.maxBytes(),
			Discard:     jetstream.DiscardOld,
			// A run's own events are read back by subject (its request,
			// turns and envelopes, to rebuild the conversation): a direct
			// get costs the server a lookup, where the API's message get
			// costs JSON and base64 both ways. On a cluster a follower may
			// answer and lag its leader by a moment; every such read
			// tolerates it (a missing event is retried, a duplicate
			// publish is dropped by its id).
			AllowDirect: true,
		}
	}
	// The timers (timers.go): one message per armed timer, with its own
	// TTL; the server leaves a marker in its place when it runs out, kept
	// as long as events are (a marker not yet handled survives an outage
	// of every consumer); a handled one is deleted.
	timers := mk(StreamTimers, SubjectsTimers, "toolwire timers: run deadlines (per-message TTL; a marker when one fires)")
	timers.AllowDirect = false
	timers.MaxMsgsPerSubject = 1
	timers.AllowMsgTTL = true
	timers.AllowRollup = true
	timers.SubjectDeleteMarkerTTL = c.MaxAge
	// The intake (intake.go): a work queue, each request gone once the
	// orchestrator has handed it over; read by nothing else.
	intake := mk(events.StreamIntake, events.SubjectsIntake, "toolwire intake: run requests of producers limited to one tenant")
	intake.Retention = jetstream.WorkQueuePolicy
	intake.AllowDirect = false
	return []jetstream.StreamConfig{
		mk(events.StreamRuns, events.SubjectsRuns, "toolwire run events: requests, model turns, lifecycle"),
		mk(events.StreamCalls, events.SubjectsCalls, "toolwire tool call events: approved calls, approvals, starts, envelopes"),
		mk(events.StreamSandbox, events.SubjectsSandbox, "toolwire sandbox jobs and results"),
		mk(events.StreamDLQ, events.SubjectsDLQ, "toolwire dead letters: events that failed every delivery"),
		timers,
		intake,
	}
}

// KVConfigs returns the configurations of toolwire's KV buckets.
func (c StoreConfig) KVConfigs() []jetstream.KeyValueConfig {
	c = c.withDefaults()
	mk := func(bucket, desc string, history uint8) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{
			Bucket: bucket, Description: desc, History: history,
			Storage: c.storage(), Replicas: c.Replicas,
		}
	}
	runs := mk(BucketRunState, "toolwire run state (orchestrator)", 1)
	runs.TTL = c.MaxAge
	// Each version keeps its last 64 revisions (the most a KV bucket keeps:
	// jetstream.KeyValueMaxHistory): the registry page's record of who
	// changed it and when (registry.History).
	tools := mk(BucketTools, "toolwire tool registry: name.version -> definition and state", jetstream.KeyValueMaxHistory)
	cache := mk(BucketCache, "toolwire tool cache, tenant scoped", 1)
	cache.LimitMarkerTTL = time.Minute // enables per-key TTL
	rate := mk(BucketRate, "toolwire rate-limit buckets", 1)
	rate.TTL = 24 * time.Hour
	secrets := mk(BucketSecrets, "toolwire sealed secrets", 3)
	secretNames := mk(BucketSecretNames, "toolwire secret names: the keys of toolwire_secrets, never a value", 1)
	outcomes := mk(BucketOutcomes, "toolwire outcomes of side-effecting calls", 1)
	outcomes.TTL = c.MaxAge
	approvals := mk(events.BucketApprovals, "toolwire tool call approvals: run.call -> pending or decided", 1)
	approvals.TTL = c.MaxAge
	// One key per serving worker and queue, each beat carrying its own TTL
	// (registry.Beat): a worker that dies is gone within its TTL. The bucket
	// stays small whatever happens: one value per key, each at most
	// MaxWorkerValue, none older than an hour.
	workers := mk(BucketWorkers, "toolwire worker heartbeats: queue.instance -> the live worker", 1)
	workers.LimitMarkerTTL = time.Minute // enables per-key TTL
	workers.TTL = time.Hour
	workers.MaxValueSize = MaxWorkerValue
	audit := mk(BucketDLQAudit, "toolwire replays of dead letters: what, why, who, when", 1)
	return []jetstream.KeyValueConfig{runs, tools, cache, rate, secrets, secretNames, outcomes, approvals, workers, audit}
}

// ObjectConfigs returns the configurations of toolwire's object stores.
func (c StoreConfig) ObjectConfigs() []jetstream.ObjectStoreConfig {
	c = c.withDefaults()
	return []jetstream.ObjectStoreConfig{
		{Bucket: ObjectBlobs, Description: "toolwire oversized tool outputs", Storage: c.storage(), Replicas: c.Replicas, TTL: c.MaxAge},
		{Bucket: ObjectDeadLetters, Description: "toolwire dead letters too large for a message", Storage: c.storage(), Replicas: c.Replicas},
	}
}

// Provision creates what is missing of every stream, KV bucket and object
// store, and raises what exists to cfg. It never lowers the replicas or
// limits of what exists behind an operator's back: when cfg would, it
// changes nothing and returns a *LoweringError naming every store and
// setting (unless cfg.Lower). It first checks that the server is recent
// enough (MinServerVersion). It is idempotent: services call it at start,
// in any number, in any order; what is already as wanted is left alone.
func Provision(ctx context.Context, js jetstream.JetStream, c StoreConfig) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("provision: %w: %w", errBadStoreConfig, err)
	}
	if nc := js.Conn(); nc != nil {
		if err := CheckServerVersion(nc.ConnectedServerVersion()); err != nil {
			return fmt.Errorf("provision: %w", err)
		}
	}
	c = c.withDefaults()
	plan, err := planStores(ctx, js, c)
	if err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	if !c.Lower {
		lowered := &LoweringError{Stores: map[string][]string{}}
		for _, p := range plan {
			if len(p.lowers) > 0 {
				lowered.Stores[p.stream] = p.lowers
			}
		}
		if len(lowered.Stores) > 0 {
			return fmt.Errorf("provision: %w", lowered)
		}
	}
	for _, p := range plan {
		if p.apply == nil {
			continue // as wanted already
		}
		if err := p.apply(ctx, js); err != nil {
			return fmt.Errorf("provision %s: %w", p.stream, err)
		}
	}
	return nil
}

// MinServerVersion is the oldest nats-server toolwire runs on: 2.11 brought
// the per-message TTLs the cache bucket uses.
const MinServerVersion = "2.11.0"

// ErrServerTooOld is wrapped when the server is older than MinServerVersion.
var ErrServerTooOld = errors.New("nats-server too old")

// CheckServerVersion checks a server version ("2.11.4", "v2.12.0-RC.1")
// against MinServerVersion.
func CheckServerVersion(v string) error {
	major, minor, ok := majorMinor(v)
	wantMajor, wantMinor, _ := majorMinor(MinServerVersion)
	switch {
	case !ok:
		return fmt.Errorf("%w: cannot read the server's version %q: toolwire needs nats-server %s or newer", ErrServerTooOld, v, MinServerVersion)
	case major < wantMajor || major == wantMajor && minor < wantMinor:
		return fmt.Errorf("%w: the server is nats-server %s; toolwire needs %s or newer (per-message TTLs and their markers, for the tool cache and the runs' deadlines)", ErrServerTooOld, v, MinServerVersion)
	}
	return nil
}

func majorMinor(v string) (int, int, bool) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.SplitN(parts[1], "-", 2)[0])
	return major, minor, err1 == nil && err2 == nil
}

// errBadStoreConfig is wrapped when the StoreConfig itself is wrong.
var errBadStoreConfig = errors.New("bad store configuration")

// ErrWouldLower is wrapped by a *LoweringError.
var ErrWouldLower = errors.New("provisioning would lower what exists")

// LoweringError says which settings of existing streams (or of the streams
// under KV buckets and object stores) provisioning would have lowered.
type LoweringError struct {
	// Stores maps a stream (TOOLWIRE_RUNS, KV_toolwire_cache,
	// OBJ_toolwire_blobs) to its settings that would go down ("replicas 3 ->
	// 1", "max age 720h0m0s -> 168h0m0s").
	Stores map[string][]string
}

func (e *LoweringError) Error() string {
	names := slices.Sorted(maps.Keys(e.Stores))
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + " (" + strings.Join(e.Stores[n], ", ") + ")"
	}
	return "provisioning never lowers the replicas or limits of what exists, and would have: " + strings.Join(parts, "; ") +
		"; start with settings at least these (TOOLWIRE_STREAM_REPLICAS, TOOLWIRE_STREAM_MAX_AGE, TOOLWIRE_STREAM_MAX_BYTES), " +
		"or lower them on purpose with `toolwire provision --lower`"
}

func (e *LoweringError) Unwrap() error { return ErrWouldLower }

// planned is what Provision does to one store.
type planned struct {
	stream string   // the underlying stream's name
	lowers []string // the settings it would lower
	apply  func(ctx context.Context, js jetstream.JetStream) error
}

// limits are the settings provisioning never lowers.
type limits struct {
	replicas int
	maxAge   time.Duration // 0: none
	maxBytes int64         // -1: none
}

func limitsOf(c jetstream.StreamConfig) limits {
	b := c.MaxBytes
	if b <= 0 {
		b = -1
	}
	return limits{replicas: max(c.Replicas, 1), maxAge: c.MaxAge, maxBytes: b}
}

// lowering lists what going from have to want lowers.
func lowering(have, want limits) []string {
	var out []string
	if want.replicas < have.replicas {
		out = append(out, fmt.Sprintf("replicas %d -> %d", have.replicas, want.replicas))
	}
	if want.maxAge > 0 && (have.maxAge == 0 || want.maxAge < have.maxAge) {
		out = append(out, fmt.Sprintf("max age %s -> %s", ageText(have.maxAge), ageText(want.maxAge)))
	}
	if want.maxBytes > 0 && (have.maxBytes < 0 || want.maxBytes < have.maxBytes) {
		out = append(out, fmt.Sprintf("max bytes %s -> %d", bytesText(have.maxBytes), want.maxBytes))
	}
	return out
}

func ageText(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.String()
}

func bytesText(b int64) string {
	if b < 0 {
		return "none"
	}
	return strconv.FormatInt(b, 10)
}

// existing returns a stream's configuration, or nil when it does not exist.
func existing(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamConfig, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	return &cfg, nil
}

// planStores reads what exists and plans every store.
func planStores(ctx context.Context, js jetstream.JetStream, c StoreConfig) ([]planned, error) {
	var plan []planned
	for _, want := range c.StreamConfigs() {
		have, err := existing(ctx, js, want.Name)
		if err != nil {
			return nil, err
		}
		p := planned{stream: want.Name}
		switch {
		case have == nil:
			p.apply = func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateStream(ctx, want)
				return err
			}
		default:
			p.lowers = lowering(limitsOf(*have), limitsOf(want))
			if next, changed := mergeStream(*have, want, c.Lower); changed {
				p.apply = func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.UpdateStream(ctx, next)
					return err
				}
			}
		}
		plan = append(plan, p)
	}
	for _, want := range c.KVConfigs() {
		have, err := existing(ctx, js, "KV_"+want.Bucket)
		if err != nil {
			return nil, err
		}
		p := planned{stream: "KV_" + want.Bucket}
		wantLimits := limits{replicas: want.Replicas, maxAge: want.TTL, maxBytes: -1}
		switch {
		case have == nil:
			p.apply = func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateKeyValue(ctx, want)
				return err
			}
		default:
			haveLimits := limitsOf(*have)
			p.lowers = lowering(haveLimits, wantLimits)
			if have.Replicas != want.Replicas || have.MaxAge != want.TTL || have.MaxMsgsPerSubject != int64(want.History) ||
				have.Description != want.Description || have.SubjectDeleteMarkerTTL != want.LimitMarkerTTL {
				next := raiseKV(want, haveLimits, int64(have.MaxMsgsPerSubject), c.Lower)
				p.apply = func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.UpdateKeyValue(ctx, next)
					return err
				}
			}
		}
		plan = append(plan, p)
	}
	for _, want := range c.ObjectConfigs() {
		have, err := existing(ctx, js, "OBJ_"+want.Bucket)
		if err != nil {
			return nil, err
		}
		p := planned{stream: "OBJ_" + want.Bucket}
		wantLimits := limits{replicas: want.Replicas, maxAge: want.TTL, maxBytes: -1}
		switch {
		case have == nil:
			p.apply = func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateObjectStore(ctx, want)
				return err
			}
		default:
			haveLimits := limitsOf(*have)
			p.lowers = lowering(haveLimits, wantLimits)
			if have.Replicas != want.Replicas || have.MaxAge != want.TTL || have.Description != want.Description {
				next := want
				if !c.Lower {
					next.Replicas = max(want.Replicas, haveLimits.replicas)
					next.TTL = longerAge(want.TTL, haveLimits.maxAge)
				}
				p.apply = func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.UpdateObjectStore(ctx, next)
					return err
				}
			}
		}
		plan = append(plan, p)
	}
	return plan, nil
}

// mergeStream is have with toolwire's settings of want: its subjects,
// description, storage-independent limits (raised, unless lower), duplicate
// window and direct gets; an operator's other settings (placement, sources,
// metadata) stay. changed reports whether it differs from have.
func mergeStream(have, want jetstream.StreamConfig, lower bool) (jetstream.StreamConfig, bool) {
	next := have
	next.Subjects, next.Description, next.Duplicates, next.AllowDirect, next.Discard =
		want.Subjects, want.Description, want.Duplicates, want.AllowDirect, want.Discard
	next.Replicas, next.MaxAge, next.MaxBytes = want.Replicas, want.MaxAge, want.MaxBytes
	if !lower {
		h := limitsOf(have)
		next.Replicas = max(want.Replicas, h.replicas)
		next.MaxAge = longerAge(want.MaxAge, h.maxAge)
		if h.maxBytes < 0 || (want.MaxBytes > 0 && h.maxBytes > want.MaxBytes) {
			next.MaxBytes = h.maxBytes
		}
	}
	if next.Duplicates > next.MaxAge && next.MaxAge > 0 {
		next.Duplicates = next.MaxAge
	}
	changed := !slices.Equal(next.Subjects, have.Subjects) || next.Description != have.Description ||
		next.Duplicates != have.Duplicates || next.AllowDirect != have.AllowDirect || next.Discard != have.Discard ||
		next.Replicas != have.Replicas || next.MaxAge != have.MaxAge || next.MaxBytes != have.MaxBytes
	return next, changed
}

// raiseKV is want with what exists kept where want would lower it (unless
// lower).
func raiseKV(want jetstream.KeyValueConfig, have limits, history int64, lower bool) jetstream.KeyValueConfig {
	if lower {
		return want
	}
	want.Replicas = max(want.Replicas, have.replicas)
	want.TTL = longerAge(want.TTL, have.maxAge)
	if history > int64(want.History) && history <= 64 {
		want.History = uint8(history)
	}
	return want
}

// longerAge is the longer of two retentions, 0 being none (the longest).
func longerAge(a, b time.Duration) time.Duration {
	if a == 0 || b == 0 {
		return 0
	}
	return max(a, b)
}

// provisionAttempt bounds one attempt of ProvisionRetrying.
const provisionAttempt = 5 * time.Second

// ProvisionRetrying is Provision retried, with back-off, while the servers
// are not ready for it (a cluster still forming, JetStream not yet
// available, a leader being elected): until it succeeds, fails for good (a
// lowering, a server too old, a bad configuration), or ctx ends. onRetry,
// when set, hears of each failed attempt.
func ProvisionRetrying(ctx context.Context, js jetstream.JetStream, c StoreConfig, onRetry func(attempt int, err error)) error {
	delay := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		// Each attempt has a bound of its own: a request to a JetStream
		// without a leader waits for no answer.
		actx, cancel := context.WithTimeout(ctx, provisionAttempt)
		err := Provision(actx, js, c)
		cancel()
		if err == nil || errors.Is(err, ErrWouldLower) || errors.Is(err, ErrServerTooOld) || errors.Is(err, errBadStoreConfig) {
			return err
		}
		if onRetry != nil {
			onRetry(attempt, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up after %d attempts: %w)", err, attempt, context.Cause(ctx))
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// ConsumerSpec describes a durable pull consumer of one stream.
type ConsumerSpec struct {
	Stream  string
	Durable string
	Filters []string
	// MaxDeliver bounds the deliveries of one message that its runner hands
	// to the handler; after the last failure it is moved to the dead-letter
	// stream. Default 8. The server's own bound is off (-1): a message whose
	// dead-lettering failed is delivered again until it is dead-lettered,
	// never dropped when a count runs out.
	MaxDeliver int
	// AckWait is how long a delivery may stay unacknowledged. Default 30s.
	AckWait time.Duration
	// MaxAckPending bounds messages in flight across all replicas. Default 1024.
	MaxAckPending int
	// DeliverNew starts a new consumer at the end of the stream rather than at
	// its beginning.
	DeliverNew bool
}

func (s ConsumerSpec) config() jetstream.ConsumerConfig {
	if s.AckWait <= 0 {
		s.AckWait = 30 * time.Second
	}
	if s.MaxAckPending <= 0 {
		s.MaxAckPending = 1024
	}
	cfg := jetstream.ConsumerConfig{
		Durable:        s.Durable,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        s.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  s.MaxAckPending,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		FilterSubjects: s.Filters,
	}
	if s.DeliverNew {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	if len(s.Filters) == 1 {
		cfg.FilterSubject, cfg.FilterSubjects = s.Filters[0], nil
	}
	return cfg
}

// EnsureConsumer creates or updates the durable consumer.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, s ConsumerSpec) (jetstream.Consumer, error) {
	c, err := js.CreateOrUpdateConsumer(ctx, s.Stream, s.config())
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", s.Durable, s.Stream, err)
	}
	return c, nil
}

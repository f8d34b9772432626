package events

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KV buckets and the object store (DESIGN.md, "State").
const (
	BucketRunState = "toolwire_run_state" // orchestrator run state, CAS on revision
	BucketTools    = "toolwire_tools"     // tool registry, name.version keys
	BucketCache    = "toolwire_cache"     // executor tool cache, per-key TTL
	BucketRate     = "toolwire_rate"      // rate-limit token buckets, CAS
	BucketSecrets  = "toolwire_secrets"   // sealed secrets
	BucketOutcomes = "toolwire_outcomes"  // outcomes of side-effecting calls
	ObjectBlobs    = "toolwire_blobs"     // oversized outputs
	// ObjectDeadLetters holds the whole of a dead letter too large for a
	// message of its own (dlq.go); nothing serves it over HTTP.
	ObjectDeadLetters = "toolwire_dead_letters"
)

// StoreConfig sets the durability of what Provision creates.
type StoreConfig struct {
	// Replicas of every stream, bucket and store: 1 embedded, 3 on a cluster.
	Replicas int
	// MaxAge is how long events are retained: long enough for the recorder to
	// catch up after an outage. Default 7 days.
	MaxAge time.Duration
	// Duplicates is the window in which a re-published event id is dropped.
	// Default 10 minutes, or MaxAge when that is shorter.
	Duplicates time.Duration
	// Memory stores everything in memory instead of files (benchmarks only).
	Memory bool
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
	if d := c.withDefaults(); d.Duplicates > d.MaxAge {
		return fmt.Errorf("duplicate window %s must not exceed max age %s", d.Duplicates, d.MaxAge)
	}
	return nil
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
	return []jetstream.StreamConfig{
		mk(StreamRuns, SubjectsRuns, "toolwire run events: requests, model turns, lifecycle"),
		mk(StreamCalls, SubjectsCalls, "toolwire tool call events: approved calls, approvals, starts, envelopes"),
		mk(StreamSandbox, SubjectsSandbox, "toolwire sandbox jobs and results"),
		mk(StreamDLQ, SubjectsDLQ, "toolwire dead letters: events that failed every delivery"),
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
	tools := mk(BucketTools, "toolwire tool registry: name.version -> definition and state", 5)
	cache := mk(BucketCache, "toolwire tool cache, tenant scoped", 1)
	cache.LimitMarkerTTL = time.Minute // enables per-key TTL
	rate := mk(BucketRate, "toolwire rate-limit buckets", 1)
	rate.TTL = 24 * time.Hour
	secrets := mk(BucketSecrets, "toolwire sealed secrets", 3)
	outcomes := mk(BucketOutcomes, "toolwire outcomes of side-effecting calls", 1)
	outcomes.TTL = c.MaxAge
	approvals := mk(BucketApprovals, "toolwire tool call approvals: run.call -> pending or decided", 1)
	approvals.TTL = c.MaxAge
	return []jetstream.KeyValueConfig{runs, tools, cache, rate, secrets, outcomes, approvals}
}

// Provision creates or updates every stream, KV bucket and the object store.
// It is idempotent: services call it at start, in any number, in any order.
func Provision(ctx context.Context, js jetstream.JetStream, c StoreConfig) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	for _, sc := range c.StreamConfigs() {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
	}
	for _, kc := range c.KVConfigs() {
		if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
			return fmt.Errorf("provision kv %s: %w", kc.Bucket, err)
		}
	}
	c = c.withDefaults()
	if _, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: ObjectBlobs, Description: "toolwire oversized tool outputs",
		Storage: c.storage(), Replicas: c.Replicas, TTL: c.MaxAge,
	}); err != nil {
		return fmt.Errorf("provision object store %s: %w", ObjectBlobs, err)
	}
	if _, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: ObjectDeadLetters, Description: "toolwire dead letters too large for a message",
		Storage: c.storage(), Replicas: c.Replicas,
	}); err != nil {
		return fmt.Errorf("provision object store %s: %w", ObjectDeadLetters, err)
	}
	return nil
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

package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
)

// toolCache is the executor's result cache (docs/tools.md, Cache): envelopes
// of successful calls in the KV bucket toolwire_cache, keyed by
// envelope.CacheKey (the tenant, name@version and the canonical input), each
// with its own time to live.
type toolCache struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
}

// cacheTTL says whether calls of def are cached and for how long: ok false
// for tools with side effects writes or cache none; ttl 0 for forever.
func cacheTTL(def *envelope.ToolDefinition) (ttl time.Duration, ok bool) {
	if def.Metadata.SideEffects.Rank() < 0 || def.Metadata.SideEffects == envelope.SideEffectsWrites {
		return 0, false
	}
	switch def.Metadata.Cache {
	case envelope.CacheTTL:
		if def.Metadata.CacheTTLS <= 0 {
			return 0, false
		}
		return time.Duration(def.Metadata.CacheTTLS) * time.Second, true
	case envelope.CacheForever:
		return 0, true
	}
	return 0, false
}

// get returns the cached envelope under key. A cached envelope whose blob is
// gone (the object store keeps blobs for the stream's max age; a forever
// entry can outlive them) is a miss.
func (c *toolCache) get(ctx context.Context, key string) (*envelope.ToolEnvelope, error) {
	e, err := c.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cache get: %w", err)
	}
	var env envelope.ToolEnvelope
	if err := json.Unmarshal(e.Value(), &env); err != nil {
		return nil, fmt.Errorf("cache entry %s: %w", key, err)
	}
	if env.Error != nil {
		return nil, fmt.Errorf("cache entry %s holds a failed call", key)
	}
	for _, a := range env.Attachments {
		if a.Kind != envelope.AttachmentBlob || len(a.URL) <= len(blobs.URLPrefix) {
			continue
		}
		ok, err := blobs.Exists(ctx, c.js, a.URL[len(blobs.URLPrefix):])
		if err != nil {
			return nil, fmt.Errorf("cache entry %s: %w", key, err)
		}
		if !ok {
			return nil, nil
		}
	}
	return &env, nil
}

// put stores a successful envelope under key for ttl (0: forever). A ttl
// entry stored meanwhile by another replica is kept (both are the same call's
// result; it expires on its own); a forever entry is replaced, since the one
// there may point at a blob that is gone.
func (c *toolCache) put(ctx context.Context, key string, env *envelope.ToolEnvelope, ttl time.Duration) error {
	b, err := json.Marshal(env)
	if err != nil {
		return fmt.Errorf("cache put: %w", err)
	}
	var opts []jetstream.KVCreateOpt
	if ttl > 0 {
		opts = append(opts, jetstream.KeyTTL(ttl))
	}
	_, err = c.kv.Create(ctx, key, b, opts...)
	if errors.Is(err, jetstream.ErrKeyExists) && ttl == 0 {
		_, err = c.kv.Put(ctx, key, b)
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("cache put: %w", err)
	}
	return nil
}

// cacheHit turns a cached envelope into the envelope of this call: its own
// call id, input and times, and cached true.
func cacheHit(cached *envelope.ToolEnvelope, base *envelope.ToolEnvelope, tEnd time.Time) envelope.ToolEnvelope {
	env := *cached
	env.CallID = base.CallID
	env.Name, env.Version = base.Name, base.Version
	env.Input = base.Input
	env.TStart, env.TEnd = base.TStart, tEnd
	env.Cached = true
	return env
}

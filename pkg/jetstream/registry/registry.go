// Package registry is the tool registry: tool definitions keyed by
// name@version with a lifecycle state, kept in a JetStream KV bucket that every
// service reads and watches.
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/kvwatch"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// State is a tool version's lifecycle state (docs/policy.md, Registry):
// envelope.ToolState, which the Policy Guard's rules judge.
type State = envelope.ToolState

// Lifecycle states.
const (
	StateActive     = envelope.ToolActive     // discoverable and executable
	StateDeprecated = envelope.ToolDeprecated // hidden by default, warned about, still executable
	StateBlocked    = envelope.ToolBlocked    // refused at run time with POLICY_DENIED
	StateDraft      = envelope.ToolDraft      // registered for review: admins only, refused at run time until published
)

// Entry is one registry entry.
type Entry struct {
	Definition envelope.ToolDefinition `json:"definition"`
	State      State                   `json:"state"`
	UpdatedAt  time.Time               `json:"updated_at"`
	// UpdatedBy names who made the last change (an admin's token or
	// login through the recorder, the CLI's operator); empty when unknown
	// (a service registering its own tools).
	UpdatedBy string `json:"updated_by,omitempty"`
}

// ErrNotFound is returned for a tool version the registry does not hold.
var ErrNotFound = errors.New("tool not registered")

// Key is the KV key of a tool version: "name.version" (KV keys cannot hold '@';
// names hold no '.', so the split is unambiguous).
func Key(ref envelope.ToolRef) string { return ref.Name + "." + ref.Version }

// Registry reads and writes the registry bucket.
type Registry struct {
	kv jetstream.KeyValue
}

// Open opens the registry bucket (provisioned by events.Provision).
func Open(ctx context.Context, js jetstream.JetStream) (*Registry, error) {
	kv, err := js.KeyValue(ctx, provision.BucketTools)
	if err != nil {
		return nil, fmt.Errorf("open tool registry: %w", err)
	}
	return &Registry{kv: kv}, nil
}

// Put validates and stores an entry. A zero state means active.
func (r *Registry) Put(ctx context.Context, e Entry) error {
	if err := e.Definition.Validate(); err != nil {
		return err
	}
	if e.State == "" {
		e.State = StateActive
	}
	if !e.State.Valid() {
		return fmt.Errorf("%w: state %q is not one of active, deprecated, blocked", envelope.ErrInvalidTool, e.State)
	}
	if e.UpdatedAt.IsZero() {
		e.UpdatedAt = time.Now().UTC()
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(ctx, Key(e.Definition.Ref()), b); err != nil {
		return fmt.Errorf("register %s: %w", e.Definition.Ref(), err)
	}
	return nil
}

// Ensure stores the entry unless the registry already holds the same
// definition (any state): services call it at start to publish their built-in
// tools without overwriting an operator's state change.
func (r *Registry) Ensure(ctx context.Context, def envelope.ToolDefinition) error {
	return r.EnsureAs(ctx, def, "")
}

// EnsureAs is Ensure recording by (who wrote it) in the entry it writes.
func (r *Registry) EnsureAs(ctx context.Context, def envelope.ToolDefinition, by string) error {
	cur, err := r.Get(ctx, def.Ref())
	switch {
	case errors.Is(err, ErrNotFound):
		return r.Put(ctx, Entry{Definition: def, UpdatedBy: by})
	case err != nil:
		return err
	}
	a, _ := json.Marshal(cur.Definition)
	b, _ := json.Marshal(def)
	if bytes.Equal(a, b) {
		return nil
	}
	cur.Definition = def
	cur.UpdatedAt, cur.UpdatedBy = time.Time{}, by
	return r.Put(ctx, cur)
}

// Get returns the entry of ref.
func (r *Registry) Get(ctx context.Context, ref envelope.ToolRef) (Entry, error) {
	kve, err := r.kv.Get(ctx, Key(ref))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Entry{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("registry get %s: %w", ref, err)
	}
	return decode(kve.Value())
}

// SetState changes the state of a registered version.
func (r *Registry) SetState(ctx context.Context, ref envelope.ToolRef, s State) error {
	return r.SetStateAs(ctx, ref, s, "")
}

// SetStateAs changes the state of a registered version, by who.
func (r *Registry) SetStateAs(ctx context.Context, ref envelope.ToolRef, s State, by string) error {
	e, err := r.Get(ctx, ref)
	if err != nil {
		return err
	}
	if s == StateDraft && e.State != StateDraft {
		// A version that may have run is never a draft again: a draft's
		// definition may still change.
		return fmt.Errorf("%w: %s is %s: a version that was published never becomes a draft again", envelope.ErrInvalidTool, ref, e.State)
	}
	e.State, e.UpdatedAt, e.UpdatedBy = s, time.Time{}, by
	return r.Put(ctx, e)
}

// History returns the entry of ref as each of its last changes left it
// (the bucket keeps a few), oldest first.
func (r *Registry) History(ctx context.Context, ref envelope.ToolRef) ([]Entry, error) {
	kves, err := r.kv.History(ctx, Key(ref))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	if err != nil {
		return nil, fmt.Errorf("registry history %s: %w", ref, err)
	}
	out := make([]Entry, 0, len(kves))
	for _, kve := range kves {
		if kve.Operation() != jetstream.KeyValuePut {
			continue
		}
		e, err := decode(kve.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// List returns every entry, sorted by name then version.
func (r *Registry) List(ctx context.Context) ([]Entry, error) {
	lister, err := r.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("registry list: %w", err)
	}
	var out []Entry
	for k := range lister.Keys() {
		kve, err := r.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("registry get %s: %w", k, err)
		}
		e, err := decode(kve.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sortEntries(out)
	return out, nil
}

func sortEntries(es []Entry) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].Definition.Name != es[j].Definition.Name {
			return es[i].Definition.Name < es[j].Definition.Name
		}
		return es[i].Definition.Version < es[j].Definition.Version
	})
}

func decode(b []byte) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, fmt.Errorf("registry entry: %w", err)
	}
	return e, nil
}

// Catalog is an in-memory copy of the registry kept current by a KV watch:
// services look tools up without a round trip, and see a state change as soon
// as it is written.
type Catalog struct {
	mu      sync.RWMutex
	entries map[string]Entry
	watch   *kvwatch.KVWatch
}

// Watch starts a catalog and waits until it holds the registry's current
// contents. ctx bounds that wait only: the catalog follows the registry until
// Stop.
func (r *Registry) Watch(ctx context.Context) (*Catalog, error) {
	c := &Catalog{entries: map[string]Entry{}}
	w, err := kvwatch.WatchKV(ctx, r.kv, true, c.apply)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	c.watch = w
	return c, nil
}

func (c *Catalog) apply(kve jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if kve.Operation() != jetstream.KeyValuePut {
		delete(c.entries, kve.Key())
	} else if e, err := decode(kve.Value()); err == nil {
		c.entries[kve.Key()] = e
	}
}

// Lookup returns the entry of ref.
func (c *Catalog) Lookup(ref envelope.ToolRef) (Entry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.entries[Key(ref)]
	return e, ok
}

// Resolve finds ref in the catalog, or in the registry r itself when the
// catalog's watch has not delivered it yet (a tool registered a moment ago is
// not unknown). ok is false when neither has it; err only when the registry
// cannot be read.
func (c *Catalog) Resolve(ctx context.Context, r *Registry, ref envelope.ToolRef) (e Entry, ok bool, err error) {
	if e, ok := c.Lookup(ref); ok {
		return e, true, nil
	}
	e, err = r.Get(ctx, ref)
	switch {
	case err == nil:
		return e, true, nil
	case errors.Is(err, ErrNotFound):
		return Entry{}, false, nil
	}
	return Entry{}, false, fmt.Errorf("look up tool %s: %w", ref, err)
}

// Entries returns every entry, sorted.
func (c *Catalog) Entries() []Entry {
	c.mu.RLock()
	out := make([]Entry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e)
	}
	c.mu.RUnlock()
	sortEntries(out)
	return out
}

// Stop ends the watch and waits for its goroutine. It is idempotent; the
// catalog stays readable, frozen.
func (c *Catalog) Stop() { c.watch.Stop() }

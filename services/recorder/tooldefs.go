package recorder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// The replay bundle holds the tool definitions as the model was offered them.
// A model turn (its turn event) names them (name@version) but does not carry
// them; the recorder reads them from the tool registry when it records the
// turn, choosing the revision that was current when the model was called: the
// watched catalog's entry when it is older than the turn, otherwise the
// newest older revision in the registry bucket's history (it keeps five per
// tool), otherwise the current entry. An outage of the recorder longer than
// five registry changes of one tool version can therefore record a newer
// definition than the one called; the orchestrator does not change
// definitions under a running turn, so within a run this is exact.

// toolResolver finds tool definitions for a turn. Declared where used; the
// registry one is below.
type toolResolver interface {
	definitions(ctx context.Context, refs []envelope.ToolRef, at time.Time) []store.ToolDefRow
	stop()
}

type registryResolver struct {
	catalog *registry.Catalog
	kv      jetstream.KeyValue
	log     *slog.Logger
}

// newRegistryResolver watches the registry. Without a registry bucket (a
// NATS that toolwire did not provision) it returns an error: the recorder
// then records turns without definitions.
func newRegistryResolver(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*registryResolver, error) {
	kv, err := js.KeyValue(ctx, provision.BucketTools)
	if err != nil {
		return nil, fmt.Errorf("open tool registry: %w", err)
	}
	reg, err := registry.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	cat, err := reg.Watch(ctx)
	if err != nil {
		return nil, err
	}
	return &registryResolver{catalog: cat, kv: kv, log: log}, nil
}

func (r *registryResolver) stop() { r.catalog.Stop() }

func (r *registryResolver) definitions(ctx context.Context, refs []envelope.ToolRef, at time.Time) []store.ToolDefRow {
	out := make([]store.ToolDefRow, 0, len(refs))
	for _, ref := range refs {
		def, ok := r.definition(ctx, ref, at)
		if !ok {
			continue
		}
		b, err := json.Marshal(def)
		if err != nil {
			continue
		}
		out = append(out, store.ToolDefRow{Name: ref.Name, Version: ref.Version, Definition: b})
	}
	return out
}

func (r *registryResolver) definition(ctx context.Context, ref envelope.ToolRef, at time.Time) (envelope.ToolDefinition, bool) {
	cur, ok := r.catalog.Lookup(ref)
	if ok && (at.IsZero() || !cur.UpdatedAt.After(at)) {
		return cur.Definition, true
	}
	hist, err := r.kv.History(ctx, registry.Key(ref))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		r.log.Warn("tool registry history", "tool", ref.String(), "err", err)
	}
	var best *registry.Entry
	for _, kve := range hist {
		if kve.Operation() != jetstream.KeyValuePut {
			continue
		}
		var e registry.Entry
		if json.Unmarshal(kve.Value(), &e) != nil {
			continue
		}
		when := e.UpdatedAt
		if when.IsZero() {
			when = kve.Created()
		}
		if when.After(at) {
			continue
		}
		best = &e
	}
	if best != nil {
		return best.Definition, true
	}
	return cur.Definition, ok
}

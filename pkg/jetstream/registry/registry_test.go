package registry_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func def(name, version string) envelope.ToolDefinition {
	return envelope.ToolDefinition{
		Name: name, Version: version, Description: "test tool " + name,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Metadata: envelope.ToolMetadata{Category: envelope.CategorySearch, SideEffects: envelope.SideEffectsReads,
			Cache: envelope.CacheTTL, CacheTTLS: 60},
		Implementation: envelope.Implementation{Kind: envelope.ImplBuiltin},
	}
}

func open(t *testing.T) *registry.Registry {
	t.Helper()
	env := eventstest.Start(t)
	r, err := registry.Open(testCtx(t), env.JS)
	require.NoError(t, err)
	return r
}

func TestKeyAndStates(t *testing.T) {
	require.Equal(t, "web_search.1.2.0", registry.Key(envelope.ToolRef{Name: "web_search", Version: "1.2.0"}))
	require.Equal(t, "a-b.1.0.0-rc.1", registry.Key(envelope.ToolRef{Name: "a-b", Version: "1.0.0-rc.1"}))
	for _, s := range []registry.State{registry.StateActive, registry.StateDeprecated, registry.StateBlocked} {
		require.True(t, s.Valid(), s)
	}
	require.False(t, registry.State("").Valid())
	require.False(t, registry.State("retired").Valid())
}

func TestPutGetListSetState(t *testing.T) {
	r := open(t)
	ctx := testCtx(t)
	search := def("web_search", "1.2.0")
	ref := search.Ref()

	_, err := r.Get(ctx, ref)
	require.ErrorIs(t, err, registry.ErrNotFound)
	require.ErrorContains(t, err, "web_search@1.2.0")

	require.NoError(t, r.Put(ctx, registry.Entry{Definition: search}))
	e, err := r.Get(ctx, ref)
	require.NoError(t, err)
	require.Equal(t, registry.StateActive, e.State, "a zero state means active")
	require.False(t, e.UpdatedAt.IsZero())
	require.Equal(t, search, e.Definition)

	// Several versions and tools, listed by name then version.
	for _, d := range []envelope.ToolDefinition{def("web_search", "1.10.0"), def("calculator", "2.0.0"), def("web_search", "1.0.0")} {
		require.NoError(t, r.Put(ctx, registry.Entry{Definition: d, State: registry.StateDeprecated}))
	}
	list, err := r.List(ctx)
	require.NoError(t, err)
	var refs []string
	for _, e := range list {
		refs = append(refs, e.Definition.Ref().String())
	}
	require.Equal(t, []string{"calculator@2.0.0", "web_search@1.0.0", "web_search@1.10.0", "web_search@1.2.0"}, refs)

	before := e.UpdatedAt
	require.NoError(t, r.SetState(ctx, ref, registry.StateBlocked))
	e, err = r.Get(ctx, ref)
	require.NoError(t, err)
	require.Equal(t, registry.StateBlocked, e.State)
	require.False(t, e.UpdatedAt.Before(before))
	require.Equal(t, search, e.Definition, "a state change keeps the definition")

	err = r.SetState(ctx, ref, "retired")
	require.ErrorIs(t, err, envelope.ErrInvalidTool)
	require.ErrorContains(t, err, `state "retired" is not one of active, deprecated, blocked`)
	err = r.SetState(ctx, envelope.ToolRef{Name: "nope", Version: "1.0.0"}, registry.StateBlocked)
	require.ErrorIs(t, err, registry.ErrNotFound)
}

func TestListEmpty(t *testing.T) {
	r := open(t)
	list, err := r.List(testCtx(t))
	require.NoError(t, err)
	require.Empty(t, list)
}

func TestPutRejectsInvalidDefinitions(t *testing.T) {
	r := open(t)
	ctx := testCtx(t)
	cases := map[string]func(d *envelope.ToolDefinition){
		"bad name":            func(d *envelope.ToolDefinition) { d.Name = "web.search" },
		"bad version":         func(d *envelope.ToolDefinition) { d.Version = "v1" },
		"no input schema":     func(d *envelope.ToolDefinition) { d.InputSchema = nil },
		"bad category":        func(d *envelope.ToolDefinition) { d.Metadata.Category = "misc" },
		"cached writes":       func(d *envelope.ToolDefinition) { d.Metadata.SideEffects = envelope.SideEffectsWrites },
		"bad implementation":  func(d *envelope.ToolDefinition) { d.Implementation.Kind = "lambda" },
		"ttl without seconds": func(d *envelope.ToolDefinition) { d.Metadata.CacheTTLS = 0 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			d := def("web_search", "1.2.0")
			mutate(&d)
			require.ErrorIs(t, r.Put(ctx, registry.Entry{Definition: d}), envelope.ErrInvalidTool)
		})
	}
	err := r.Put(ctx, registry.Entry{Definition: def("web_search", "1.2.0"), State: "gone"})
	require.ErrorIs(t, err, envelope.ErrInvalidTool)

	list, err := r.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list, "nothing invalid was stored")
}

func TestEnsureKeepsStateChanges(t *testing.T) {
	r := open(t)
	ctx := testCtx(t)
	d := def("web_search", "1.2.0")

	require.NoError(t, r.Ensure(ctx, d))
	e, err := r.Get(ctx, d.Ref())
	require.NoError(t, err)
	require.Equal(t, registry.StateActive, e.State)

	// An operator blocks the tool; a service restarting ensures it again.
	require.NoError(t, r.SetState(ctx, d.Ref(), registry.StateBlocked))
	blocked, err := r.Get(ctx, d.Ref())
	require.NoError(t, err)
	require.NoError(t, r.Ensure(ctx, d))
	e, err = r.Get(ctx, d.Ref())
	require.NoError(t, err)
	require.Equal(t, registry.StateBlocked, e.State, "Ensure does not undo the operator's change")
	require.Equal(t, blocked.UpdatedAt, e.UpdatedAt, "an unchanged definition is not rewritten")

	// A changed definition of the same version is updated, its state kept.
	d.Description = "now with better ranking"
	require.NoError(t, r.Ensure(ctx, d))
	e, err = r.Get(ctx, d.Ref())
	require.NoError(t, err)
	require.Equal(t, "now with better ranking", e.Definition.Description)
	require.Equal(t, registry.StateBlocked, e.State)

	bad := def("web_search", "2.0.0")
	bad.Metadata.Category = "misc"
	require.ErrorIs(t, r.Ensure(ctx, bad), envelope.ErrInvalidTool)
}

func TestCatalogFollowsTheRegistry(t *testing.T) {
	r := open(t)
	ctx := testCtx(t)
	search := def("web_search", "1.2.0")
	require.NoError(t, r.Put(ctx, registry.Entry{Definition: search}))

	// The start context bounds the wait for the initial contents only: the
	// catalog keeps following after it ends.
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := r.Watch(startCtx)
	cancel()
	require.NoError(t, err)
	t.Cleanup(c.Stop)

	e, ok := c.Lookup(search.Ref())
	require.True(t, ok, "the catalog holds the registry's contents when Watch returns")
	require.Equal(t, registry.StateActive, e.State)
	_, ok = c.Lookup(envelope.ToolRef{Name: "calculator", Version: "2.0.0"})
	require.False(t, ok)

	calc := def("calculator", "2.0.0")
	require.NoError(t, r.Put(ctx, registry.Entry{Definition: calc}))
	require.Eventually(t, func() bool {
		_, ok := c.Lookup(calc.Ref())
		return ok
	}, 2*time.Second, 10*time.Millisecond, "the catalog sees a new tool")

	require.NoError(t, r.SetState(ctx, search.Ref(), registry.StateBlocked))
	require.Eventually(t, func() bool {
		e, _ := c.Lookup(search.Ref())
		return e.State == registry.StateBlocked
	}, 2*time.Second, 10*time.Millisecond, "the catalog sees a state change")

	entries := c.Entries()
	require.Len(t, entries, 2)
	require.Equal(t, "calculator", entries[0].Definition.Name)
	require.Equal(t, "web_search", entries[1].Definition.Name)
}

func TestCatalogOfEmptyRegistry(t *testing.T) {
	r := open(t)
	c, err := r.Watch(testCtx(t))
	require.NoError(t, err)
	require.Empty(t, c.Entries())
	c.Stop()
}

func TestOpenWithoutBucket(t *testing.T) {
	env := eventstest.Start(t)
	ctx := testCtx(t)
	require.NoError(t, env.JS.DeleteKeyValue(ctx, provision.BucketTools))
	_, err := registry.Open(ctx, env.JS)
	require.ErrorContains(t, err, "open tool registry")
}

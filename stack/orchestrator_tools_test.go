package stack_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor"
	"github.com/toolwire/toolwire/services/executor/tool"
	"github.com/toolwire/toolwire/services/executor/tools/builtin"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
	"github.com/toolwire/toolwire/services/orchestrator/orchestratortest"
	"github.com/toolwire/toolwire/services/policy"
)

// The orchestrator's tests that need the whole pipeline (orchestrator_*_test.go)
// run the real Policy Guard and executor on an orchestratortest.Harness; every
// use of the executor's tool API by those tests is in this file. Besides the
// tools below, they call echo@1.0.0, calculator@1.0.0 and sleep@1.0.0 as the
// executor serves them.

// newPipeline starts the executor (with the built-in tools, the test tools
// failing and sleep, and tools) and the Policy Guard on a harness;
// orchestrators are started by the test.
func newPipeline(t *testing.T, tools ...tool.Tool) *orchestratortest.Harness {
	t.Helper()
	h := orchestratortest.New(t)
	cfg := executor.Config{Concurrency: 64, ID: "executor-0"}.With(executor.WithTools(append(testtools.Tools(), tools...)...))
	ex, err := executor.New(orchestratortest.Deps("executor", h.Env.Conn, h.Env.JS), cfg)
	require.NoError(t, err)
	require.NoError(t, ex.Start(t.Context()))
	t.Cleanup(func() { _ = ex.Stop(context.Background()) })
	pol, err := policy.New(orchestratortest.Deps("policy", h.Env.Conn, h.Env.JS), policy.Config{})
	require.NoError(t, err)
	require.NoError(t, pol.Start(t.Context()))
	t.Cleanup(func() { _ = pol.Stop(context.Background()) })
	return h
}

// builtinDefinitions are the definitions of the executor's built-in tools
// (echo@1.0.0, calculator@1.0.0, sleep@1.0.0, ...), by name.
func builtinDefinitions() map[string]envelope.ToolDefinition {
	defs := map[string]envelope.ToolDefinition{}
	for _, tl := range slices.Concat(builtin.Tools(), testtools.Tools()) {
		defs[tl.Definition().Name] = tl.Definition()
	}
	return defs
}

// loopTool is a tool for the orchestrator's tests: no side effects, no cache,
// its declared cost, and fn as its body.
func loopTool(name string, cost float64, fn func(ctx context.Context, input json.RawMessage) (json.RawMessage, error)) *stackTool {
	t := newStackTool(name, envelope.ToolMetadata{Category: envelope.CategoryUtility, SideEffects: envelope.SideEffectsNone, Cache: envelope.CacheNone}, fn)
	t.def.Cost = cost
	return t
}

// internalsTool fails with an UNKNOWN error whose details are internals.
func internalsTool() *stackTool {
	return loopTool("leaky", 0, func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return nil, &envelope.ToolError{Code: envelope.CodeUnknown, Message: "internal error in tool leaky",
			Details: "pq: password authentication failed for user admin at db-7.internal:5432"}
	})
}

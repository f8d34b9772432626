package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
)

// TestEnvelopeCost: the completed envelope carries the tool's declared cost
// when the call is billable (the tool ran, or may have: success, a provider
// error, a timeout), and 0 when it never ran or its result came from the
// cache: cached, refused (blocked), invalid input (the executor's check or
// the tool's own), rate limited, missing secrets, unknown tool. A writes
// call's outcome record holds the cost it was published with.
func TestEnvelopeCost(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	reg := openRegistry(t, env.JS)
	writes := newTestTool("costly_write", okOutput)
	writes.def.Metadata.SideEffects, writes.def.Cost = envelope.SideEffectsWrites, 0.5
	startExecutor(t, env, Config{}, WithTools(authTool{name: "auth_cost"}, writes)) // no master key

	const cost = 0.25
	priced := func(def envelope.ToolDefinition, state registry.State, change func(*envelope.ToolDefinition)) {
		putEntry(t, reg, def, state, func(d *envelope.ToolDefinition) {
			d.Version, d.Cost = "2.0.0", cost
			if change != nil {
				change(d)
			}
		})
	}
	priced(builtinDef(t, "echo"), registry.StateActive, nil)
	priced(builtinDef(t, "calculator"), registry.StateActive, nil)
	priced(builtinDef(t, "json_query"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Metadata.Cache = envelope.CacheForever
	})
	priced(testtools.Failing().Definition(), registry.StateActive, nil)
	priced(testtools.Sleep().Definition(), registry.StateActive, func(d *envelope.ToolDefinition) { d.TimeoutMS = 20 })
	priced(builtinDef(t, "get_current_time"), registry.StateBlocked, nil)
	priced(authTool{name: "auth_cost"}.Definition(), registry.StateActive, nil)
	// One call a day, a burst of one: the second call is rate limited.
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Version, d.Cost = "2.1.0", cost
		d.RateLimit = &envelope.RateLimit{PerS: envelope.MinRateLimitPerS, Burst: 1}
	})

	const runID = "run-cost"
	w := watchRun(t, env.JS, runID)
	tests := []struct {
		name   string
		tool   string
		input  string
		code   envelope.ErrorCode
		cached bool
		want   float64
	}{
		{name: "success", tool: "echo@2.0.0", input: `{"text":"paid"}`, want: cost},
		{name: "provider error", tool: "failing@2.0.0", input: `{"message":"down"}`, code: envelope.CodeProviderError, want: cost},
		{name: "timeout", tool: "sleep@2.0.0", input: `{"ms":600000}`, code: envelope.CodeTimeout, want: cost},
		{name: "first call of a cacheable tool", tool: "json_query@2.0.0", input: `{"input":{"a":1},"query":".a"}`, want: cost},
		{name: "cached", tool: "json_query@2.0.0", input: `{"input":{"a":1},"query":".a"}`, cached: true},
		{name: "invalid input", tool: "calculator@2.0.0", input: `{"expr":"1"}`, code: envelope.CodeValidation},
		{name: "input the tool rejects", tool: "calculator@2.0.0", input: `{"expression":"1/0"}`, code: envelope.CodeValidation},
		{name: "refused: blocked", tool: "get_current_time@2.0.0", input: `{}`, code: envelope.CodePolicyDenied},
		{name: "unknown tool", tool: "nope@2.0.0", input: `{}`, code: envelope.CodeValidation},
		{name: "missing secrets", tool: "auth_cost@2.0.0", input: `{}`, code: envelope.CodeAuthRequired},
		{name: "within the rate limit", tool: "echo@2.1.0", input: `{"text":"first"}`, want: cost},
		{name: "rate limited", tool: "echo@2.1.0", input: `{"text":"second"}`, code: envelope.CodeRateLimit},
		{name: "writes", tool: "costly_write@1.0.0", input: `{}`, want: 0.5},
	}
	for i, tc := range tests {
		// One at a time: the cache hit and the rate limit depend on the
		// calls before them.
		ref, err := envelope.ParseToolRef(tc.tool)
		require.NoError(t, err)
		req := callRequest(t, runID, i+1, ref.Name, ref.Version, tc.input)
		got := w.call(t, env.JS, schemas, req)
		t.Run(tc.name, func(t *testing.T) {
			if tc.code == "" {
				require.Nil(t, got.Error, "%+v", got.Error)
			} else {
				require.NotNil(t, got.Error)
				require.Equal(t, tc.code, got.Error.Code, got.Error.Message)
			}
			require.Equal(t, tc.cached, got.Cached)
			require.Equal(t, tc.want, got.Cost)
			require.Equal(t, tc.want != 0, got.Billable())

			// The cost is in the event as the contract spells it.
			var raw map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(w.wait(t, completedSubject(t, req)).Data(), &raw))
			if tc.want == 0 {
				require.NotContains(t, raw, "cost")
			} else {
				require.JSONEq(t, fmt.Sprint(tc.want), string(raw["cost"]))
			}
			if ref.Name == "costly_write" {
				kv, err := env.JS.KeyValue(t.Context(), events.BucketOutcomes)
				require.NoError(t, err)
				e, err := kv.Get(context.WithoutCancel(t.Context()), outcomeKey(req.RunID, req.CallID))
				require.NoError(t, err)
				var rec outcomeRecord
				require.NoError(t, json.Unmarshal(e.Value(), &rec))
				require.Equal(t, outcomeDone, rec.State)
				require.Equal(t, tc.want, rec.Envelope.Cost, "the record holds the cost published")
			}
		})
	}
}

package envelope_test

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestParseToolRef(t *testing.T) {
	tests := []struct {
		in      string
		name    string
		version string
		err     string // fragment; empty: valid
	}{
		{"web_search@1.2.0", "web_search", "1.2.0", ""},
		{"a@0.0.0", "a", "0.0.0", ""},
		{"Tool-9@10.20.30", "Tool-9", "10.20.30", ""},
		{"x@1.0.0-rc.1", "x", "1.0.0-rc.1", ""},
		{"x@1.0.0-alpha-2.beta", "x", "1.0.0-alpha-2.beta", ""},
		{strings.Repeat("n", 64) + "@1.0.0", strings.Repeat("n", 64), "1.0.0", ""},
		{"web_search", "", "", "want name@version"},
		{"", "", "", "want name@version"},
		{"@1.0.0", "", "", "name must be 1-64 letters"},
		{strings.Repeat("n", 65) + "@1.0.0", "", "", "name must be 1-64 letters"},
		{"web search@1.0.0", "", "", "name must be"},
		{"web.search@1.0.0", "", "", "name must be"},
		{"x@", "", "", "version must be a semantic version"},
		{"x@1", "", "", "version must be a semantic version"},
		{"x@1.0", "", "", "version must be a semantic version"},
		{"x@v1.0.0", "", "", "version must be a semantic version"},
		{"x@01.0.0", "", "", "version must be a semantic version"},
		{"x@1.0.0+build.5", "", "", "version must be a semantic version"},
		{"x@1.0.0-", "", "", "version must be a semantic version"},
		{"x@1.0.0-rc..1", "", "", "version must be a semantic version"},
		{"a@b@1.0.0", "", "", "version must be a semantic version"},
		{"x@latest", "", "", "version must be a semantic version"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			ref, err := envelope.ParseToolRef(tc.in)
			if tc.err != "" {
				require.ErrorIs(t, err, envelope.ErrInvalidToolRef)
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, err, "invalid tool reference")
				return
			}
			require.NoError(t, err)
			require.Equal(t, envelope.ToolRef{Name: tc.name, Version: tc.version}, ref)
			require.Equal(t, tc.in, ref.String())
		})
	}
}

func TestToolRefText(t *testing.T) {
	type doc struct {
		Tool envelope.ToolRef   `json:"tool"`
		All  []envelope.ToolRef `json:"all"`
	}
	in := doc{Tool: envelope.ToolRef{Name: "web_search", Version: "1.2.0"}, All: []envelope.ToolRef{{Name: "a", Version: "0.1.0"}}}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	require.JSONEq(t, `{"tool":"web_search@1.2.0","all":["a@0.1.0"]}`, string(b))

	var out doc
	require.NoError(t, json.Unmarshal(b, &out))
	require.Equal(t, in, out)

	err = json.Unmarshal([]byte(`{"tool":"web_search"}`), &out)
	require.ErrorIs(t, err, envelope.ErrInvalidToolRef)
}

func TestToolDefinitionValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(d *envelope.ToolDefinition)
		want   []string // fragments; none: valid
	}{
		{"valid", func(*envelope.ToolDefinition) {}, nil},
		{"cache none", func(d *envelope.ToolDefinition) { d.Metadata.Cache, d.Metadata.CacheTTLS = envelope.CacheNone, 0 }, nil},
		{"cache forever", func(d *envelope.ToolDefinition) { d.Metadata.Cache, d.Metadata.CacheTTLS = envelope.CacheForever, 0 }, nil},
		{"writes uncached", func(d *envelope.ToolDefinition) {
			d.Metadata.SideEffects, d.Metadata.Cache, d.Metadata.CacheTTLS = envelope.SideEffectsWrites, envelope.CacheNone, 0
		}, nil},
		{"no output schema", func(d *envelope.ToolDefinition) { d.OutputSchema = nil }, nil},
		{"every implementation kind", func(d *envelope.ToolDefinition) { d.Implementation.Kind = envelope.ImplSandbox }, nil},
		{"bad name", func(d *envelope.ToolDefinition) { d.Name = "web search" }, []string{`invalid tool reference "web search@1.2.0": name must be`}},
		{"bad version", func(d *envelope.ToolDefinition) { d.Version = "1.2" }, []string{`invalid tool reference "web_search@1.2": version must be`}},
		{"no input schema", func(d *envelope.ToolDefinition) { d.InputSchema = nil }, []string{"input_schema must be a JSON Schema object"}},
		{"input schema not JSON", func(d *envelope.ToolDefinition) { d.InputSchema = json.RawMessage(`{"type":`) }, []string{"input_schema must be a JSON Schema object"}},
		{"output schema not JSON", func(d *envelope.ToolDefinition) { d.OutputSchema = json.RawMessage(`{`) }, []string{"output_schema is not valid JSON"}},
		{"unknown category", func(d *envelope.ToolDefinition) { d.Metadata.Category = "misc" }, []string{`metadata.category "misc" is not one of api, code, data, search, utility`}},
		{"missing category", func(d *envelope.ToolDefinition) { d.Metadata.Category = "" }, []string{`metadata.category "" is not one of`}},
		{"unknown side effects", func(d *envelope.ToolDefinition) { d.Metadata.SideEffects = "deletes" }, []string{`metadata.side_effects "deletes" is not one of none, reads, writes`}},
		{"ttl without seconds", func(d *envelope.ToolDefinition) { d.Metadata.CacheTTLS = 0 }, []string{"metadata.cache_ttl_s must be positive when cache is ttl"}},
		{"ttl negative", func(d *envelope.ToolDefinition) { d.Metadata.CacheTTLS = -1 }, []string{"metadata.cache_ttl_s must be positive when cache is ttl"}},
		{"unknown cache", func(d *envelope.ToolDefinition) { d.Metadata.Cache = "always" }, []string{`metadata.cache "always" is not one of none, ttl, forever`}},
		{"cached writes", func(d *envelope.ToolDefinition) { d.Metadata.SideEffects = envelope.SideEffectsWrites }, []string{"a tool whose side_effects is writes cannot be cached"}},
		{"idempotent writes", func(d *envelope.ToolDefinition) {
			d.Metadata = envelope.ToolMetadata{Category: envelope.CategoryAPI, SideEffects: envelope.SideEffectsWrites, Cache: envelope.CacheNone, Idempotent: true}
		}, nil},
		{"idempotent reads", func(d *envelope.ToolDefinition) { d.Metadata.Idempotent = true },
			[]string{`metadata.idempotent is only for a tool whose side_effects is writes, not "reads"`}},
		{"idempotent none", func(d *envelope.ToolDefinition) {
			d.Metadata.SideEffects, d.Metadata.Idempotent = envelope.SideEffectsNone, true
		}, []string{`metadata.idempotent is only for a tool whose side_effects is writes, not "none"`}},
		{"negative timeout", func(d *envelope.ToolDefinition) { d.TimeoutMS = -1 }, []string{"timeout_ms must not be negative"}},
		{"unknown implementation", func(d *envelope.ToolDefinition) { d.Implementation.Kind = "grpc" }, []string{`implementation.kind "grpc" is not one of builtin, http, mcp, sandbox`}},
		{"several problems", func(d *envelope.ToolDefinition) {
			d.Metadata.Category = "misc"
			d.TimeoutMS = -1
		}, []string{"invalid tool definition web_search@1.2.0: ", `metadata.category "misc"`, "; timeout_ms must not be negative"}},
	}
	s := newSchemas(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := fixtureToolDefinition()
			tc.mutate(&d)
			err := d.Validate()
			if tc.want == nil {
				require.NoError(t, err)
				require.NoError(t, s.ValidateValue(envelope.SchemaToolDefinition, d), "valid definitions match the schema too")
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestToolDefinitionHelpers(t *testing.T) {
	d := fixtureToolDefinition()
	require.Equal(t, envelope.ToolRef{Name: "web_search", Version: "1.2.0"}, d.Ref())
	require.Equal(t, 5*time.Second, d.Timeout())
	d.TimeoutMS = 0
	require.Equal(t, envelope.DefaultToolTimeout, d.Timeout())
	require.Equal(t, 30*time.Second, d.Timeout())
	require.False(t, d.RetriesWrites(), "a reads tool")
	d.Metadata.SideEffects = envelope.SideEffectsWrites
	require.False(t, d.RetriesWrites(), "a writes tool that does not declare it")
	d.Metadata.Idempotent = true
	require.True(t, d.RetriesWrites())
}

func TestSideEffectsRank(t *testing.T) {
	require.Equal(t, 0, envelope.SideEffectsNone.Rank())
	require.Equal(t, 1, envelope.SideEffectsReads.Rank())
	require.Equal(t, 2, envelope.SideEffectsWrites.Rank())
	require.Equal(t, -1, envelope.SideEffects("").Rank())
	require.Equal(t, -1, envelope.SideEffects("WRITES").Rank())
}

// A tool's declared cost is optional, a finite number, zero or more; the Go
// check and the JSON Schema agree.
func TestToolDefinitionCost(t *testing.T) {
	s := newSchemas(t)
	for _, tc := range []struct {
		name string
		cost float64
		bad  bool
	}{
		{"free", 0, false},
		{"a cent", 0.01, false},
		{"negative", -0.5, true},
		{"NaN", math.NaN(), true},
		{"infinite", math.Inf(1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := fixtureToolDefinition()
			d.Cost = tc.cost
			err := d.Validate()
			if !tc.bad {
				require.NoError(t, err)
				require.NoError(t, s.ValidateValue(envelope.SchemaToolDefinition, d))
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			require.ErrorContains(t, err, "cost must be a finite number, zero or more")
		})
	}
	err := s.Validate(envelope.SchemaToolDefinition, patch(t, marshal(t, fixtureToolDefinition()), edit{"/cost", -1}))
	var se *envelope.SchemaError
	require.ErrorAs(t, err, &se)
	require.True(t, slices.ContainsFunc(se.Problems, func(p string) bool { return strings.HasPrefix(p, "at /cost:") }), se.Problems)
	err = s.Validate(envelope.SchemaToolDefinition, patch(t, marshal(t, fixtureToolDefinition()), edit{"/cost", "1 USD"}))
	require.ErrorAs(t, err, &se)
}

package envelope_test

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// TestRateLimit: the Go validation and the JSON Schema agree on which rate
// limits a definition may carry.
func TestRateLimit(t *testing.T) {
	s := newSchemas(t)
	tests := []struct {
		name      string
		limit     *envelope.RateLimit
		want      string // a fragment of the Go error; "" valid
		schemaLoc string // where the schema problem is; "" only Go rejects it
	}{
		{name: "none", limit: nil},
		{name: "ten a second", limit: &envelope.RateLimit{PerS: 10, Burst: 20}},
		{name: "one every two seconds", limit: &envelope.RateLimit{PerS: 0.5, Burst: 1}},
		{name: "one a day", limit: &envelope.RateLimit{PerS: envelope.MinRateLimitPerS, Burst: 1}},
		{name: "largest", limit: &envelope.RateLimit{PerS: envelope.MaxRateLimitPerS, Burst: envelope.MaxRateLimitBurst}},
		{name: "zero rate", limit: &envelope.RateLimit{PerS: 0, Burst: 1}, want: "rate_limit.per_s 0: want a number from", schemaLoc: "at /rate_limit/per_s:"},
		{name: "negative rate", limit: &envelope.RateLimit{PerS: -1, Burst: 1}, want: "rate_limit.per_s -1", schemaLoc: "at /rate_limit/per_s:"},
		{name: "slower than a day", limit: &envelope.RateLimit{PerS: 1e-6, Burst: 1}, want: "rate_limit.per_s 1e-06", schemaLoc: "at /rate_limit/per_s:"},
		{name: "too fast", limit: &envelope.RateLimit{PerS: 2e6, Burst: 1}, want: "rate_limit.per_s 2e+06", schemaLoc: "at /rate_limit/per_s:"},
		{name: "zero burst", limit: &envelope.RateLimit{PerS: 1, Burst: 0}, want: "rate_limit.burst 0: want a whole number from 1 to 1000000", schemaLoc: "at /rate_limit/burst:"},
		{name: "huge burst", limit: &envelope.RateLimit{PerS: 1, Burst: 2_000_000}, want: "rate_limit.burst 2000000", schemaLoc: "at /rate_limit/burst:"},
		{name: "NaN", limit: &envelope.RateLimit{PerS: math.NaN(), Burst: 1}, want: "rate_limit.per_s NaN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := fixtureToolDefinition()
			d.RateLimit = tc.limit
			err := d.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				require.NoError(t, s.ValidateValue(envelope.SchemaToolDefinition, d))
				return
			}
			require.ErrorIs(t, err, envelope.ErrInvalidTool)
			require.ErrorContains(t, err, tc.want)
			if tc.schemaLoc == "" {
				return // NaN has no JSON spelling
			}
			err = s.ValidateValue(envelope.SchemaToolDefinition, d)
			var se *envelope.SchemaError
			require.ErrorAs(t, err, &se)
			require.True(t, slices.ContainsFunc(se.Problems, func(p string) bool { return strings.HasPrefix(p, tc.schemaLoc) }),
				"no problem at %s in %q", tc.schemaLoc, se.Problems)
		})
	}
}

func TestRateLimitSchemaShape(t *testing.T) {
	s := newSchemas(t)
	def := marshal(t, fixtureToolDefinition())
	for _, tc := range []struct {
		name  string
		value any
		loc   string
	}{
		{"missing burst", map[string]any{"per_s": 1}, "at /rate_limit:"},
		{"missing per_s", map[string]any{"burst": 1}, "at /rate_limit:"},
		{"fractional burst", map[string]any{"per_s": 1, "burst": 1.5}, "at /rate_limit/burst:"},
		{"extra property", map[string]any{"per_s": 1, "burst": 1, "per_tenant": false}, "at /rate_limit:"},
		{"not an object", 5, "at /rate_limit:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Validate(envelope.SchemaToolDefinition, patch(t, def, edit{"/rate_limit", tc.value}))
			var se *envelope.SchemaError
			require.ErrorAs(t, err, &se)
			require.True(t, slices.ContainsFunc(se.Problems, func(p string) bool { return strings.HasPrefix(p, tc.loc) }),
				"no problem at %s in %q", tc.loc, se.Problems)
		})
	}
}

func TestRateLimitInterval(t *testing.T) {
	require.Equal(t, 100*time.Millisecond, (&envelope.RateLimit{PerS: 10, Burst: 1}).Interval())
	require.Equal(t, 2*time.Second, (&envelope.RateLimit{PerS: 0.5, Burst: 1}).Interval())
}

package executor

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestBuiltinDefinitions(t *testing.T) {
	contracts, err := envelope.NewSchemas(nil)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, tool := range Builtins() {
		def := tool.Definition()
		t.Run(def.Name, func(t *testing.T) {
			names[def.Name] = true
			require.NoError(t, def.Validate())
			require.NoError(t, contracts.ValidateValue(envelope.SchemaToolDefinition, def))
			require.Equal(t, "1.0.0", def.Version)
			require.Equal(t, envelope.CategoryUtility, def.Metadata.Category)
			require.Equal(t, envelope.SideEffectsNone, def.Metadata.SideEffects)
			require.Equal(t, envelope.CacheNone, def.Metadata.Cache)
			require.NotEmpty(t, def.Description)

			key, err := builtinKey(&def)
			require.NoError(t, err)
			require.Equal(t, def.Name, key)

			var in map[string]any
			require.NoError(t, json.Unmarshal(def.InputSchema, &in))
			require.Equal(t, "object", in["type"])
			require.Equal(t, false, in["additionalProperties"], "input schemas are strict")
			require.NotEmpty(t, def.OutputSchema)

			ts := compileToolSchemas(&def)
			require.NoError(t, ts.err)
			require.NotNil(t, ts.output)
		})
	}
	require.Equal(t, map[string]bool{"echo": true, "calculator": true, "get_current_time": true, "failing": true, "sleep": true}, names)
	require.Equal(t, 120000, sleepTool{}.Definition().TimeoutMS)
}

// builtinCase is one call of a built-in tool, checked against its schemas
// the way the executor checks it.
type builtinCase struct {
	name        string
	input       string
	wantOut     string             // JSON; checked when wantCode is empty
	wantCode    envelope.ErrorCode // the tool's own error
	wantMsg     string
	wantInvalid []string // the input schema rejects the input with these problems
}

func runBuiltinCases(t *testing.T, tool Tool, cases []builtinCase) {
	t.Helper()
	def := tool.Definition()
	ts := compileToolSchemas(&def)
	require.NoError(t, ts.err)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := envelope.ValidateAgainst("input", ts.input, []byte(tc.input))
			if len(tc.wantInvalid) > 0 {
				var se *envelope.SchemaError
				require.True(t, errors.As(err, &se), "want a schema violation, got %v", err)
				for _, p := range tc.wantInvalid {
					require.Contains(t, joinLines(se.Problems), p)
				}
				return
			}
			require.NoError(t, err, "the input schema accepts the input")
			out, err := tool.Execute(t.Context(), json.RawMessage(tc.input), ToolContext{TenantID: "acme//", Auth: map[string]string{}})
			if tc.wantCode != "" {
				var te *envelope.ToolError
				require.True(t, errors.As(err, &te), "want a ToolError, got %v", err)
				require.Equal(t, tc.wantCode, te.Code)
				require.Contains(t, te.Message, tc.wantMsg)
				return
			}
			require.NoError(t, err)
			require.JSONEq(t, tc.wantOut, string(out))
			require.NoError(t, validate(ts.output, out), "the output schema accepts the output")
		})
	}
}

func validate(s *jsonschema.Schema, raw []byte) error {
	return envelope.ValidateAgainst("output", s, raw)
}

func joinLines(ss []string) string {
	b, _ := json.Marshal(ss)
	return string(b)
}

func TestEcho(t *testing.T) {
	runBuiltinCases(t, echoTool{}, []builtinCase{
		{name: "text", input: `{"text":"hello"}`, wantOut: `{"text":"hello"}`},
		{name: "empty", input: `{"text":""}`, wantOut: `{"text":""}`},
		{name: "unicode and escapes", input: `{"text":"h\u00e9llo \"world\"\n"}`, wantOut: `{"text":"héllo \"world\"\n"}`},
		{name: "missing text", input: `{}`, wantInvalid: []string{"missing property 'text'"}},
		{name: "extra property", input: `{"text":"a","loud":true}`, wantInvalid: []string{"additional properties 'loud' not allowed"}},
		{name: "wrong type", input: `{"text":42}`, wantInvalid: []string{"at /text", "want string"}},
		{name: "not an object", input: `"hello"`, wantInvalid: []string{"want object"}},
	})
}

func TestCalculator(t *testing.T) {
	runBuiltinCases(t, calculatorTool{}, []builtinCase{
		{name: "arithmetic", input: `{"expression":"2 * (3 + 4) ^ 2"}`, wantOut: `{"result":98}`},
		{name: "fraction", input: `{"expression":"1/8"}`, wantOut: `{"result":0.125}`},
		{name: "negative", input: `{"expression":"-3 - 4"}`, wantOut: `{"result":-7}`},
		{name: "division by zero", input: `{"expression":"1 / 0"}`, wantCode: envelope.CodeValidation, wantMsg: "calculator: division by zero at position 3"},
		{name: "syntax error", input: `{"expression":"2 + * 3"}`, wantCode: envelope.CodeValidation, wantMsg: "unexpected '*', expected a number or '(' at position 5"},
		{name: "unbalanced", input: `{"expression":"(1"}`, wantCode: envelope.CodeValidation, wantMsg: "missing ')'"},
		{name: "missing expression", input: `{}`, wantInvalid: []string{"missing property 'expression'"}},
		{name: "empty expression", input: `{"expression":""}`, wantInvalid: []string{"at /expression", "minLength"}},
		{name: "too long", input: `{"expression":"` + repeat("1+", 130) + `1"}`, wantInvalid: []string{"at /expression", "maxLength"}},
		{name: "extra property", input: `{"expression":"1","precision":2}`, wantInvalid: []string{"additional properties 'precision' not allowed"}},
	})
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}

func TestGetCurrentTime(t *testing.T) {
	now := time.Date(2024, 3, 10, 12, 34, 56, 789, time.UTC)
	tool := currentTimeTool{now: func() time.Time { return now }}
	unix := now.Unix()
	runBuiltinCases(t, tool, []builtinCase{
		{name: "defaults", input: `{}`, wantOut: `{"time":"2024-03-10T12:34:56Z","timezone":"UTC","unix":` + itoa(unix) + `}`},
		{name: "iso8601 in Paris", input: `{"format":"iso8601","timezone":"Europe/Paris"}`,
			wantOut: `{"time":"2024-03-10T13:34:56+01:00","timezone":"Europe/Paris","unix":` + itoa(unix) + `}`},
		{name: "unix", input: `{"format":"unix"}`, wantOut: `{"time":"` + itoa(unix) + `","timezone":"UTC","unix":` + itoa(unix) + `}`},
		{name: "human in Tokyo", input: `{"format":"human","timezone":"Asia/Tokyo"}`,
			wantOut: `{"time":"Sunday, 10 March 2024 21:34:56 JST","timezone":"Asia/Tokyo","unix":` + itoa(unix) + `}`},
		{name: "unknown timezone", input: `{"timezone":"Mars/Olympus_Mons"}`, wantCode: envelope.CodeValidation, wantMsg: `unknown timezone "Mars/Olympus_Mons"`},
		{name: "host zone refused", input: `{"timezone":"Local"}`, wantCode: envelope.CodeValidation, wantMsg: `unknown timezone "Local"`},
		{name: "path refused", input: `{"timezone":"../../etc/passwd"}`, wantCode: envelope.CodeValidation, wantMsg: "unknown timezone"},
		{name: "unknown format", input: `{"format":"rfc822"}`, wantInvalid: []string{"at /format", "must be one of"}},
		{name: "empty timezone", input: `{"timezone":""}`, wantInvalid: []string{"at /timezone", "minLength"}},
		{name: "extra property", input: `{"tz":"UTC"}`, wantInvalid: []string{"additional properties 'tz' not allowed"}},
	})
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestFailing(t *testing.T) {
	runBuiltinCases(t, failingTool{}, []builtinCase{
		{name: "message", input: `{"message":"upstream returned 503"}`, wantCode: envelope.CodeProviderError, wantMsg: "upstream returned 503"},
		{name: "default message", input: `{}`, wantCode: envelope.CodeProviderError, wantMsg: defaultFailingMessage},
		{name: "message too long", input: `{"message":"` + repeat("x", 1025) + `"}`, wantInvalid: []string{"maxLength"}},
		{name: "extra property", input: `{"code":"TIMEOUT"}`, wantInvalid: []string{"additional properties 'code' not allowed"}},
	})
}

func TestSleep(t *testing.T) {
	runBuiltinCases(t, sleepTool{}, []builtinCase{
		{name: "zero", input: `{"ms":0}`, wantOut: `{"slept_ms":0}`},
		{name: "one", input: `{"ms":1}`, wantOut: `{"slept_ms":1}`},
		{name: "missing ms", input: `{}`, wantInvalid: []string{"missing property 'ms'"}},
		{name: "negative", input: `{"ms":-1}`, wantInvalid: []string{"at /ms", "minimum"}},
		{name: "too long", input: `{"ms":600001}`, wantInvalid: []string{"at /ms", "maximum"}},
		{name: "fraction", input: `{"ms":1.5}`, wantInvalid: []string{"at /ms", "want integer"}},
	})

	t.Run("honours cancellation", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := sleepTool{}.Execute(ctx, json.RawMessage(`{"ms":600000}`), ToolContext{})
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("reports the cause of its deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Millisecond, errToolTimeout)
		defer cancel()
		_, err := sleepTool{}.Execute(ctx, json.RawMessage(`{"ms":600000}`), ToolContext{})
		require.ErrorIs(t, err, errToolTimeout)
	})
}

func TestBuiltinKey(t *testing.T) {
	tests := []struct {
		name    string
		impl    envelope.Implementation
		want    string
		wantErr string
	}{
		{name: "config", impl: BuiltinImplementation("sleep"), want: "sleep"},
		{name: "no config: the name", impl: envelope.Implementation{Kind: envelope.ImplBuiltin}, want: "tool"},
		{name: "empty key: the name", impl: envelope.Implementation{Kind: envelope.ImplBuiltin, Config: json.RawMessage(`{}`)}, want: "tool"},
		{name: "not builtin", impl: envelope.Implementation{Kind: envelope.ImplHTTP}, wantErr: `kind "http" is not builtin`},
		{name: "bad config", impl: envelope.Implementation{Kind: envelope.ImplBuiltin, Config: json.RawMessage(`{"builtin":3}`)}, wantErr: "config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			def := envelope.ToolDefinition{Name: "tool", Version: "1.0.0", Implementation: tc.impl}
			got, err := builtinKey(&def)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

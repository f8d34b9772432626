package tool

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

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
			got, err := BuiltinKey(&def)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestCompileSchemas(t *testing.T) {
	def := BuiltinDefinition("t", "A test tool.", envelope.CategoryUtility, `{"type":"object"}`, "")
	s, err := CompileSchemas(&def)
	require.NoError(t, err)
	require.NotNil(t, s.Input)
	require.Nil(t, s.Output, "no output schema declared")

	def.OutputSchema = json.RawMessage(`{"type":"object","required":["ok"]}`)
	s, err = CompileSchemas(&def)
	require.NoError(t, err)
	require.Error(t, envelope.ValidateAgainst("output", s.Output, []byte(`{}`)))

	def.InputSchema = json.RawMessage(`{"type":12}`)
	_, err = CompileSchemas(&def)
	require.ErrorContains(t, err, "tool schema")
}

func TestDecodeInput(t *testing.T) {
	var v struct{ N int }
	require.NoError(t, DecodeInput("t", json.RawMessage(`{"N":3}`), &v))
	require.Equal(t, 3, v.N)
	err := DecodeInput("t", json.RawMessage(`{"N":"x"}`), &v)
	var te *envelope.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeValidation, te.Code)
	require.Contains(t, te.Message, "t: input is not the expected object")
}

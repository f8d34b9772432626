package toolapi

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

// fuzzInput is a target of every kind a tool's input struct has.
type fuzzInput struct {
	Text    string             `json:"text"`
	N       int                `json:"n"`
	U       uint8              `json:"u,omitempty"`
	F       float64            `json:"f"`
	B       bool               `json:"b"`
	P       *string            `json:"p"`
	List    []string           `json:"list"`
	Nums    []float64          `json:"nums"`
	Map     map[string]any     `json:"map"`
	Labels  map[string]string  `json:"labels"`
	Raw     json.RawMessage    `json:"raw"`
	Any     any                `json:"any"`
	Inner   struct{ A, B int } `json:"inner"`
	Ignored string             `json:"-"`
}

// FuzzUnmarshal holds unmarshal to encoding/json: the same error or none,
// and the same value, for every document, into a struct and into any.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{`{"text":"hi"}`, `{"TEXT":"x","Text":"y"}`, `{"n":1e3}`, `{"n":1.5}`, `{"u":300}`,
		`{"p":null,"list":["a",null],"map":{"k":[1,{"x":true}]},"labels":{"a":"b"}}`, `{"raw":  [1, 2 ] ,"any":{"z":null}}`,
		`{"inner":{"a":1,"B":2},"-":"x"}`, "{\"text\":\"\xff\"}", `{"text":"\ud800"}`, `{"text":1}`, `{} x`, ` {"f":-0} `,
		`[1]`, `null`, `{"text":"a","text":"b"}`, `{"map":{"a":1,"a":2}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want fuzzInput
		errGot, errWant := unmarshal(data, &got), json.Unmarshal(data, &want)
		require.Equal(t, errWant, errGot, "error for %q", data)
		require.Equal(t, want, got, "value of %q", data)
		var gotAny, wantAny any
		errGot, errWant = unmarshal(data, &gotAny), json.Unmarshal(data, &wantAny)
		require.Equal(t, errWant, errGot, "error for %q into any", data)
		require.Equal(t, wantAny, gotAny, "value of %q into any", data)
	})
}

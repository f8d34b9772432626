package provider_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/orchestrator/provider"
)

func TestArgumentsJSONAndBack(t *testing.T) {
	for _, tc := range []struct {
		text, json, back string
	}{
		{`{"a": 1}`, `{"a": 1}`, `{"a": 1}`},
		{`  {"a":1}  `, `{"a":1}`, `{"a":1}`},
		{``, `{}`, `{}`},
		{`   `, `{}`, `{}`},
		{`{"a": `, `"{\"a\": "`, `{"a": `},
		{`not json at all`, `"not json at all"`, `not json at all`},
		{`[1,2]`, `[1,2]`, `[1,2]`},
	} {
		got := provider.ArgumentsJSON(tc.text)
		require.True(t, json.Valid(got), tc.text)
		require.Equal(t, tc.json, string(got), tc.text)
		require.Equal(t, tc.back, provider.ArgumentsText(got), tc.text)
	}
	require.Equal(t, map[string]any{}, provider.ArgumentsValue(json.RawMessage(`"broken"`)))
	require.Equal(t, json.RawMessage(`{"a":1}`), provider.ArgumentsValue(json.RawMessage(`{"a":1}`)))
}

func FuzzArgumentsJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, ``, `{"a":`, `"x"`, `[]`, "\xff", `{"a":"\u0000"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		got := provider.ArgumentsJSON(text)
		if !json.Valid(got) {
			t.Fatalf("ArgumentsJSON(%q) = %q is not JSON", text, got)
		}
		// What the model wrote goes back as it wrote it (up to spaces around
		// valid JSON, and invalid UTF-8, which JSON cannot carry).
		back := provider.ArgumentsText(got)
		if trimmed := strings.TrimSpace(text); trimmed == "" || json.Valid([]byte(trimmed)) {
			return
		}
		if back != text && json.Valid([]byte(back)) {
			t.Fatalf("ArgumentsText(ArgumentsJSON(%q)) = %q", text, back)
		}
	})
}

func TestInputSchemaObject(t *testing.T) {
	for _, tc := range []struct {
		schema string
		want   map[string]any
		err    string
	}{
		{`{"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","type":"object","properties":{"a":{"type":"string"}}}`,
			map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "string"}}}, ""},
		{``, map[string]any{"type": "object", "properties": map[string]any{}}, ""},
		{`true`, map[string]any{"type": "object", "properties": map[string]any{}}, ""},
		{`{"type":`, nil, "input_schema"},
	} {
		got, err := provider.InputSchema(envelope.ToolDefinition{Name: "t", Version: "1.0.0", InputSchema: json.RawMessage(tc.schema)})
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

func TestRedactKeys(t *testing.T) {
	for in, want := range map[string]string{
		"Incorrect API key provided: sk-proj-AbCd1234.": "Incorrect API key provided: [redacted].",
		"invalid x-api-key sk-ant-api03-xyzw9876 given": "invalid x-api-key [redacted] given",
		"no key here: skip-this is fine":                "no key here: skip-this is fine",
	} {
		require.Equal(t, want, provider.RedactKeys(in))
	}
}

func TestRetries(t *testing.T) {
	require.Equal(t, provider.DefaultRetries, provider.Retries(0))
	require.Equal(t, 0, provider.Retries(-1))
	require.Equal(t, 7, provider.Retries(7))
}

package builtin

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi/tooltest"
)

func TestBuiltinDefinitions(t *testing.T) {
	names := map[string]bool{}
	for _, tl := range Tools() {
		def := tl.Definition()
		t.Run(def.Name, func(t *testing.T) {
			names[def.Name] = true
			tooltest.CheckBuiltinDefinition(t, def)
			require.Equal(t, envelope.SideEffectsNone, def.Metadata.SideEffects)
			require.Equal(t, envelope.CacheNone, def.Metadata.Cache)
			want := envelope.CategoryUtility
			if def.Name == "json_query" {
				want = envelope.CategoryData
			}
			require.Equal(t, want, def.Metadata.Category)
		})
	}
	require.Equal(t, map[string]bool{"echo": true, "calculator": true, "get_current_time": true, "json_query": true}, names)
}

func TestEcho(t *testing.T) {
	tooltest.RunCases(t, echoTool{}, []tooltest.Case{
		{Name: "text", Input: `{"text":"hello"}`, WantOut: `{"text":"hello"}`},
		{Name: "empty", Input: `{"text":""}`, WantOut: `{"text":""}`},
		{Name: "unicode and escapes", Input: `{"text":"h\u00e9llo \"world\"\n"}`, WantOut: `{"text":"héllo \"world\"\n"}`},
		{Name: "missing text", Input: `{}`, WantInvalid: []string{"missing property 'text'"}},
		{Name: "extra property", Input: `{"text":"a","loud":true}`, WantInvalid: []string{"additional properties 'loud' not allowed"}},
		{Name: "wrong type", Input: `{"text":42}`, WantInvalid: []string{"at /text", "want string"}},
		{Name: "not an object", Input: `"hello"`, WantInvalid: []string{"want object"}},
	})
}

func TestCalculator(t *testing.T) {
	tooltest.RunCases(t, calculatorTool{}, []tooltest.Case{
		{Name: "arithmetic", Input: `{"expression":"2 * (3 + 4) ^ 2"}`, WantOut: `{"result":98}`},
		{Name: "fraction", Input: `{"expression":"1/8"}`, WantOut: `{"result":0.125}`},
		{Name: "negative", Input: `{"expression":"-3 - 4"}`, WantOut: `{"result":-7}`},
		{Name: "division by zero", Input: `{"expression":"1 / 0"}`, WantCode: envelope.CodeValidation, WantMsg: "calculator: division by zero at position 3"},
		{Name: "syntax error", Input: `{"expression":"2 + * 3"}`, WantCode: envelope.CodeValidation, WantMsg: "unexpected '*', expected a number or '(' at position 5"},
		{Name: "unbalanced", Input: `{"expression":"(1"}`, WantCode: envelope.CodeValidation, WantMsg: "missing ')'"},
		{Name: "missing expression", Input: `{}`, WantInvalid: []string{"missing property 'expression'"}},
		{Name: "empty expression", Input: `{"expression":""}`, WantInvalid: []string{"at /expression", "minLength"}},
		{Name: "too long", Input: `{"expression":"` + strings.Repeat("1+", 130) + `1"}`, WantInvalid: []string{"at /expression", "maxLength"}},
		{Name: "extra property", Input: `{"expression":"1","precision":2}`, WantInvalid: []string{"additional properties 'precision' not allowed"}},
	})
}

func TestGetCurrentTime(t *testing.T) {
	now := time.Date(2024, 3, 10, 12, 34, 56, 789, time.UTC)
	tool := currentTimeTool{now: func() time.Time { return now }}
	unix := now.Unix()
	tooltest.RunCases(t, tool, []tooltest.Case{
		{Name: "defaults", Input: `{}`, WantOut: `{"time":"2024-03-10T12:34:56Z","timezone":"UTC","unix":` + itoa(unix) + `}`},
		{Name: "iso8601 in Paris", Input: `{"format":"iso8601","timezone":"Europe/Paris"}`,
			WantOut: `{"time":"2024-03-10T13:34:56+01:00","timezone":"Europe/Paris","unix":` + itoa(unix) + `}`},
		{Name: "unix", Input: `{"format":"unix"}`, WantOut: `{"time":"` + itoa(unix) + `","timezone":"UTC","unix":` + itoa(unix) + `}`},
		{Name: "human in Tokyo", Input: `{"format":"human","timezone":"Asia/Tokyo"}`,
			WantOut: `{"time":"Sunday, 10 March 2024 21:34:56 JST","timezone":"Asia/Tokyo","unix":` + itoa(unix) + `}`},
		{Name: "unknown timezone", Input: `{"timezone":"Mars/Olympus_Mons"}`, WantCode: envelope.CodeValidation, WantMsg: `unknown timezone "Mars/Olympus_Mons"`},
		{Name: "host zone refused", Input: `{"timezone":"Local"}`, WantCode: envelope.CodeValidation, WantMsg: `unknown timezone "Local"`},
		{Name: "path refused", Input: `{"timezone":"../../etc/passwd"}`, WantCode: envelope.CodeValidation, WantMsg: "unknown timezone"},
		{Name: "unknown format", Input: `{"format":"rfc822"}`, WantInvalid: []string{"at /format", "must be one of"}},
		{Name: "empty timezone", Input: `{"timezone":""}`, WantInvalid: []string{"at /timezone", "minLength"}},
		{Name: "extra property", Input: `{"tz":"UTC"}`, WantInvalid: []string{"additional properties 'tz' not allowed"}},
	})
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

package secrets_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/jetstream/secrets"
)

const canary = "sk-canary-Zq81/x+y&z"

func TestScrubString(t *testing.T) {
	s := secrets.NewScrubber(map[string]string{"API_KEY": canary, "SHORT": "abcd"})
	tests := []struct{ in, want string }{
		{"no secret here", "no secret here"},
		{"key=" + canary, "key=[REDACTED:API_KEY]"},
		{canary + canary, "[REDACTED:API_KEY][REDACTED:API_KEY]"},
		{"q=sk-canary-Zq81%2Fx%2By%26z", "q=[REDACTED:API_KEY]"},                  // query-escaped
		{"/p/sk-canary-Zq81%2Fx+y&z", "/p/[REDACTED:API_KEY]"},                    // path-escaped
		{`{"auth":"sk-canary-Zq81/x+y\u0026z"}`, `{"auth":"[REDACTED:API_KEY]"}`}, // JSON-escaped
		{"xabcdx", "x[REDACTED:SHORT]x"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, s.String(tt.in), tt.in)
		require.Equal(t, tt.in != tt.want, s.Contains(tt.in), tt.in)
	}

	var none *secrets.Scrubber
	require.True(t, none.Empty())
	require.Equal(t, canary, none.String(canary))
	require.True(t, secrets.NewScrubber(map[string]string{"EMPTY": ""}).Empty())
}

// A value that contains another is replaced whole.
func TestScrubOverlapping(t *testing.T) {
	s := secrets.NewScrubber(map[string]string{"INNER": "secret", "OUTER": "my-secret-value"})
	require.Equal(t, "[REDACTED:OUTER] and [REDACTED:INNER]", s.String("my-secret-value and secret"))
}

func TestScrubJSON(t *testing.T) {
	s := secrets.NewScrubber(map[string]string{"API_KEY": canary, "PIN": "98765432"})
	tests := []struct{ name, in, want string }{
		{"untouched keeps its bytes", `{ "a" : 1 ,"b":[true,null]}`, `{ "a" : 1 ,"b":[true,null]}`},
		{"value", `{"auth":{"API_KEY":"` + canary + `"}}`, `{"auth":{"API_KEY":"[REDACTED:API_KEY]"}}`},
		{"key", `{"` + canary + `":1}`, `{"[REDACTED:API_KEY]":1}`},
		{"inside a longer string", `["Bearer ` + canary + ` used"]`, `["Bearer [REDACTED:API_KEY] used"]`},
		{"unicode escapes", `{"a":"sk-canary-Zq81\u002fx+y\u0026z"}`, `{"a":"[REDACTED:API_KEY]"}`},
		{"unicode escapes without a secret keep their bytes", `{"a":"\u00e9t\u00e9"}`, `{"a":"\u00e9t\u00e9"}`},
		{"a number", `{"pin":98765432,"n":1.50}`, `{"n":1.50,"pin":"[REDACTED:PIN]"}`},
		{"not JSON", `oops ` + canary, `oops [REDACTED:API_KEY]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.JSON(json.RawMessage(tt.in))
			require.Equal(t, tt.want, string(got))
			require.NotContains(t, string(got), "canary")
		})
	}
}

func TestScrubAnyAndError(t *testing.T) {
	s := secrets.NewScrubber(map[string]string{"API_KEY": canary})
	type detail struct {
		Header string `json:"header"`
	}
	got := s.Any([]detail{{Header: "Bearer " + canary}})
	b, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, `[{"header":"Bearer [REDACTED:API_KEY]"}]`, string(b))
	require.Equal(t, []string{"[REDACTED:API_KEY]"}, s.Any([]string{canary}))
	require.Equal(t, 3, s.Any(3))

	plain := errors.New("plain")
	require.Same(t, plain, s.Error(plain), "an error without a secret is kept, chain and all")
	te := envelope.NewToolError(envelope.CodeProviderError, "upstream rejected key %s", canary)
	wrapped := fmt.Errorf("call: %w", te)
	clean := s.Error(wrapped)
	require.Equal(t, "call: PROVIDER_ERROR: upstream rejected key [REDACTED:API_KEY]", clean.Error())
	require.Nil(t, s.Error(nil))
}

func TestScrubLogHandler(t *testing.T) {
	var buf bytes.Buffer
	s := secrets.NewScrubber(map[string]string{"API_KEY": canary})
	log := s.Logger(slog.New(slog.NewJSONHandler(&buf, nil)))
	log = log.With("bound", "k="+canary)
	log.WithGroup("g").Info("using "+canary,
		"plain", canary,
		"err", fmt.Errorf("boom: %s", canary),
		"any", map[string]string{"k": canary},
		slog.Group("grp", "inner", canary),
		"num", 7,
		canary, "as a key",
	)
	out := buf.String()
	require.NotContains(t, out, "canary", out)
	require.Contains(t, out, `"msg":"using [REDACTED:API_KEY]"`)
	require.Contains(t, out, `"bound":"k=[REDACTED:API_KEY]"`)
	require.Contains(t, out, `"num":7`)
	require.Contains(t, out, `"inner":"[REDACTED:API_KEY]"`)

	// Nothing to scrub: the logger is returned as it is.
	base := slog.New(slog.NewJSONHandler(&buf, nil))
	require.Same(t, base, secrets.NewScrubber(nil).Logger(base))
}

func FuzzScrubJSON(f *testing.F) {
	f.Add(`{"a":"`+canary+`"}`, canary)
	f.Add(`[1,2,"x"]`, "abcd")
	f.Add(`"\u0041BCD"`, "ABCD")
	f.Fuzz(func(t *testing.T, doc, secret string) {
		if len(secret) < secrets.MinValueSize {
			return
		}
		s := secrets.NewScrubber(map[string]string{"S": secret})
		out := s.JSON(json.RawMessage(doc))
		if json.Valid([]byte(doc)) {
			require.True(t, json.Valid(out), "valid JSON stays valid: %q", out)
			var v any
			require.NoError(t, json.Unmarshal(out, &v))
			// The decoded document holds the secret in no string.
			requireNoSecret(t, v, secret)
		}
	})
}

func requireNoSecret(t *testing.T, v any, secret string) {
	t.Helper()
	switch x := v.(type) {
	case string:
		require.NotContains(t, x, secret)
	case map[string]any:
		for k, e := range x {
			require.NotContains(t, k, secret)
			requireNoSecret(t, e, secret)
		}
	case []any:
		for _, e := range x {
			requireNoSecret(t, e, secret)
		}
	}
}

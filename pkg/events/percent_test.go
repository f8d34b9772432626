package events

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestPercentEncoding(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", ""},
		{"plain-ascii_/~:=;,", "plain-ascii_/~:=;,"},
		{"a b", "a%20b"},
		{`say "hi"`, "say%20%22hi%22"},
		{"100%", "100%25"},
		{"ü", "%C3%BC"},
		{"\x00\x1f\x7f\xff", "%00%1F%7F%FF"},
		{"line\r\nbreak", "line%0D%0Abreak"},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, percentEncode(tc.in), "encode %q", tc.in)
		got, err := percentDecode(tc.want)
		require.NoError(t, err)
		require.Equal(t, tc.in, got, "decode %q", tc.want)
	}
	// Lowercase hex digits, as other producers may write them, decode too.
	got, err := percentDecode("%c3%bc%2f")
	require.NoError(t, err)
	require.Equal(t, "ü/", got)
	// Printable ASCII that needs no encoding is accepted as sent.
	got, err = percentDecode("a+b")
	require.NoError(t, err)
	require.Equal(t, "a+b", got)

	for _, bad := range []string{"%", "%4", "a%", "%g0", "%0g", "%%", "ok%2"} {
		_, err := percentDecode(bad)
		require.Error(t, err, bad)
	}
}

// FuzzPercent checks that percentDecode inverts percentEncode and that the
// encoding holds only printable ASCII without space or '"', safe in a header.
func FuzzPercent(f *testing.F) {
	for _, s := range []string{"", "abc", "a b", `"q"`, "100%", "%41", "ünï", "\x00\r\n\x7f\xff", "🚀"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := percentEncode(s)
		for i := 0; i < len(enc); i++ {
			c := enc[i]
			if c <= ' ' || c >= 0x7f || c == '"' {
				t.Fatalf("percentEncode(%q) = %q has byte %q", s, enc, c)
			}
		}
		dec, err := percentDecode(enc)
		if err != nil {
			t.Fatalf("percentDecode(%q): %v", enc, err)
		}
		if dec != s {
			t.Fatalf("percentDecode(percentEncode(%q)) = %q", s, dec)
		}
	})
}

// FuzzHeaderValue: a header value decodes to what was encoded exactly when
// that was UTF-8, and is refused otherwise; a quoted form of a value decodes
// to the value too.
func FuzzHeaderValue(f *testing.F) {
	for _, s := range []string{"", "abc", "a b", `"q"`, "100%", "ünï", "\xff", "\xc0\xa0", "\xed\xa0\x80", "🚀", `a\b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := percentEncode(s)
		got, err := headerValue(enc)
		if !utf8.ValidString(s) {
			if err == nil {
				t.Fatalf("headerValue(%q) accepted a value that is not UTF-8: %q", enc, got)
			}
			return
		}
		if err != nil || got != s {
			t.Fatalf("headerValue(percentEncode(%q)) = %q, %v", s, got, err)
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(enc) + `"`
		if got, err := headerValue(quoted); err != nil || got != s {
			t.Fatalf("headerValue(%s) = %q, %v; want %q", quoted, got, err, s)
		}
	})
}

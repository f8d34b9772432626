package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MinCoreSize is the shortest value whose base64 is also scrubbed where it
// sits at any offset of a longer encoded byte string.
//
// Base64 encodes 3 bytes as 4 characters, so a value that follows 1 or 2
// other bytes is encoded in another phase: its characters differ from those
// of the value encoded alone, and the first and last one or two mix the
// value's bits with its neighbours'. For each phase p (0, 1, 2 bytes before
// the value) the scrubber knows the value's stable core: the characters that
// encode its bits only, from ceil(8p/6) to floor(8(p+n)/6) of the encoding of
// p zero bytes and the value. The core of a value of at least MinCoreSize
// (8) bytes is at least 10 characters (60 of the value's bits) in every
// phase, which no unrelated base64 text matches by chance; a shorter value's
// base64 is scrubbed only as a whole encoding of the value alone. The 1 to 3
// characters at either end of a core are left: they carry a few of the
// value's bits mixed with its neighbours'.
const MinCoreSize = 8

// forms returns every spelling of v the scrubber replaces (duplicates
// included): v; its base64 in the standard and URL alphabets, padded and
// not, and, for a value of at least MinCoreSize bytes, its cores in every
// phase; hex in lower and upper case; its percent-encodings
// (url.QueryEscape, url.PathEscape and every byte as %XX) with upper- and
// lower-case hex digits; and its JSON string escapes as common encoders
// write them.
func forms(v string) []string {
	out := make([]string, 1, 48)
	out[0] = v
	b := []byte(v)

	// Percent-encoding.
	for _, p := range []string{url.QueryEscape(v), url.PathEscape(v), percentAll(b)} {
		out = append(out, p, lowerPercent(p))
	}

	// Hex.
	h := hex.EncodeToString(b)
	out = append(out, h, strings.ToUpper(h))

	// Base64. A '/' of the standard alphabet may come JSON-escaped as "\/".
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		raw := enc.WithPadding(base64.NoPadding)
		b64 := []string{enc.EncodeToString(b), raw.EncodeToString(b)}
		if len(b) >= MinCoreSize {
			for p := 0; p < 3; p++ {
				b64 = append(b64, base64Core(raw, b, p))
			}
		}
		for _, f := range b64 {
			out = append(out, f)
			if strings.Contains(f, "/") {
				out = append(out, strings.ReplaceAll(f, "/", `\/`))
			}
		}
	}

	// JSON string escapes.
	goJSON, noHTML := jsonEscape(v), jsonEscapeNoHTML(v)
	out = append(out, goJSON, jsonEscape(goJSON), noHTML,
		strings.ReplaceAll(goJSON, "/", `\/`), strings.ReplaceAll(noHTML, "/", `\/`))
	if jsonPlain(v) {
		return out // every JSON escape of v is v
	}
	for o := jsonOpts(0); o < jsonOptsAll; o++ {
		out = append(out, jsonQuote(v, o))
	}
	return out
}

// base64Core is the part of the unpadded encoding of p bytes, then b, that
// encodes bits of b only (see MinCoreSize).
func base64Core(enc *base64.Encoding, b []byte, p int) string {
	e := enc.EncodeToString(append(make([]byte, p, p+len(b)), b...))
	start, end := (8*p+5)/6, 8*(p+len(b))/6
	return e[start:end]
}

// percentAll is b with every byte percent-encoded (%XX, upper case).
func percentAll(b []byte) string {
	const digits = "0123456789ABCDEF"
	out := make([]byte, 0, 3*len(b))
	for _, c := range b {
		out = append(out, '%', digits[c>>4], digits[c&15])
	}
	return string(out)
}

// lowerPercent is p with the hex digits of its %XX escapes in lower case.
func lowerPercent(p string) string {
	out := []byte(p)
	for i := 0; i+2 < len(out); i++ {
		if out[i] == '%' {
			out[i+1], out[i+2] = lowerHex(out[i+1]), lowerHex(out[i+2])
			i += 2
		}
	}
	return string(out)
}

func lowerHex(c byte) byte {
	if 'A' <= c && c <= 'F' {
		return c + 'a' - 'A'
	}
	return c
}

// jsonEscape is v as it appears between the quotes of a JSON string written
// by encoding/json (which escapes <, > and & as \u003c, \u003e, \u0026).
func jsonEscape(v string) string {
	b, err := json.Marshal(v)
	if err != nil || len(b) < 2 {
		return v
	}
	return string(b[1 : len(b)-1])
}

// jsonEscapeNoHTML is jsonEscape with HTML escaping off (SetEscapeHTML).
func jsonEscapeNoHTML(v string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return v
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) < 2 {
		return v
	}
	return string(b[1 : len(b)-1])
}

// jsonOpts are the choices JSON encoders differ in, as bits.
type jsonOpts uint8

const (
	// jsonHTML: <, >, &, = and ' as \u00XX (encoding/json, Gson).
	jsonHTML jsonOpts = 1 << iota
	// jsonASCII: every non-ASCII rune as \uXXXX, UTF-16 surrogates beyond
	// U+FFFF (Python's ensure_ascii, PHP).
	jsonASCII
	// jsonUpper: upper-case hex digits in \u escapes.
	jsonUpper
	// jsonSlash: '/' as "\/" (PHP, some Java encoders).
	jsonSlash
	jsonOptsAll
)

// jsonPlain reports whether no JSON encoder escapes a byte of v.
func jsonPlain(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c >= 0x7f || strings.IndexByte(`"\\<>&='/`, c) >= 0 {
			return false
		}
	}
	return true
}

// jsonQuote is v between the quotes of a JSON string written with o.
func jsonQuote(v string, o jsonOpts) string {
	digits := "0123456789abcdef"
	if o&jsonUpper != 0 {
		digits = "0123456789ABCDEF"
	}
	var b strings.Builder
	u := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(digits[r>>12&15])
		b.WriteByte(digits[r>>8&15])
		b.WriteByte(digits[r>>4&15])
		b.WriteByte(digits[r&15])
	}
	for i := 0; i < len(v); {
		c := v[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"':
				b.WriteString(`\"`)
			case c == '\\':
				b.WriteString(`\\`)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\r':
				b.WriteString(`\r`)
			case c == '\t':
				b.WriteString(`\t`)
			case c == '\b':
				b.WriteString(`\b`)
			case c == '\f':
				b.WriteString(`\f`)
			case c < 0x20 || c == 0x7f && o&jsonASCII != 0:
				u(rune(c))
			case o&jsonHTML != 0 && strings.IndexByte(`<>&='`, c) >= 0:
				u(rune(c))
			case o&jsonSlash != 0 && c == '/':
				b.WriteString(`\/`)
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(v[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			u(utf8.RuneError) // as encoding/json writes an invalid byte
		case o&jsonASCII != 0 && r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			u(r1)
			u(r2)
		case o&jsonASCII != 0 || r == '\u2028' || r == '\u2029':
			u(r)
		default:
			b.WriteString(v[i : i+size])
		}
		i += size
	}
	return b.String()
}

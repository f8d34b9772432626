package envelope_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// fuzzSeeds are inputs for both fuzzers: the spellings the canonical form must
// merge, the RFC 8785 examples, and documents the canonicalizer must refuse.
var fuzzSeeds = []string{
	``,
	`null`,
	`true`,
	` false `,
	`0`,
	`-0`,
	`1.0`,
	`1e0`,
	`10E-1`,
	`1e2`,
	`100`,
	`1e21`,
	`1e-7`,
	`0.000001`,
	`5e-324`,
	`1.7976931348623157e308`,
	`12345678901234567890`,
	`333333333.33333329`,
	`1e400`,
	`1e-400`,
	`""`,
	`"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"`,
	`"\ud83d\ude00"`,
	`"\ud800"`,
	`"\udc00"`,
	"\"\xff\"",
	"\"\xed\xa0\x80\"",
	`"<script>&"`,
	"\"\u2028\u2029\"",
	`[]`,
	`{}`,
	`[1,[2,[3,[4]]]]`,
	`{"b":1,"a":2}`,
	`{"a":1,"a":2}`,
	`{"a":1,"\u0061":2}`,
	`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew","1":"One","\ud83d\ude00":"Emoji","\u0080":"Control","\u00f6":"o"}`,
	`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"literals":[null,true,false]}`,
	`{"query":"weather in Paris","limit":3}`,
	`{ "c" : { "w" : null , "x" : "y" } , "b" : [ 1 , 2 ] , "a" : 1 }`,
	`{"":"empty","1":{"\n":56.0,"f":{"F":5,"f":"hi"}},"10":{},"111":[{"E":"no","e":"yes"}]}`,
	`{"a":`,
	`[1,]`,
	`nope`,
	`{"a":1}{"b":2}`,
	"\t\n[ 1 , 2 ]\r\n",
}

// FuzzCanonicalize checks the canonical form: it is valid UTF-8 JSON, a fixed
// point of Canonicalize, and means the same as the input.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := envelope.Canonicalize(in)
		if err != nil {
			if !errors.Is(err, envelope.ErrInvalidJSON) {
				t.Fatalf("Canonicalize(%q): error %v does not wrap ErrInvalidJSON", in, err)
			}
			if !json.Valid(in) {
				return
			}
			// Valid JSON may still be refused: RFC 8785 works on I-JSON, which
			// forbids duplicate keys, lone surrogates, invalid UTF-8 and
			// numbers beyond float64. Anything else must canonicalize.
			var v any
			if json.Unmarshal(in, &v) == nil && !hasDuplicateKeys(in) && utf8.Valid(in) && !bytes.Contains(in, []byte(`\u`)) {
				t.Fatalf("Canonicalize(%q) refused a plain document: %v", in, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("Canonicalize(%q) = %q: not valid JSON", in, out)
		}
		if !utf8.Valid(out) {
			t.Fatalf("Canonicalize(%q) = %q: not valid UTF-8", in, out)
		}
		again, err := envelope.Canonicalize(out)
		if err != nil {
			t.Fatalf("Canonicalize(%q) = %q, which does not canonicalize: %v", in, out, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q", in, out, again)
		}
		if bytes.ContainsAny(out, " \t\r\n") && !hasWhitespaceOnlyInStrings(out) {
			t.Fatalf("Canonicalize(%q) = %q: whitespace outside strings", in, out)
		}
		// Same meaning: decoded with encoding/json (float64 numbers), the input
		// and its canonical form are equal. Skip documents encoding/json cannot
		// hold (numbers beyond float64); an empty input canonicalizes to null.
		var want, got any
		if len(in) > 0 {
			if err := json.Unmarshal(in, &want); err != nil {
				return
			}
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("Canonicalize(%q) = %q: %v", in, out, err)
		}
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("meaning changed: %q decodes to %#v, canonical %q to %#v", in, want, out, got)
		}
	})
}

// FuzzCallID checks that the id depends on the input's meaning only: the input
// re-encoded by encoding/json (other key order, whitespace, escapes and number
// spellings) has the same id, and the seq always matters.
func FuzzCallID(f *testing.F) {
	for i, s := range fuzzSeeds {
		f.Add("web_search", "1.2.0", []byte(s), i)
	}
	f.Add("calculator", "2.0.0-rc.1", []byte(`{"expr":"1+1","precision":1e1}`), 0)
	f.Add("x", "0.0.1", []byte(`[{"b":1e2,"a":"\u00e9"}]`), -3)
	f.Fuzz(func(t *testing.T, name, version string, in []byte, seq int) {
		id, err := envelope.CallID(name, version, in, seq)
		if err != nil {
			if !errors.Is(err, envelope.ErrInvalidJSON) {
				t.Fatalf("CallID(%q): error %v does not wrap ErrInvalidJSON", in, err)
			}
			return
		}
		if len(id) != 64 || !isLowerHex(id) {
			t.Fatalf("CallID = %q: not 64 lowercase hex digits", id)
		}
		if len(in) == 0 {
			return
		}
		var v any
		if err := json.Unmarshal(in, &v); err != nil {
			return // valid for RFC 8785 but beyond encoding/json's float64
		}
		for _, re := range [][]byte{mustJSON(t, v), mustIndent(t, v)} {
			reID, err := envelope.CallID(name, version, re, seq)
			if err != nil {
				t.Fatalf("CallID(%q) ok but re-encoded %q fails: %v", in, re, err)
			}
			if reID != id {
				t.Fatalf("CallID differs: %q -> %s, re-encoded %q -> %s", in, id, re, reID)
			}
		}
		if other, err := envelope.CallID(name, version, in, seq+1); err != nil || other == id {
			t.Fatalf("seq %d and %d give the same id %s (%v)", seq, seq+1, id, err)
		}
		// The cache key ignores seq and is scoped by tenant.
		k1, err1 := envelope.CacheKey("tenant-a", name, version, in)
		k2, err2 := envelope.CacheKey("tenant-a", name, version, mustJSON(t, v))
		k3, err3 := envelope.CacheKey("tenant-b", name, version, in)
		if err1 != nil || err2 != nil || err3 != nil || k1 != k2 || k1 == k3 {
			t.Fatalf("cache keys of %q: %s %s %s (%v %v %v)", in, k1, k2, k3, err1, err2, err3)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustIndent(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "\n ", "\t")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// hasDuplicateKeys reports whether any object of the valid JSON document in
// repeats a key (after unescaping).
func hasDuplicateKeys(in []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(in))
	type frame struct {
		obj    bool
		keys   map[string]bool
		expect bool // next string token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{':
				if top != nil && top.obj {
					top.expect = true
				}
				stack = append(stack, &frame{obj: true, keys: map[string]bool{}, expect: true})
			case '[':
				if top != nil && top.obj {
					top.expect = true
				}
				stack = append(stack, &frame{})
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			if top != nil && top.obj {
				if top.expect {
					if top.keys[tok] {
						return true
					}
					top.keys[tok] = true
					top.expect = false
				} else {
					top.expect = true
				}
			}
		default:
			if top != nil && top.obj {
				top.expect = true
			}
		}
	}
}

// hasWhitespaceOnlyInStrings reports whether every whitespace byte of the
// JSON document out is inside a string.
func hasWhitespaceOnlyInStrings(out []byte) bool {
	in, esc := false, false
	for _, c := range out {
		switch {
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			return false
		}
	}
	return true
}

// FuzzToolMetadataIdempotent checks that Validate and the JSON Schema agree
// on the metadata a definition may declare: side effects, cache and
// idempotent retries (only a writes tool may declare them), whatever the
// strings are.
func FuzzToolMetadataIdempotent(f *testing.F) {
	for _, se := range []string{"none", "reads", "writes", "WRITES", ""} {
		for _, cache := range []string{"none", "ttl", "forever", "always"} {
			f.Add(se, cache, true)
			f.Add(se, cache, false)
		}
	}
	s, err := envelope.NewSchemas(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, sideEffects, cache string, idempotent bool) {
		d := fixtureToolDefinition()
		d.Metadata.SideEffects = envelope.SideEffects(sideEffects)
		d.Metadata.Cache = envelope.CachePolicy(cache)
		d.Metadata.Idempotent = idempotent
		verr := d.Validate()
		serr := s.ValidateValue(envelope.SchemaToolDefinition, d)
		if (verr == nil) != (serr == nil) {
			t.Fatalf("side_effects %q, cache %q, idempotent %t: Validate says %v, the schema %v", sideEffects, cache, idempotent, verr, serr)
		}
		if idempotent && d.Metadata.SideEffects != envelope.SideEffectsWrites {
			if verr == nil || !strings.Contains(verr.Error(), "metadata.idempotent is only for a tool whose side_effects is writes") {
				t.Fatalf("side_effects %q declares idempotent: %v", sideEffects, verr)
			}
		}
		if verr == nil && d.RetriesWrites() != (idempotent && d.Metadata.SideEffects == envelope.SideEffectsWrites) {
			t.Fatalf("RetriesWrites = %t for side_effects %q, idempotent %t", d.RetriesWrites(), sideEffects, idempotent)
		}
	})
}

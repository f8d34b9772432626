package envelope_test

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

func TestCanonicalize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"empty is null", ``, `null`},
		{"null", ` null `, `null`},
		{"literals", `[true , false,null]`, `[true,false,null]`},
		{"keys sorted", `{"b":1,"a":2,"c":{"z":0,"y":[]}}`, `{"a":2,"b":1,"c":{"y":[],"z":0}}`},
		{"whitespace dropped", "{\n\t\"a\" : [ 1 ,\r\n 2 ]\n}\n", `{"a":[1,2]}`},
		{"integer spellings", `[1, 1.0, 1e0, 10E-1, 1.000e+0, 0.1e1]`, `[1,1,1,1,1,1]`},
		{"hundred", `[100, 1e2, 1E+2, 100.00, 1000e-1]`, `[100,100,100,100,100]`},
		{"negative zero", `[-0, -0.0, 0e10]`, `[0,0,0]`},
		{"fractions", `[0.5, 5e-1, 2.50, -1.25E0]`, `[0.5,0.5,2.5,-1.25]`},
		{"exponent threshold", `[1e20, 1e21, 0.000001, 0.0000001]`, `[100000000000000000000,1e+21,0.000001,1e-7]`},
		{"big integer loses precision like ECMAScript", `12345678901234567890`, `12345678901234567000`},
		{"string escapes normalized", `"\u0041\/\u00e9\u00E9\t\u001f"`, "\"A/\u00e9\u00e9\\t\\u001f\""},
		{"control characters", "\"\\u0000\\b\\f\\n\\r\\u000b\"", `"\u0000\b\f\n\r\u000b"`},
		{"non-ASCII kept raw", `"€ 😀 \u2028"`, "\"€ 😀 \u2028\""},
		{"surrogate pair", `"\ud83d\ude00"`, `"😀"`},
		{"html not escaped", `"<a&b>"`, `"<a&b>"`},
		{"nested", `{"x":[{"b":{"d":1,"c":2},"a":[]}]}`, `{"x":[{"a":[],"b":{"c":2,"d":1}}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envelope.Canonicalize([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

// TestCanonicalizeRFC8785 pins the examples of RFC 8785 itself.
func TestCanonicalizeRFC8785(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{
			// RFC 8785 section 3.2.2 (and Appendix A's input).
			name: "3.2.2 primitive data types",
			in: `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`,
			want: `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		{
			// RFC 8785 section 3.2.3: keys sorted by UTF-16 code units, so the
			// emoji (a surrogate pair, 0xD83D...) sorts before U+FB33.
			name: "3.2.3 sorting of properties",
			in: `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`,
			want: `{"\r":"Carriage Return","1":"One","` + "\u0080" + `":"Control","ö":"Latin Small Letter O With Diaeresis","€":"Euro Sign","😀":"Emoji: Grinning Face","` + "\ufb33" + `":"Hebrew Letter Dalet With Dagesh"}`,
		},
		{
			// Sorting is recursive and by code unit: "F" < "f", "10" < "111".
			name: "structures",
			in: `{
  "1": {"f": {"f": "hi","F": 5} ,"\n": 56.0},
  "10": { },
  "": "empty",
  "a": { },
  "111": [ {"e": "yes","E": "no" } ],
  "A": { }
}`,
			want: `{"":"empty","1":{"\n":56,"f":{"F":5,"f":"hi"}},"10":{},"111":[{"E":"no","e":"yes"}],"A":{},"a":{}}`,
		},
		{
			// No locale-aware ordering.
			name: "french",
			in:   `{"peach":"This sorting order","péché":"is wrong according to French","pêche":"but canonicalization MUST","sin":"ignore locale"}`,
			want: `{"peach":"This sorting order","péché":"is wrong according to French","pêche":"but canonicalization MUST","sin":"ignore locale"}`,
		},
		{
			// No Unicode normalization (section 3.2.4 leaves strings as they are).
			name: "unnormalized unicode",
			in:   `{"Unnormalized Unicode":"A\u030a"}`,
			want: "{\"Unnormalized Unicode\":\"A\u030a\"}",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envelope.Canonicalize([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

// TestCanonicalizeRFC8785Numbers runs the number serialization samples of RFC
// 8785 Appendix B: IEEE 754 bit patterns and their ECMAScript spelling.
func TestCanonicalizeRFC8785Numbers(t *testing.T) {
	tests := []struct {
		bits string
		want string // empty: not representable in JSON
	}{
		{"0000000000000000", "0"},
		{"8000000000000000", "0"}, // minus zero
		{"0000000000000001", "5e-324"},
		{"8000000000000001", "-5e-324"},
		{"7fefffffffffffff", "1.7976931348623157e+308"},
		{"ffefffffffffffff", "-1.7976931348623157e+308"},
		{"4340000000000000", "9007199254740992"},
		{"c340000000000000", "-9007199254740992"},
		{"4430000000000000", "295147905179352830000"},
		{"7fffffffffffffff", ""}, // NaN
		{"7ff0000000000000", ""}, // Infinity
		{"44b52d02c7e14af5", "9.999999999999997e+22"},
		{"44b52d02c7e14af6", "1e+23"},
		{"44b52d02c7e14af7", "1.0000000000000001e+23"},
		{"444b1ae4d6e2ef4e", "999999999999999700000"},
		{"444b1ae4d6e2ef4f", "999999999999999900000"},
		{"444b1ae4d6e2ef50", "1e+21"},
		{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
		{"3eb0c6f7a0b5ed8d", "0.000001"},
		{"41b3de4355555553", "333333333.3333332"},
		{"41b3de4355555554", "333333333.33333325"},
		{"41b3de4355555555", "333333333.3333333"},
		{"41b3de4355555556", "333333333.3333334"},
		{"41b3de4355555557", "333333333.33333343"},
		{"becbf647612f3696", "-0.0000033333333333333333"},
		{"43143ff3c1cb0959", "1424953923781206.2"},
	}
	for _, tc := range tests {
		t.Run(tc.bits, func(t *testing.T) {
			u, err := strconv.ParseUint(tc.bits, 16, 64)
			require.NoError(t, err)
			f := math.Float64frombits(u)
			if tc.want == "" {
				require.True(t, math.IsNaN(f) || math.IsInf(f, 0))
				return
			}
			// Feed the value in two different spellings: Go's exact 17-digit
			// exponent form and its shortest form.
			for _, in := range []string{strconv.FormatFloat(f, 'e', 16, 64), strconv.FormatFloat(f, 'g', -1, 64)} {
				got, err := envelope.Canonicalize([]byte(in))
				require.NoError(t, err, in)
				require.Equal(t, tc.want, string(got), "from %s", in)
			}
		})
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"truncated", `{"a":`},
		{"missing value", `{"a":}`},
		{"bare word", `nope`},
		{"two documents", `{"a":1}{"b":2}`},
		{"trailing comma", `[1,]`},
		{"single quotes", `{'a':1}`},
		{"NaN", `NaN`},
		{"leading zero", `01`},
		{"hex number", `0x10`},
		{"plus sign", `+1`},
		{"whitespace only", "  \n"},
		{"raw control character in string", "\"a\tb\""},
		{"invalid UTF-8", "\"\xff\""},
		// Valid JSON that I-JSON (RFC 7493), and so RFC 8785, rejects.
		{"duplicate key", `{"a":1,"a":2}`},
		{"duplicate key after escaping", `{"a":1,"\u0061":2}`},
		{"lone high surrogate", `"\ud800"`},
		{"lone low surrogate", `"\udc00x"`},
		{"number out of range", `1e400`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := envelope.Canonicalize([]byte(tc.in))
			require.ErrorIs(t, err, envelope.ErrInvalidJSON)
			_, err = envelope.CallID("x", "1.0.0", []byte(tc.in), 1)
			require.ErrorIs(t, err, envelope.ErrInvalidJSON)
			_, err = envelope.CacheKey("t", "x", "1.0.0", []byte(tc.in))
			require.ErrorIs(t, err, envelope.ErrInvalidJSON)
		})
	}
}

// TestCallIDGolden pins call ids: they are persisted (tools_by_id keys, cache
// entries, event ids), so the hash must never change.
func TestCallIDGolden(t *testing.T) {
	tests := []struct {
		name, version, input string
		seq                  int
		want                 string
	}{
		// Hand-checked: printf 'web_search@1.2.0\n{"limit":3,"query":"weather in Paris"}\n1' | sha256sum
		{"web_search", "1.2.0", `{"query": "weather in Paris", "limit": 3}`, 1, "066655da5b7b0087a25fa02037c63a78e8989ccc2168d9bbba4d1cb53d6d428e"},
		// Hand-checked: printf 'calculator@2.0.0\n{"expr":"1+1"}\n2' | sha256sum
		{"calculator", "2.0.0", `{"expr":"1+1"}`, 2, "c00c5196cda5f0bb04634b1080041cd0f8ef355fc6286e4dcdc87f06dea53f8a"},
		// Hand-checked: printf 'noop@0.0.1\nnull\n0' | sha256sum (empty input is null)
		{"noop", "0.0.1", ``, 0, "4157db7dc6a0104b14d793a908b81dc42a7f929415f870b4c3339da433bbf9a7"},
		{"http_request", "1.0.0-rc.1", `{"url":"https://example.com/big","method":"GET"}`, 3, "c1e8fbb7d45569ec45e99e6508c54a3ebbd1bd1004ed5da3111bef9d5273b6f3"},
		// The rest were checked the same way against their canonical preimages.
		{"web_search", "1.2.0", `{"query":"weather in Paris","limit":3}`, 2, "bf866395172599216ec60e8394757eb47e55eda317dce750cc5fd516d13b8fdd"},
		{"web_search", "1.2.1", `{"query":"weather in Paris","limit":3}`, 1, "058b2fa13e17ca4dcde984601f302ab9a43dd0c36fcce2d2ef45a33b22dfaf4e"},
		{"sql", "3.0.0", `{"q":"SELECT 1","params":[1.5,-0,"é",null,true],"opts":{"z":1,"a":{"y":2,"b":3}}}`, 42, "5a8f4591031b2a4a788ed5ae9a38b8c98abcf811912065441deccf0a2d726cd3"},
	}
	for _, tc := range tests {
		t.Run(tc.name+"@"+tc.version+"#"+strconv.Itoa(tc.seq), func(t *testing.T) {
			got, err := envelope.CallID(tc.name, tc.version, []byte(tc.input), tc.seq)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestCallIDPreimage recomputes the id from its documented preimage:
// sha256("name@version\n" + canonical(input) + "\n" + seq).
func TestCallIDPreimage(t *testing.T) {
	input := `{"b":[1.0,2e0],"a":"\u00e9"}`
	canon, err := envelope.Canonicalize([]byte(input))
	require.NoError(t, err)
	require.Equal(t, `{"a":"é","b":[1,2]}`, string(canon))
	sum := sha256.Sum256([]byte("tool@1.0.0\n" + string(canon) + "\n17"))
	got, err := envelope.CallID("tool", "1.0.0", []byte(input), 17)
	require.NoError(t, err)
	require.Equal(t, hex.EncodeToString(sum[:]), got)
	require.Regexp(t, `^[0-9a-f]{64}$`, got)
}

// TestCallIDEquivalentSpellings: the same input written differently has the
// same id.
func TestCallIDEquivalentSpellings(t *testing.T) {
	tests := []struct {
		name      string
		spellings []string
	}{
		{"key order and whitespace", []string{
			`{"a":1,"b":[1,2],"c":{"x":"y","w":null}}`,
			`{ "c" : { "w" : null , "x" : "y" } , "b" : [ 1 , 2 ] , "a" : 1 }`,
			"\n\t{\"b\":[1,2],\n\"c\":{\"x\":\"y\",\"w\":null},\"a\":1}\r\n",
		}},
		{"one", []string{`{"n":1}`, `{"n":1.0}`, `{"n":1e0}`, `{"n":10E-1}`, `{"n":1.00E+0}`, `{"n":0.1e1}`}},
		{"hundred", []string{`{"n":100}`, `{"n":1e2}`, `{"n":1E2}`, `{"n":1e+2}`, `{"n":100.0}`, `{"n":10000e-2}`}},
		{"zero", []string{`{"n":0}`, `{"n":-0}`, `{"n":0.0}`, `{"n":0e5}`, `{"n":-0E-3}`}},
		{"string escapes", []string{`{"s":"é/"}`, `{"s":"\u00e9\/"}`, `{"s":"\u00E9/"}`}},
		{"nested numbers", []string{`[{"x":2.50,"y":[3e1]}]`, `[{"y":[30],"x":2.5}]`, `[ { "y" : [ 30.000 ] , "x" : 25e-1 } ]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := mustCallID(t, "web_search", "1.2.0", tc.spellings[0], 3)
			wantKey, err := envelope.CacheKey("acme", "web_search", "1.2.0", []byte(tc.spellings[0]))
			require.NoError(t, err)
			for _, s := range tc.spellings[1:] {
				require.Equal(t, want, mustCallID(t, "web_search", "1.2.0", s, 3), "spelling %s", s)
				key, err := envelope.CacheKey("acme", "web_search", "1.2.0", []byte(s))
				require.NoError(t, err)
				require.Equal(t, wantKey, key, "spelling %s", s)
			}
		})
	}
}

// TestCallIDDistinguishes: anything that changes the call changes the id.
func TestCallIDDistinguishes(t *testing.T) {
	base := mustCallID(t, "web_search", "1.2.0", `{"q":"a","n":1}`, 1)
	tests := []struct {
		name, tool, version, input string
		seq                        int
	}{
		{"other seq", "web_search", "1.2.0", `{"q":"a","n":1}`, 2},
		{"seq zero", "web_search", "1.2.0", `{"q":"a","n":1}`, 0},
		{"negative seq", "web_search", "1.2.0", `{"q":"a","n":1}`, -1},
		{"other version", "web_search", "1.2.1", `{"q":"a","n":1}`, 1},
		{"prerelease", "web_search", "1.2.0-rc.1", `{"q":"a","n":1}`, 1},
		{"other tool", "web_fetch", "1.2.0", `{"q":"a","n":1}`, 1},
		{"other value", "web_search", "1.2.0", `{"q":"b","n":1}`, 1},
		{"other number", "web_search", "1.2.0", `{"q":"a","n":1.5}`, 1},
		{"number as string", "web_search", "1.2.0", `{"q":"a","n":"1"}`, 1},
		{"key case", "web_search", "1.2.0", `{"Q":"a","n":1}`, 1},
		{"extra key", "web_search", "1.2.0", `{"q":"a","n":1,"x":null}`, 1},
		{"array instead", "web_search", "1.2.0", `["q","a","n",1]`, 1},
		{"null input", "web_search", "1.2.0", ``, 1},
	}
	seen := map[string]string{base: "base"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := mustCallID(t, tc.tool, tc.version, tc.input, tc.seq)
			prev, dup := seen[id]
			require.False(t, dup, "same id as %s", prev)
			seen[id] = tc.name
		})
	}
	// Array order is significant.
	require.NotEqual(t, mustCallID(t, "t", "1.0.0", `[1,2]`, 1), mustCallID(t, "t", "1.0.0", `[2,1]`, 1))
	// The separators keep name, version and seq apart.
	require.NotEqual(t, mustCallID(t, "a", "1.0.0", `1`, 11), mustCallID(t, "a", "1.0.0", `11`, 1))
}

func TestCacheKey(t *testing.T) {
	in := []byte(`{"query":"weather in Paris","limit":3}`)
	key, err := envelope.CacheKey("acme/research/u-42", "web_search", "1.2.0", in)
	require.NoError(t, err)
	// Hand-checked: printf 'acme/research/u-42\nweb_search@1.2.0\n{"limit":3,"query":"weather in Paris"}' | sha256sum
	require.Equal(t, "94e19e781e9727cf63750215a87c2e22dfb825d55821d8085f56e7f0473f2bde", key)

	t.Run("same tenant same key", func(t *testing.T) {
		again, err := envelope.CacheKey("acme/research/u-42", "web_search", "1.2.0", []byte(`{ "limit": 3.0, "query": "weather in Paris" }`))
		require.NoError(t, err)
		require.Equal(t, key, again)
	})
	t.Run("tenants differ", func(t *testing.T) {
		other, err := envelope.CacheKey("globex/research/u-42", "web_search", "1.2.0", in)
		require.NoError(t, err)
		require.NotEqual(t, key, other)
		tenantA := envelope.Tenant{OrgID: "acme", WorkspaceID: "w1"}
		tenantB := envelope.Tenant{OrgID: "acme", WorkspaceID: "w2"}
		a, err := envelope.CacheKey(tenantA.ID(), "web_search", "1.2.0", in)
		require.NoError(t, err)
		b, err := envelope.CacheKey(tenantB.ID(), "web_search", "1.2.0", in)
		require.NoError(t, err)
		require.NotEqual(t, a, b)
	})
	t.Run("independent of seq", func(t *testing.T) {
		// Two calls of a run differ in their ids only by seq and share the key.
		id1 := mustCallID(t, "web_search", "1.2.0", string(in), 1)
		id2 := mustCallID(t, "web_search", "1.2.0", string(in), 2)
		require.NotEqual(t, id1, id2)
		require.NotEqual(t, key, id1)
		require.NotEqual(t, key, id2)
	})
	t.Run("version and input matter", func(t *testing.T) {
		v, err := envelope.CacheKey("acme/research/u-42", "web_search", "1.3.0", in)
		require.NoError(t, err)
		require.NotEqual(t, key, v)
		i, err := envelope.CacheKey("acme/research/u-42", "web_search", "1.2.0", []byte(`{"query":"weather in Rome","limit":3}`))
		require.NoError(t, err)
		require.NotEqual(t, key, i)
	})
	t.Run("tenant required", func(t *testing.T) {
		_, err := envelope.CacheKey("", "web_search", "1.2.0", in)
		require.ErrorIs(t, err, envelope.ErrMissingTenant)
	})
}

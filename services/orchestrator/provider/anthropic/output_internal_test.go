package anthropic

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// decode feeds input to a fresh decoder in pieces cut at the offsets of
// cuts (each byte an offset, modulo the input's length), and joins what
// it gives.
func decode(unwrap bool, input string, cuts []byte) string {
	o := outputText{unwrap: unwrap}
	var out string
	at := 0
	for _, c := range cuts {
		if len(input) == 0 {
			break
		}
		end := max(at, int(c)%(len(input)+1))
		out += o.write(input[at:end])
		at = end
	}
	return out + o.write(input[at:])
}

// unwrapped is what an unwrapped answer must be for a valid JSON input:
// the compact value of its one top-level "value" member; ok false when
// there is not exactly one (the decoder's answer is then not defined by
// the JSON alone).
func unwrapped(t *testing.T, input string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader([]byte(input)))
	tok, err := dec.Token()
	if err != nil {
		return "", false
	}
	if tok != json.Delim('{') {
		return "", true // not an object: no value
	}
	var found []json.RawMessage
	for dec.More() {
		key, err := dec.Token()
		require.NoError(t, err)
		var v json.RawMessage
		require.NoError(t, dec.Decode(&v))
		if key == "value" {
			found = append(found, v)
		}
	}
	switch len(found) {
	case 0:
		return "", true
	case 1:
		var b bytes.Buffer
		require.NoError(t, json.Compact(&b, found[0]))
		return b.String(), true
	}
	return "", false
}

func TestOutputText(t *testing.T) {
	for _, tc := range []struct {
		input, compact, unwrapped string
	}{
		{`{ "a" : [1, 2, {"b": " x y "}] }`, `{"a":[1,2,{"b":" x y "}]}`, ``},
		{`{"value": {"k": "a \"q\" } ] ,"}, "other": 1}`, `{"value":{"k":"a \"q\" } ] ,"},"other":1}`, `{"k":"a \"q\" } ] ,"}`},
		{`{"other": {"value": 1}, "value" : [ 1 , "2" ] }`, `{"other":{"value":1},"value":[1,"2"]}`, `[1,"2"]`},
		{`{"\u0076alue": 7}`, `{"\u0076alue":7}`, `7`},
		{`{"value": "\\"}`, `{"value":"\\"}`, `"\\"`},
		{"\t[1,\n2]\r\n", `[1,2]`, ``},
		{`42`, `42`, ``},
		{`{"value": {"unterminated": [1, 2`, `{"value":{"unterminated":[1,2`, `{"unterminated":[1,2`},
		{``, ``, ``},
	} {
		require.Equal(t, tc.compact, decode(false, tc.input, nil), tc.input)
		require.Equal(t, tc.unwrapped, decode(true, tc.input, nil), tc.input)
		for cut := range len(tc.input) {
			require.Equal(t, tc.compact, decode(false, tc.input, []byte{byte(cut)}), "%s cut at %d", tc.input, cut)
			require.Equal(t, tc.unwrapped, decode(true, tc.input, []byte{byte(cut)}), "%s cut at %d", tc.input, cut)
		}
	}
}

// The decoder of the output tool's input gives the same text however the
// input is cut into pieces; for valid JSON, that text is json.Compact's,
// or, unwrapping, the compact value of the input's "value" member.
func FuzzOutputText(f *testing.F) {
	for _, s := range []string{
		`{"value": [1, 2, 3]}`, `{ "answer" : "4 2", "n": 42 }`, `{"value":"\"}\\"}`, `{"a":{"value":1},"value":{"b":[{}]}}`,
		`[{"value": 1}]`, `"value"`, `{"value": `, `{"value"}`, `}]{`, "{\"value\":\"\xff\"}",
	} {
		f.Add(s, []byte{3, 7, 200})
	}
	f.Fuzz(func(t *testing.T, input string, cuts []byte) {
		for _, unwrap := range []bool{false, true} {
			whole := decode(unwrap, input, nil)
			if got := decode(unwrap, input, cuts); got != whole {
				t.Fatalf("unwrap %v: %q in pieces at %v gives %q, whole %q", unwrap, input, cuts, got, whole)
			}
		}
		if !json.Valid([]byte(input)) {
			return
		}
		var b bytes.Buffer
		require.NoError(t, json.Compact(&b, []byte(input)))
		require.Equal(t, b.String(), decode(false, input, cuts), "compact")
		if want, ok := unwrapped(t, input); ok {
			require.Equal(t, want, decode(true, input, cuts), "unwrapped")
		}
	})
}

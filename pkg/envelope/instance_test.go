package envelope

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

// The fast reading of a document to validate takes exactly the documents
// jsonschema.UnmarshalJSON takes, and reads them to the same values.
func FuzzDecodeInstance(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `null`, `1`, `-0.5e+10`, `"x"`, `{"a":1,"a":2}`, ` {"a" : [1, 2.0, true, null]} `,
		`{"a":"\u00e9\ud83d\ude00"}`, "\"\xff\xfe\"", `{"a":1}x`, `{"a":1} {}`, `01`, `1.`, `{"a":}`, `"\ud800"`,
		`123456789012345678901234567890`, "\t[\n]\r", `{"a":"<&>"}`, `[1,]`, `{,}`, `tru`, `"\x01"`} {
		f.Add([]byte(s))
	}
	if files, err := filepath.Glob("testdata/*/*.json"); err == nil {
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, wantErr := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		got, err := decodeInstance(raw)
		if wantErr != nil {
			require.Error(t, err, "decodeInstance took %q, which jsonschema refuses: %v", raw, wantErr)
			require.Equal(t, wantErr.Error(), err.Error())
			return
		}
		require.NoError(t, err, "decodeInstance refused %q", raw)
		require.Equal(t, want, got, "document %q", raw)
	})
}

// AgentOutputs encode to the bytes encoding/json writes for them.
func FuzzAgentOutputsJSON(f *testing.F) {
	f.Add([]byte(`{"response":"done <&> \u2028","tools_by_id":{"b":{"call_id":"b","name":"echo","version":"1.0.0","input":{"z":1, "a":[1.50,2e3]},"output":"x","t_start":"2026-01-02T03:04:05.123456789Z","t_end":"2026-01-02T03:04:05Z"},"a":{"call_id":"a","input":null}},"tool_order":["b","a"],"last_tool":{"call_id":"b","input":{}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"response":"\ud83d\ude00 \u0000 \"","traces_url":"http://x/?a=1&b=<2>"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var o AgentOutputs
		if json.Unmarshal(data, &o) != nil {
			return
		}
		type plain AgentOutputs
		want, werr := json.Marshal(plain(o.WithCollections()))
		got, err := o.MarshalJSON()
		if werr != nil {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	})
}

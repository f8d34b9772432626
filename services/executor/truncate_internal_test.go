package executor

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// boundOf is never below what an envelope without an error weighs encoded,
// however its bytes escape: the fast path of fits trusts it.
func TestBoundOfIsAnUpperBound(t *testing.T) {
	worst := strings.Repeat("<\x01&>", 1000)
	str := func(s string) json.RawMessage {
		b, err := json.Marshal(s)
		require.NoError(t, err)
		return b
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 123456789, time.UTC)
	for name, env := range map[string]envelope.ToolEnvelope{
		"empty":   {},
		"plain":   {CallID: strings.Repeat("a", 64), Name: "echo", Version: "1.0.0", Input: json.RawMessage(`{"text":"hi"}`), Output: json.RawMessage(`{"text":"hi"}`), TStart: now, TEnd: now},
		"escapes": {CallID: strings.Repeat("a", 64), Name: "echo", Version: "1.0.0", Input: str(worst), Output: str(worst), TStart: now, TEnd: now, Cost: 0.125, Cached: true, Truncated: true},
		"unicode": {Name: strings.Repeat("é", 200), Version: strings.Repeat("\u2028", 50), Input: str(strings.Repeat("\u2029ü", 500)), TStart: now, TEnd: now},
		"attachments": {Name: "fetch", Version: "1.0.0", Input: json.RawMessage(`{}`), Attachments: []envelope.Attachment{
			{Kind: envelope.AttachmentBlob, URL: "toolwire-blob://" + strings.Repeat("<", 300), ContentType: "application/json", Bytes: 1 << 40},
			{Kind: envelope.AttachmentBlob, URL: strings.Repeat("&", 100), Bytes: 1},
		}},
	} {
		b, err := json.Marshal(&env)
		require.NoError(t, err)
		require.LessOrEqual(t, len(b), boundOf(&env), name)
	}
}

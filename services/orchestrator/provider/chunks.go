package provider

import (
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// DefaultChunkBytes is the size of the pieces Chunks cuts an answer into: a
// few tokens, as a provider streams them.
const DefaultChunkBytes = 16

// Chunks streams a whole answer as a provider would: its text in pieces of
// at most size bytes (cut between runes), then each tool call, its id and
// name first, then its arguments' text in pieces of size bytes. What the
// pieces add up to is resp. The models that have their answer at once (the
// scripted and replay providers) stream through it.
func Chunks(resp envelope.ModelResponse, size int, onDelta func(Delta)) {
	if size < 1 {
		size = DefaultChunkBytes
	}
	for _, piece := range split(resp.Content, size) {
		onDelta(Delta{Text: piece})
	}
	for i, tc := range resp.ToolCalls {
		onDelta(Delta{ToolCall: &ToolCallDelta{Index: i, ID: tc.ID, Name: tc.Name}})
		for _, piece := range split(string(tc.Arguments), size) {
			onDelta(Delta{ToolCall: &ToolCallDelta{Index: i, Arguments: piece}})
		}
	}
}

// split cuts s into pieces of at most size bytes, never inside a rune (a
// rune longer than size is a piece of its own).
func split(s string, size int) []string {
	var out []string
	for len(s) > 0 {
		n := min(size, len(s))
		for n < len(s) && n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		if n == 0 {
			_, n = utf8.DecodeRuneInString(s)
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

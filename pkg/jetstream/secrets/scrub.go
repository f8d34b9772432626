package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
)

// Scrubber replaces secret values in strings, JSON, any Go value and log
// records by "[REDACTED:NAME]". Besides each value it replaces the value's
// common encodings (see forms: base64 in both alphabets, padded or not and at
// any offset of a longer encoded string, hex, percent-encodings and JSON
// string escapes), so that a secret echoed inside a query string, a JSON
// text held in a string, a binary body shown as base64 or a hex dump is
// caught too. The set of spellings is built once, with the scrubber, into
// one automaton that scans a string in one pass.
//
// It does not see a value that the tool transformed otherwise: split,
// reversed, compressed, hashed or encrypted, encoded in a way not listed
// (base32, line-wrapped base64, mixed-case hex), or wrapped in several
// layers of encoding. Tools must not do that with secrets.
//
// Where spellings overlap (two secrets sharing bytes, a value next to its
// own encoding) the whole overlapping stretch is replaced, so that no part
// of either is left.
//
// The zero Scrubber and a nil *Scrubber scrub nothing.
type Scrubber struct {
	m       *matcher
	markers []string // by pattern id
}

// NewScrubber returns a scrubber of the named values (name to value).
func NewScrubber(values map[string]string) *Scrubber {
	names := make([]string, 0, len(values))
	for name, v := range values {
		if v != "" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return &Scrubber{}
	}
	sort.Strings(names) // a spelling two values share is the first name's
	s := &Scrubber{}
	var pats []string
	var ids []int32
	seen := map[string]bool{}
	for _, name := range names {
		id := int32(len(s.markers))
		s.markers = append(s.markers, "[REDACTED:"+name+"]")
		for _, f := range forms(values[name]) {
			if f != "" && !seen[f] {
				seen[f] = true
				pats = append(pats, f)
				ids = append(ids, id)
			}
		}
	}
	s.m = newMatcher(pats, ids)
	return s
}

// Empty reports whether the scrubber has nothing to scrub.
func (s *Scrubber) Empty() bool { return s == nil || s.m == nil }

// String scrubs a string. A string without a secret is returned as it is,
// without copying.
func (s *Scrubber) String(v string) string {
	if s.Empty() {
		return v
	}
	found := s.m.find(v)
	if len(found) == 0 {
		return v
	}
	var b strings.Builder
	b.Grow(len(v))
	last := 0 // v[:last] is written
	for i := 0; i < len(found); {
		// A stretch of overlapping occurrences: the longest at its start,
		// then each that reaches further, is replaced as a whole.
		f := found[i]
		b.WriteString(v[last:f.start])
		b.WriteString(s.markers[f.id])
		prev, end := f.id, f.end
		for i++; i < len(found) && found[i].start < end; i++ {
			if g := found[i]; g.end > end {
				if g.id != prev {
					b.WriteString(s.markers[g.id])
					prev = g.id
				}
				end = g.end
			}
		}
		last = end
	}
	b.WriteString(v[last:])
	return b.String()
}

// Contains reports whether v holds a secret value in any spelling the
// scrubber knows.
func (s *Scrubber) Contains(v string) bool {
	return !s.Empty() && s.m.any(v)
}

// JSON scrubs every string (keys and values) and every number of a JSON
// document; a number that held a secret becomes a string. Input that is not
// JSON is scrubbed as text. The document is re-encoded only when it changed.
func (s *Scrubber) JSON(raw json.RawMessage) json.RawMessage {
	if s.Empty() || len(raw) == 0 || !s.Contains(string(raw)) && !s.containsUnescaped(raw) {
		return raw
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return json.RawMessage(s.String(string(raw)))
	}
	clean := s.Any(v)
	b, err := json.Marshal(clean)
	if err != nil {
		return json.RawMessage(s.String(string(raw)))
	}
	if orig, err := json.Marshal(v); err == nil && bytes.Equal(orig, b) {
		return raw // nothing was scrubbed: keep the document as it was written
	}
	return b
}

// containsUnescaped reports whether a secret may appear in the document in
// an escaped spelling the forms miss (\u sequences, escaped slashes mixed
// with other escapes): decoding decides.
func (s *Scrubber) containsUnescaped(raw json.RawMessage) bool {
	return bytes.Contains(raw, []byte(`\u`)) || bytes.Contains(raw, []byte(`\/`))
}

// Any scrubs a decoded JSON value (maps, slices, strings, json.Number) or any
// other value, which is scrubbed through its fmt form when that holds a
// secret.
func (s *Scrubber) Any(v any) any {
	if s.Empty() {
		return v
	}
	switch t := v.(type) {
	case nil, bool, float64, int, int64:
		return v
	case string:
		return s.String(t)
	case json.Number:
		if c := s.String(string(t)); c != string(t) {
			return c
		}
		return t
	case json.RawMessage:
		return s.JSON(t)
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[s.String(k)] = s.Any(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = s.Any(e)
		}
		return out
	case []string:
		out := make([]string, len(t))
		for i, e := range t {
			out[i] = s.String(e)
		}
		return out
	}
	// Another type (a tool error's details): through JSON, when it holds a
	// secret at all.
	b, err := json.Marshal(v)
	if err != nil {
		if str := fmt.Sprint(v); s.Contains(str) {
			return s.String(str)
		}
		return v
	}
	if !s.Contains(string(b)) && !s.containsUnescaped(b) {
		return v
	}
	return s.JSON(b)
}

// Error returns err when its message holds no secret, else an error whose
// message is scrubbed (the chain is dropped: it held the value).
func (s *Scrubber) Error(err error) error {
	if err == nil || s.Empty() {
		return err
	}
	msg := err.Error()
	if !s.Contains(msg) {
		return err
	}
	return scrubbedError(s.String(msg))
}

type scrubbedError string

func (e scrubbedError) Error() string { return string(e) }

// Handler wraps a log handler so that the message and every attribute of
// every record it handles are scrubbed.
func (s *Scrubber) Handler(h slog.Handler) slog.Handler {
	if s.Empty() {
		return h
	}
	return &scrubHandler{s: s, next: h}
}

// Logger returns log with its records scrubbed.
func (s *Scrubber) Logger(log *slog.Logger) *slog.Logger {
	if s.Empty() || log == nil {
		return log
	}
	return slog.New(s.Handler(log.Handler()))
}

type scrubHandler struct {
	s    *Scrubber
	next slog.Handler
}

func (h *scrubHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *scrubHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.s.String(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *scrubHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		clean[i] = h.attr(a)
	}
	return &scrubHandler{s: h.s, next: h.next.WithAttrs(clean)}
}

func (h *scrubHandler) WithGroup(name string) slog.Handler {
	return &scrubHandler{s: h.s, next: h.next.WithGroup(h.s.String(name))}
}

func (h *scrubHandler) attr(a slog.Attr) slog.Attr {
	a.Key = h.s.String(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(h.s.String(v.String()))
	case slog.KindGroup:
		group := v.Group()
		clean := make([]slog.Attr, len(group))
		for i, g := range group {
			clean[i] = h.attr(g)
		}
		a.Value = slog.GroupValue(clean...)
	case slog.KindAny:
		if b, ok := v.Any().([]byte); ok {
			if str := string(b); h.s.Contains(str) {
				a.Value = slog.StringValue(h.s.String(str))
				break
			}
			a.Value = v
			break
		}
		if err, ok := v.Any().(error); ok {
			a.Value = slog.AnyValue(h.s.Error(err))
			break
		}
		if str := fmt.Sprint(v.Any()); h.s.Contains(str) {
			a.Value = slog.StringValue(h.s.String(str))
			break
		}
		a.Value = v
	default:
		a.Value = v
	}
	return a
}

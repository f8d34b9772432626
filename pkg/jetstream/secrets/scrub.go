package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
)

// Scrubber replaces secret values in strings, JSON, any Go value and log
// records by "[REDACTED:NAME]". Besides each value it replaces the value's
// URL-escaped and JSON-escaped spellings, so that a secret echoed inside a
// query string or inside JSON text held in a string is caught too. It does
// not see a value that was transformed otherwise (hashed, base64-encoded
// together with other bytes): tools must not do that with secrets.
//
// The zero Scrubber and a nil *Scrubber scrub nothing.
type Scrubber struct {
	pairs []string // old, new, ... for strings.Replacer, longest first
	r     *strings.Replacer
}

// NewScrubber returns a scrubber of the named values (name to value).
func NewScrubber(values map[string]string) *Scrubber {
	type pat struct{ old, repl string }
	var pats []pat
	seen := map[string]bool{}
	for name, v := range values {
		if len(v) == 0 {
			continue
		}
		repl := "[REDACTED:" + name + "]"
		jsonEsc := jsonEscape(v)
		for _, variant := range []string{v, url.QueryEscape(v), url.PathEscape(v), jsonEsc, jsonEscape(jsonEsc)} {
			if variant != "" && !seen[variant] {
				seen[variant] = true
				pats = append(pats, pat{variant, repl})
			}
		}
	}
	if len(pats) == 0 {
		return &Scrubber{}
	}
	// Longest first: strings.Replacer prefers earlier pairs at one position,
	// so a value that contains another is replaced whole.
	sort.SliceStable(pats, func(i, j int) bool { return len(pats[i].old) > len(pats[j].old) })
	s := &Scrubber{}
	for _, p := range pats {
		s.pairs = append(s.pairs, p.old, p.repl)
	}
	s.r = strings.NewReplacer(s.pairs...)
	return s
}

// jsonEscape is v as it appears between the quotes of a JSON string.
func jsonEscape(v string) string {
	b, err := json.Marshal(v)
	if err != nil || len(b) < 2 {
		return v
	}
	return string(b[1 : len(b)-1])
}

// Empty reports whether the scrubber has nothing to scrub.
func (s *Scrubber) Empty() bool { return s == nil || s.r == nil }

// String scrubs a string.
func (s *Scrubber) String(v string) string {
	if s.Empty() {
		return v
	}
	return s.r.Replace(v)
}

// Contains reports whether v holds a secret value in any spelling the
// scrubber knows.
func (s *Scrubber) Contains(v string) bool {
	if s.Empty() {
		return false
	}
	for i := 0; i < len(s.pairs); i += 2 {
		if strings.Contains(v, s.pairs[i]) {
			return true
		}
	}
	return false
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

// containsUnescaped reports whether a secret appears in the document only in
// an escaped spelling the variants missed (\u sequences): decoding decides.
func (s *Scrubber) containsUnescaped(raw json.RawMessage) bool {
	return bytes.Contains(raw, []byte(`\u`))
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

package events

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
)

// Header names of the NATS binding and of JetStream.
const (
	HeaderContentType = "content-type"
	HeaderPrefix      = "ce-"
	HeaderMsgID       = nats.MsgIdHdr // "Nats-Msg-Id"
	HeaderTraceParent = "traceparent" // the hop's trace context (W3C)
	HeaderTraceState  = "tracestate"

	// ContentTypeStructured marks structured content mode.
	ContentTypeStructured = "application/cloudevents+json"
)

// ErrNotCloudEvent is wrapped when a NATS message is neither a binary nor a
// structured mode CloudEvent.
var ErrNotCloudEvent = errors.New("not a CloudEvent")

// Encode renders e as a NATS message in binary content mode, as the NATS
// protocol binding (1.0.3) defines it: every attribute a "ce-<name>" header
// with a percent-encoded value, "content-type" for datacontenttype, the data as
// the body. The event id is also the Nats-Msg-Id, so JetStream drops a retried
// publish as a duplicate.
func Encode(subject string, e *event.Event) (*nats.Msg, error) {
	if err := validate(e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if err := checkUTF8(e); err != nil {
		return nil, err
	}
	// Sized for every header at once, the hop's trace context (InjectHop)
	// included: a map left to grow did so twice for each event.
	exts := extensions(e)
	h := make(nats.Header, 11+len(exts))
	m := &nats.Msg{Subject: subject, Header: h}
	set := func(name, v string) {
		if v != "" {
			h[HeaderPrefix+name] = []string{percentEncode(v)}
		}
	}
	set("specversion", e.SpecVersion())
	set("id", e.ID())
	set("source", e.Source())
	set("type", e.Type())
	set("subject", e.Subject())
	set("dataschema", e.DataSchema())
	if !e.Time().IsZero() {
		set("time", e.Time().UTC().Format(time.RFC3339Nano))
	}
	for name, v := range exts {
		s, ok := v.(string)
		if !ok {
			s = fmt.Sprint(v)
		}
		// An extension may be the empty string: keep it, unlike an absent
		// optional attribute.
		h[HeaderPrefix+name] = []string{percentEncode(s)}
	}
	if ct := e.DataContentType(); ct != "" {
		h[HeaderContentType] = []string{ct}
	}
	h[HeaderMsgID] = []string{e.ID()}
	m.Data = e.Data()
	return m, nil
}

// Decode reads a CloudEvent from a NATS message in either content mode:
// structured ("content-type: application/cloudevents+json", the released 1.0.2
// binding) or binary (ce-* headers). Header names are matched without regard
// to case. The event is validated before it is returned.
func Decode(m *nats.Msg) (*event.Event, error) {
	attrs, err := attributeHeaders(m.Header)
	if err != nil {
		return nil, fmt.Errorf("%w: message on %s: %w", ErrInvalidEvent, m.Subject, err)
	}
	ct := attrs.get(HeaderContentType)
	if strings.HasPrefix(strings.ToLower(ct), ContentTypeStructured) {
		return decodeStructured(m)
	}
	e := event.New()
	seen := false
	for _, a := range attrs {
		name, raw := a.name, a.value
		if !strings.HasPrefix(name, HeaderPrefix) {
			continue // content-type
		}
		v, err := headerValue(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: header %s: %w", ErrInvalidEvent, name, err)
		}
		seen = true
		switch name = name[len(HeaderPrefix):]; name {
		case "specversion":
			if v != event.CloudEventsVersionV1 {
				return nil, fmt.Errorf("%w: specversion %q, want 1.0", ErrInvalidEvent, v)
			}
		case "id":
			e.SetID(v)
		case "source":
			e.SetSource(v)
		case "type":
			e.SetType(v)
		case "subject":
			e.SetSubject(v)
		case "dataschema":
			setDataSchema(&e, v)
		case "time":
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return nil, fmt.Errorf("%w: ce-time %q is not RFC 3339", ErrInvalidEvent, v)
			}
			if err := checkTime(t); err != nil {
				return nil, err
			}
			e.SetTime(t)
		case "datacontenttype":
			// Not a header of the binding (content-type is), but accept it
			// when content-type is absent (attributeHeaders refuses both).
			ct = v
		default:
			if err := e.Context.SetExtension(name, v); err != nil {
				return nil, fmt.Errorf("%w: extension %q: %w", ErrInvalidEvent, name, err)
			}
		}
	}
	if !seen || attrs.get(HeaderPrefix+"specversion") == "" {
		return nil, fmt.Errorf("%w: message on %s has neither ce-specversion nor content-type %s", ErrNotCloudEvent, m.Subject, ContentTypeStructured)
	}
	// An absent content-type stays absent (DecodeData reads such data as JSON,
	// as the JSON event format does), so that the event re-encodes unchanged.
	if ct != "" {
		e.SetDataContentType(ct)
	}
	if len(m.Data) > 0 {
		e.DataEncoded, e.DataBase64 = m.Data, true
	}
	if err := validate(&e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return &e, nil
}

// attrHeader is a header that carries a CloudEvents attribute: its name in
// lower case, and its value.
type attrHeader struct{ name, value string }

// attrHeaders are a message's attribute headers, one per attribute.
type attrHeaders []attrHeader

// get returns the value of the attribute header named name (lower case).
func (a attrHeaders) get(name string) string {
	for _, h := range a {
		if h.name == name {
			return h.value
		}
	}
	return ""
}

// attributeHeaders returns the headers that carry CloudEvents attributes
// (ce-* and content-type), named in lower case. Header names are
// case-insensitive, and a message whose headers name one attribute twice, in
// any spelling (ce-type and CE-TYPE, a header sent twice, content-type beside
// ce-datacontenttype), is refused: which one to believe would depend on map
// order, and identical messages would get different outcomes. Every decoded
// event goes through here, so the usual case (each attribute once, with one
// value) is read into one slice; any other goes the long way.
func attributeHeaders(h nats.Header) (attrHeaders, error) {
	out := make(attrHeaders, 0, len(h))
	for k, vs := range h {
		if !isAttributeHeader(k) {
			continue
		}
		if len(vs) != 1 {
			return attributeHeadersChecked(h)
		}
		out = append(out, attrHeader{name: strings.ToLower(k), value: vs[0]})
	}
	if len(out) > maxScannedAttributes {
		return attributeHeadersChecked(h) // a sort, not a scan of every pair
	}
	ct, dct := false, false
	for i, a := range out {
		for _, b := range out[:i] {
			if a.name == b.name {
				return attributeHeadersChecked(h)
			}
		}
		ct = ct || a.name == HeaderContentType
		dct = dct || a.name == HeaderPrefix+"datacontenttype"
	}
	if ct && dct {
		return attributeHeadersChecked(h)
	}
	return out, nil
}

// maxScannedAttributes bounds the attribute headers whose names
// attributeHeaders compares pair by pair: an event has about a dozen, and a
// message with thousands goes the long way, in n log n.
const maxScannedAttributes = 32

// attributeHeadersChecked is attributeHeaders for headers that name an
// attribute twice, or give one a number of values other than one: it says
// why they are refused, in an order that depends on the headers alone.
func attributeHeadersChecked(h nats.Header) (attrHeaders, error) {
	type spelling struct {
		name, key string
		values    []string
	}
	found := make([]spelling, 0, len(h))
	for k, vs := range h {
		if isAttributeHeader(k) {
			found = append(found, spelling{name: strings.ToLower(k), key: k, values: vs})
		}
	}
	slices.SortFunc(found, func(a, b spelling) int { return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.key, b.key)) })
	var (
		dups        []string
		out         = make(attrHeaders, 0, len(found))
		ctKey, dKey string
	)
	for i, f := range found {
		if len(f.values) > 1 {
			dups = append(dups, fmt.Sprintf("%s is sent %d times", f.key, len(f.values)))
		}
		if i > 0 && found[i-1].name == f.name {
			dups = append(dups, fmt.Sprintf("%s and %s name one attribute", found[i-1].key, f.key))
			continue
		}
		switch f.name {
		case HeaderContentType:
			ctKey = f.key
		case HeaderPrefix + "datacontenttype":
			dKey = f.key
		}
		if len(f.values) > 0 {
			out = append(out, attrHeader{name: f.name, value: f.values[0]})
		}
	}
	if ctKey != "" && dKey != "" {
		dups = append(dups, fmt.Sprintf("%s and %s both set datacontenttype", ctKey, dKey))
	}
	if len(dups) > 0 {
		sort.Strings(dups)
		return nil, fmt.Errorf("an attribute appears more than once: %s", strings.Join(dups, "; "))
	}
	return out, nil
}

// isAttributeHeader reports whether header k carries a CloudEvents attribute:
// ce-* or content-type, in any case.
func isAttributeHeader(k string) bool {
	return len(k) >= len(HeaderPrefix) && strings.EqualFold(k[:len(HeaderPrefix)], HeaderPrefix) ||
		strings.EqualFold(k, HeaderContentType)
}

// decodeStructured reads a structured mode event: the JSON event format in
// the body.
func decodeStructured(m *nats.Msg) (*event.Event, error) {
	if err := checkStructuredBody(m.Data); err != nil {
		return nil, fmt.Errorf("%w: structured mode body on %s: %w", ErrInvalidEvent, m.Subject, err)
	}
	e := event.New()
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, fmt.Errorf("%w: structured mode body on %s: %w", ErrNotCloudEvent, m.Subject, err)
	}
	if v := e.SpecVersion(); v != event.CloudEventsVersionV1 {
		return nil, fmt.Errorf("%w: specversion %q, want 1.0", ErrInvalidEvent, v)
	}
	normalize(&e)
	if err := checkTime(e.Time()); err != nil {
		return nil, err
	}
	if err := validate(&e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return &e, nil
}

// checkStructuredBody refuses what a JSON decoder would silently accept in a
// structured mode event: bytes that are not UTF-8 (the JSON format requires
// it; Go would replace them), an attribute given twice (in any case; the last
// one would win), and both data and data_base64 (the format forbids it; one
// would win).
func checkStructuredBody(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("the JSON is not valid UTF-8")
	}
	if err := checkJSONStrings(b); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil // not an object: the decoder says why
	}
	seen := map[string]string{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := t.(string)
		lk := strings.ToLower(key)
		if prev, dup := seen[lk]; dup {
			return fmt.Errorf("attribute %q appears more than once (as %q and %q)", lk, prev, key)
		}
		seen[lk] = key
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	if _, d := seen["data"]; d {
		if _, d64 := seen["data_base64"]; d64 {
			return errors.New("both data and data_base64 are present; the JSON event format allows one")
		}
	}
	return nil
}

// EncodeStructured renders e in structured content mode; tests and upstream
// producers that prefer it use this.
func EncodeStructured(subject string, e *event.Event) (*nats.Msg, error) {
	if err := validate(e); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if err := checkUTF8(e); err != nil {
		return nil, err
	}
	if e.DataBase64 && isJSONMedia(mediaType(e)) && json.Valid(e.Data()) && utf8.Valid(e.Data()) && checkJSONStrings(e.Data()) == nil {
		// SetData marks bytes as binary, but JSON data belongs under "data" as
		// a JSON value (JSON event format 3.1.1), not base64 under
		// "data_base64". JSON that a decoder would alter (bytes that are not
		// UTF-8, lone surrogates) stays base64, byte for byte.
		c := e.Clone()
		c.DataBase64 = false
		e = &c
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	m := nats.NewMsg(subject)
	m.Header[HeaderContentType] = []string{ContentTypeStructured + "; charset=utf-8"}
	m.Header[HeaderMsgID] = []string{e.ID()}
	m.Data = b
	return m, nil
}

// checkUTF8 refuses an event with a string attribute that is not valid
// UTF-8: a consumer must refuse it (binding 3.1.3.2), and JSON would replace
// its bytes, so it is never sent.
func checkUTF8(e *event.Event) error {
	var bad []string
	for _, a := range [...]struct{ name, v string }{{"id", e.ID()}, {"source", e.Source()}, {"type", e.Type()},
		{"subject", e.Subject()}, {"dataschema", e.DataSchema()}, {"datacontenttype", e.DataContentType()}} {
		if !utf8.ValidString(a.v) {
			bad = append(bad, a.name)
		}
	}
	for name, v := range extensions(e) {
		if s, ok := v.(string); ok && !utf8.ValidString(s) {
			bad = append(bad, name)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%w: attribute %s is not valid UTF-8", ErrInvalidEvent, strings.Join(bad, ", "))
}

// normalize applies to a structured mode event what the SDK's setters do to a
// binary mode one: the surrounding white space of id, type, subject,
// datacontenttype and dataschema is trimmed, so that both modes decode alike.
func normalize(e *event.Event) {
	if id := strings.TrimSpace(e.ID()); id != "" {
		e.SetID(id)
	}
	e.SetType(e.Type())
	if v := e.Subject(); v != "" {
		e.SetSubject(v)
	}
	if v := e.DataContentType(); v != "" {
		e.SetDataContentType(v)
	}
	if v := e.DataSchema(); v != "" {
		e.SetDataSchema(v)
	}
}

// checkTime rejects a time that RFC 3339 cannot write in UTC (a year before 0
// or after 9999 once the offset is applied), so that every decoded event
// encodes again.
func checkTime(t time.Time) error {
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return fmt.Errorf("%w: time %s is out of range", ErrInvalidEvent, t.Format(time.RFC3339Nano))
	}
	return nil
}

// isJSONMedia reports whether a media type (without parameters) is JSON; an
// absent one means JSON, as in the JSON event format.
func isJSONMedia(mt string) bool {
	return mt == "" || mt == event.ApplicationJSON || mt == event.TextJSON
}

func headerFold(h nats.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, name) {
			return v[0]
		}
	}
	return ""
}

// percentEncode encodes, as the HTTP and NATS bindings ask, every byte that
// is not printable ASCII, and space, '"' and '%'.
func percentEncode(s string) string {
	need := false
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '%' {
			need = true
			break
		}
	}
	if !need {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '"' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// headerValue decodes one attribute header, as the binding's section 3.1.3.2
// says: double-quoted strings are unquoted first (RFC 7230 3.2.6, backslash
// escapes included), then one round of percent-decoding; the result must be
// valid UTF-8 (an overlong "%C0%A0" or a lone "%FF" is refused).
func headerValue(raw string) (string, error) {
	v, err := unquote(raw)
	if err != nil {
		return "", err
	}
	v, err = percentDecode(v)
	if err != nil {
		return "", err
	}
	if !utf8.ValidString(v) {
		return "", fmt.Errorf("value %q is not valid UTF-8 once percent-decoded", raw)
	}
	return v, nil
}

// unquote removes the double-quoted strings of a header value (RFC 7230
// 3.2.6): the quotes go, and inside them a backslash takes the next byte as
// it is. Text outside quotes is kept as it is.
func unquote(s string) (string, error) {
	if !strings.Contains(s, `"`) {
		return s, nil
	}
	var b strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			in = !in
		case in && c == '\\':
			if i+1 == len(s) {
				return "", fmt.Errorf("value %q ends inside a backslash escape", s)
			}
			i++
			b.WriteByte(s[i])
		default:
			b.WriteByte(c)
		}
	}
	if in {
		return "", fmt.Errorf("value %q has an unterminated double-quoted string", s)
	}
	return b.String(), nil
}

func percentDecode(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("truncated percent escape in %q", s)
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("bad percent escape %q", s[i:i+3])
		}
		b.WriteByte(hi<<4 | lo)
		i += 2
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

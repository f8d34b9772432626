package events_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// validBinary is a minimal binary mode event's headers.
func validBinary() nats.Header {
	return nats.Header{
		"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-type": {"dev.toolwire.test.v1"}, "ce-source": {"/s"},
		"ce-subject": {"s"}, "ce-time": {"2025-03-14T09:26:53Z"}, "ce-dataschema": {"https://x/s.json"},
		"ce-runid": {"run-1"}, "content-type": {"application/json"},
	}
}

// spellings are other ways to write a header name: header names are
// case-insensitive, so each names the same attribute.
func spellings(name string) []string {
	title := []rune(name)
	for i := range title {
		if i == 0 || title[i-1] == '-' {
			title[i] = unicode.ToUpper(title[i])
		}
	}
	mixed := []rune(name)
	for i := range mixed {
		if i%2 == 1 {
			mixed[i] = unicode.ToUpper(mixed[i])
		}
	}
	return []string{strings.ToUpper(name), string(title), string(mixed)}
}

// Every attribute header, written twice in any two spellings or sent twice
// under one, is refused, with the same error every time: which value wins must
// never depend on map order.
func TestDecodeRefusesAnAttributeGivenTwice(t *testing.T) {
	for name := range validBinary() {
		for _, other := range spellings(name) {
			t.Run(name+"/"+other, func(t *testing.T) {
				h := validBinary()
				h[other] = []string{h[name][0] + "x"}
				var first string
				for i := range 20 {
					e, err := events.Decode(&nats.Msg{Subject: "toolwire.test", Header: h, Data: []byte(`{}`)})
					require.Nil(t, e)
					require.ErrorIs(t, err, events.ErrInvalidEvent)
					require.ErrorContains(t, err, "an attribute appears more than once")
					require.ErrorContains(t, err, other)
					if i == 0 {
						first = err.Error()
					}
					require.Equal(t, first, err.Error(), "the same message, the same outcome")
				}
			})
		}
		t.Run(name+"/twice", func(t *testing.T) {
			h := validBinary()
			h[name] = append(h[name], h[name][0])
			_, err := events.Decode(&nats.Msg{Subject: "toolwire.test", Header: h, Data: []byte(`{}`)})
			require.ErrorIs(t, err, events.ErrInvalidEvent)
			require.ErrorContains(t, err, name+" is sent 2 times")
		})
	}
	// content-type and ce-datacontenttype are two spellings of one attribute.
	h := validBinary()
	h["Ce-DataContentType"] = []string{"text/plain"}
	_, err := events.Decode(&nats.Msg{Subject: "toolwire.test", Header: h, Data: []byte(`{}`)})
	require.ErrorContains(t, err, "both set datacontenttype")
	// Alone, ce-datacontenttype is accepted as the data's content type.
	h = validBinary()
	delete(h, "content-type")
	h["ce-datacontenttype"] = []string{"text/plain"}
	e, err := events.Decode(&nats.Msg{Subject: "toolwire.test", Header: h, Data: []byte(`hi`)})
	require.NoError(t, err)
	require.Equal(t, "text/plain", e.DataContentType())
}

// Header values are unquoted (RFC 7230 3.2.6), then percent-decoded once, and
// must be UTF-8: binding section 3.1.3.2.
func TestDecodeHeaderValues(t *testing.T) {
	ok := []struct{ raw, want string }{
		{"plain", "plain"},
		{"%c3%bc%E2%82%AC", "ü€"},
		{"%41%42", "AB"}, // unnecessarily encoded: accepted
		{`"hello world"`, "hello world"},
		{`"say \"hi\""`, `say "hi"`},
		{`"back\\slash"`, `back\slash`},
		{`pre"quoted text"post`, "prequoted textpost"},
		{`"100%25"`, "100%"},
		{`""`, ""}, // an empty subject: the attribute is absent
	}
	for _, tc := range ok {
		t.Run("ok "+tc.raw, func(t *testing.T) {
			h := validBinary()
			h["ce-subject"] = []string{tc.raw}
			e, err := events.Decode(&nats.Msg{Subject: "toolwire.test", Header: h, Data: []byte(`{}`)})
			require.NoError(t, err)
			require.Equal(t, tc.want, e.Subject())
		})
	}
	bad := []struct{ raw, msg string }{
		{"%C0%A0", "not valid UTF-8"},       // overlong U+0020
		{"%FF", "not valid UTF-8"},          // never valid
		{"%ED%A0%80", "not valid UTF-8"},    // a surrogate, encoded
		{"%E2%82", "not valid UTF-8"},       // a truncated sequence
		{"%F4%90%80%80", "not valid UTF-8"}, // beyond U+10FFFF
		{"ab\xffcd", "not valid UTF-8"},     // a raw byte, not encoded
		{`"unterminated`, "unterminated double-quoted string"},
		{`"ends in \`, "backslash escape"},
	}
	for _, tc := range bad {
		t.Run("bad "+tc.raw, func(t *testing.T) {
			for _, attr := range []string{"ce-id", "ce-subject", "ce-runid", "ce-source"} {
				h := validBinary()
				h[attr] = []string{tc.raw}
				e, err := events.Decode(&nats.Msg{Subject: "toolwire.test", Header: h, Data: []byte(`{}`)})
				require.Nil(t, e, attr)
				require.ErrorIs(t, err, events.ErrInvalidEvent, attr)
				require.ErrorContains(t, err, tc.msg, attr)
			}
		})
	}
}

// An attribute that is not UTF-8 is never sent, in either mode.
func TestEncodeRefusesInvalidUTF8(t *testing.T) {
	for _, set := range []func(e *event.Event){
		func(e *event.Event) { e.SetSubject("a\xffb") },
		func(e *event.Event) { e.SetExtension(events.ExtTenantID, "acme\xc0\xa0") },
		func(e *event.Event) { e.SetID("id\xed\xa0\x80") },
	} {
		e := event.New()
		e.SetID("1")
		e.SetSource("/s")
		e.SetType("t")
		set(&e)
		_, err := events.Encode("s", &e)
		require.ErrorIs(t, err, events.ErrInvalidEvent)
		require.ErrorContains(t, err, "is not valid UTF-8")
		_, err = events.EncodeStructured("s", &e)
		require.ErrorIs(t, err, events.ErrInvalidEvent)
		require.ErrorContains(t, err, "is not valid UTF-8")
	}
}

// A structured mode body with an attribute given twice (in any case), with
// both data and data_base64, with bytes that are not UTF-8 or with a lone
// surrogate escape is refused: a decoder would silently pick or replace.
func TestDecodeStructuredRefuses(t *testing.T) {
	const head = `{"specversion":"1.0","id":"1","source":"/s","type":"t"`
	cases := []struct{ name, body, msg string }{
		{"type twice", head + `,"type":"u"}`, `attribute "type" appears more than once`},
		{"id in two cases", head + `,"ID":"2"}`, `attribute "id" appears more than once`},
		{"extension twice", head + `,"runid":"a","RunId":"b"}`, `attribute "runid" appears more than once`},
		{"data and data_base64", head + `,"data":{"a":1},"data_base64":"AAE="}`, "both data and data_base64"},
		{"invalid UTF-8", head + ",\"subject\":\"a\xffb\"}", "not valid UTF-8"},
		{"lone high surrogate", head + `,"subject":"a\ud800b"}`, `lone high surrogate \ud800`},
		{"lone low surrogate", head + `,"subject":"\udc00"}`, `lone low surrogate \udc00`},
		{"high surrogate then text", head + `,"subject":"\ud83dx"}`, "lone high surrogate"},
		{"surrogate in data", head + `,"data":{"q":"\udfff"}}`, "lone low surrogate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &nats.Msg{Subject: "toolwire.test", Header: nats.Header{"content-type": {events.ContentTypeStructured}}, Data: []byte(tc.body)}
			e, err := events.Decode(m)
			require.Nil(t, e)
			require.ErrorIs(t, err, events.ErrInvalidEvent)
			require.ErrorContains(t, err, tc.msg)
		})
	}
	// A proper pair and an escaped backslash before a 'u' are fine.
	m := &nats.Msg{Subject: "toolwire.test", Header: nats.Header{"content-type": {events.ContentTypeStructured}},
		Data: []byte(head + `,"subject":"\ud83d\ude00 \\ud800"}`)}
	e, err := events.Decode(m)
	require.NoError(t, err)
	require.Equal(t, `😀 \ud800`, e.Subject())
}

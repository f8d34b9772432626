package events_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	fastjson "github.com/segmentio/encoding/json"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

// headerBlob renders headers as "key: value" lines, the fuzzer's input form.
func headerBlob(h nats.Header) string {
	var b strings.Builder
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\n")
		}
	}
	return b.String()
}

func parseHeaderBlob(s string) nats.Header {
	h := nats.Header{}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		h[k] = append(h[k], v)
	}
	return h
}

// FuzzDecode feeds random headers and bodies to Decode: it never panics, and
// an event it accepts survives Encode and Decode unchanged.
func FuzzDecode(f *testing.F) {
	for _, c := range allConstructors(f) {
		m, err := events.Encode(c.out.Subject, &c.out.Event)
		require.NoError(f, err)
		f.Add(headerBlob(m.Header), m.Data)
		m, err = events.EncodeStructured(c.out.Subject, &c.out.Event)
		require.NoError(f, err)
		f.Add(headerBlob(m.Header), m.Data)
	}
	m, err := events.Encode("s", specialEvent(f))
	require.NoError(f, err)
	f.Add(headerBlob(m.Header), m.Data)
	f.Add("content-type: application/cloudevents+json\n", []byte(foreignStructured))
	f.Add("Ce-Specversion: 1.0\nCe-Id: 1\nCE-TYPE: t\nce-source: /s\nce-time: 2025-03-14T10:26:53+01:00\n", []byte(`{}`))
	f.Add("ce-specversion: 1.0\nce-id: %zz\n", []byte{})
	f.Add("ce-specversion: 0.3\nce-id: 1\nce-type: t\nce-source: /s\n", []byte("x"))
	f.Add("content-type: application/cloudevents+json\n", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","n":5,"b":true,"data_base64":"AAE="}`))
	f.Add("content-type: application/cloudevents+json\n", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","datacontenttype":"text/plain","data":"hi"}`))
	f.Add("", []byte("junk"))
	// The boundary's classes: attributes given twice, quoted values, bytes
	// that are not UTF-8, structured bodies that a decoder would pick from.
	f.Add("ce-specversion: 1.0\nce-id: 1\nce-type: t\nCE-TYPE: u\nce-source: /s\n", []byte(`{}`))
	f.Add("ce-specversion: 1.0\nce-id: \"a b\"\nce-type: t\nce-source: /s\n", []byte(`{}`))
	f.Add("ce-specversion: 1.0\nce-id: %C0%A0\nce-type: t\nce-source: /s\n", []byte(`{}`))
	f.Add("content-type: application/cloudevents+json\n", []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data_base64":"AAE="}`))
	f.Add("content-type: application/cloudevents+json\n", []byte(`{"specversion":"1.0","id":"\ud800","source":"/s","type":"t"}`))

	f.Fuzz(func(t *testing.T, headers string, body []byte) {
		m := &nats.Msg{Subject: "toolwire.fuzz", Header: parseHeaderBlob(headers), Data: body}
		e, err := events.Decode(m)
		if err != nil {
			require.Nil(t, e)
			return
		}
		m2, err := events.Encode(m.Subject, e)
		require.NoError(t, err, "a decoded event must encode")
		e2, err := events.Decode(m2)
		require.NoError(t, err, "an encoded event must decode; headers %v", m2.Header)
		requireSameEvent(t, e, e2)

		// Structured mode round trip as well.
		m3, err := events.EncodeStructured(m.Subject, e)
		require.NoError(t, err, "a decoded event must encode in structured mode")
		e3, err := events.Decode(m3)
		require.NoError(t, err, "a structured event must decode; body %s", m3.Data)
		requireSameEventJSON(t, e, e3)
	})
}

// FuzzDecodeDataAgreesWithEncodingJSON: DecodeData (segmentio's decoder, then
// encoding/json for what it refuses) takes exactly the data encoding/json
// takes, into the same value, and refuses the rest with encoding/json's
// error, for the data type of every event type.
func FuzzDecodeDataAgreesWithEncodingJSON(f *testing.F) {
	cs := allConstructors(f)
	for i, c := range cs {
		f.Add(uint8(i), c.out.Event.Data())
	}
	f.Add(uint8(0), []byte(`{"run_id":"r","extra":1}`))
	f.Add(uint8(1), []byte(`{"run_id":"r"}]`))
	f.Add(uint8(2), []byte(`{"RUN_ID":"r","status":"started"} `))
	f.Add(uint8(3), []byte("{\"run_id\":\"\xff\"}"))
	f.Add(uint8(4), []byte(`{"iteration":1e2}`))
	f.Add(uint8(5), []byte(`{"iteration":01}`))
	f.Add(uint8(6), []byte(`{"run_id":"a","run_id":"b"}`))
	f.Add(uint8(7), []byte(`null`))
	f.Fuzz(func(t *testing.T, i uint8, data []byte) {
		c := cs[int(i)%len(cs)]
		e := c.out.Event.Clone()
		e.DataEncoded = data
		typ := reflect.TypeOf(c.data).Elem()
		got, want := reflect.New(typ).Interface(), reflect.New(typ).Interface()
		err := events.DecodeData(&e, got)
		werr := events.DecodeDataStrict(e.Type(), data, want)
		if len(data) == 0 {
			require.Error(t, err)
			return
		}
		if werr != nil {
			require.Error(t, err, "encoding/json refuses %q: %v", data, werr)
			require.Equal(t, werr.Error(), err.Error())
			return
		}
		require.NoError(t, err, "encoding/json takes %q", data)
		require.Equal(t, want, got, "data %q", data)
	})
}

// FuzzEncodeData: Build's encoder (segmentio's) writes exactly the bytes
// encoding/json writes for the data of every event type, whatever the
// values (decoded from random JSON), and fails where it fails.
func FuzzEncodeData(f *testing.F) {
	cs := allConstructors(f)
	for i, c := range cs {
		f.Add(uint8(i), c.out.Event.Data())
	}
	f.Add(uint8(0), []byte(`{"run_id":"<a&b>\u2028","messages":[{"role":"user","content":"\ud83d\ude00 \u0000"}]}`))
	f.Add(uint8(3), []byte(`{"spend":1e21,"iteration":3}`))
	f.Add(uint8(5), []byte(`{"cost":0.000001,"input_tokens":12}`))
	f.Fuzz(func(t *testing.T, i uint8, data []byte) {
		c := cs[int(i)%len(cs)]
		v := reflect.New(reflect.TypeOf(c.data).Elem()).Interface()
		if json.Unmarshal(data, v) != nil {
			return // not a value of the type: nothing to encode
		}
		want, werr := json.Marshal(v)
		got, err := fastjson.Marshal(v)
		if werr != nil {
			require.Error(t, err, "encoding/json fails: %v", werr)
			return
		}
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	})
}

package events_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestEncodeDecodeRoundTripEveryConstructor(t *testing.T) {
	for _, c := range allConstructors(t) {
		t.Run(c.name, func(t *testing.T) {
			e := &c.out.Event
			require.Equal(t, c.subject, c.out.Subject)
			require.Equal(t, c.typ, e.Type())
			require.Equal(t, c.id, e.ID())
			require.Equal(t, "/toolwire/test", e.Source())
			require.Equal(t, event.ApplicationJSON, e.DataContentType())
			require.Equal(t, envelope.SchemaURL(events.DataSchema(c.typ)), e.DataSchema())
			require.Equal(t, runID, events.Ext(e, events.ExtRunID))
			require.Equal(t, c.callID, events.Ext(e, events.ExtCallID))
			require.Equal(t, c.callID, e.Subject())
			require.Equal(t, tenant.ID(), events.Ext(e, events.ExtTenantID))
			require.Equal(t, runTrace, events.TraceOf(e))

			m, err := events.Encode(c.out.Subject, e)
			require.NoError(t, err)
			require.Equal(t, c.subject, m.Subject)
			require.Equal(t, c.id, m.Header.Get(events.HeaderMsgID), "the event id is the Nats-Msg-Id")
			require.Equal(t, e.Data(), m.Data, "binary mode: the body is the data")

			got, err := events.Decode(m)
			require.NoError(t, err)
			requireSameEvent(t, e, got)
			require.Equal(t, e.Extensions(), got.Extensions())
			require.Equal(t, runTrace, events.TraceOf(got))

			// The data decodes, strictly, into its Go type.
			require.NoError(t, events.DecodeData(got, c.data))
		})
	}
}

func TestEveryEventTypeHasASchema(t *testing.T) {
	types := events.EventTypes()
	require.Len(t, types, 16)
	for _, typ := range types {
		require.NotEmpty(t, events.DataSchema(typ), typ)
	}
	require.Empty(t, events.DataSchema("dev.toolwire.unknown.v1"))
}

func TestConstructorsRejectBadInput(t *testing.T) {
	_, err := events.NewRunStatus("/s", events.RunStatus{RunID: runID, Status: "exploded"}, "", events.RunTrace{})
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	require.ErrorContains(t, err, `unknown run status "exploded"`)

	c := fixtureCallRequest()
	c.Queue = "Default Queue"
	_, err = events.NewCallApproved("/s", c, events.RunTrace{})
	require.ErrorContains(t, err, "queue")

	req := fixtureRunRequest()
	req.RunID = "a.b"
	_, err = events.NewRunRequested("/s", req, events.RunTrace{})
	require.ErrorIs(t, err, events.ErrUnsafeID)

	c = fixtureCallRequest()
	c.CallID = "NOT-HEX"
	_, err = events.NewCallApproved("/s", c, events.RunTrace{})
	require.ErrorIs(t, err, events.ErrUnsafeID)

	_, err = events.Build(events.TypeCallStarted, "id", "s", events.Attrs{}, func() {})
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	_, err = events.Build(events.TypeCallStarted, "", "s", events.Attrs{}, 1)
	require.ErrorIs(t, err, events.ErrInvalidEvent, "an event needs an id")
}

func TestBuildDefaults(t *testing.T) {
	out, err := events.Build("dev.example.v1", "x/1", "toolwire.run.r.requested", events.Attrs{}, map[string]int{"a": 1})
	require.NoError(t, err)
	e := out.Event
	require.Equal(t, "/toolwire", e.Source())
	require.Empty(t, e.DataSchema(), "an unknown type has no schema")
	require.False(t, e.Time().IsZero())
	require.Empty(t, e.Extensions())
	require.JSONEq(t, `{"a":1}`, string(e.Data()))

	// A trace state without a trace parent is meaningless and dropped.
	out, err = events.Build("dev.example.v1", "x/1", "s", events.Attrs{Trace: events.RunTrace{TraceState: "a=b"}}, 1)
	require.NoError(t, err)
	require.Empty(t, events.Ext(&out.Event, events.ExtTraceState))
}

// specialEvent has attribute values that need percent-encoding.
func specialEvent(t testing.TB) *event.Event {
	t.Helper()
	e := event.New()
	e.SetID(`id with spaces "and" 100% ünïcödé`)
	e.SetSource("/toolwire/test")
	e.SetType("dev.toolwire.test.v1")
	e.SetSubject("tab\there\r\nnewline \x7f del")
	e.SetTime(t0)
	e.SetExtension(events.ExtTenantID, `acme/R&D "west"/zoë`)
	e.SetExtension(events.ExtRunID, runID)
	e.SetExtension("emoji", "🚀 launch")
	e.SetExtension("empty", "")
	require.NoError(t, e.SetData("text/plain; charset=utf-8", []byte("plain text ✓")))
	return &e
}

func TestHeaderValuesArePercentEncoded(t *testing.T) {
	e := specialEvent(t)
	m, err := events.Encode("toolwire.test", e)
	require.NoError(t, err)

	want := map[string]string{
		"ce-id":       "id%20with%20spaces%20%22and%22%20100%25%20%C3%BCn%C3%AFc%C3%B6d%C3%A9",
		"ce-subject":  "tab%09here%0D%0Anewline%20%7F%20del",
		"ce-tenantid": "acme/R&D%20%22west%22/zo%C3%AB",
		"ce-emoji":    "%F0%9F%9A%80%20launch",
		"ce-empty":    "",
		"ce-runid":    runID,
	}
	for k, v := range want {
		require.Equal(t, []string{v}, m.Header[k], k)
	}
	require.Equal(t, "text/plain; charset=utf-8", m.Header.Get(events.HeaderContentType), "content-type is not percent-encoded")
	for k, vs := range m.Header {
		if !strings.HasPrefix(k, events.HeaderPrefix) {
			continue
		}
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				c := v[i]
				require.True(t, c > ' ' && c < 0x7f && c != '"', "header %s has byte %q", k, c)
			}
		}
	}

	got, err := events.Decode(m)
	require.NoError(t, err)
	requireSameEvent(t, e, got)
}

func TestStructuredModeRoundTrip(t *testing.T) {
	for _, c := range allConstructors(t) {
		t.Run(c.name, func(t *testing.T) {
			m, err := events.EncodeStructured(c.out.Subject, &c.out.Event)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(m.Header.Get(events.HeaderContentType), events.ContentTypeStructured))
			require.Equal(t, c.id, m.Header.Get(events.HeaderMsgID))
			for k := range m.Header {
				require.False(t, strings.HasPrefix(strings.ToLower(k), events.HeaderPrefix), "structured mode has no ce- header, found %s", k)
			}
			// JSON data is a JSON value under "data" (JSON event format 3.1.1),
			// not base64 under "data_base64".
			var body map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(m.Data, &body))
			require.NotContains(t, body, "data_base64")
			require.JSONEq(t, string(c.out.Event.Data()), string(body["data"]))

			got, err := events.Decode(m)
			require.NoError(t, err)
			requireSameEvent(t, &c.out.Event, got)
			require.NoError(t, events.DecodeData(got, c.data))
		})
	}

	t.Run("special characters", func(t *testing.T) {
		e := specialEvent(t)
		m, err := events.EncodeStructured("toolwire.test", e)
		require.NoError(t, err)
		got, err := events.Decode(m)
		require.NoError(t, err)
		requireSameEvent(t, e, got)
	})
}

// foreignStructured is a run request as another CloudEvents SDK would publish
// it in structured mode: the data is a JSON object and the extensions sit
// beside the attributes.
const foreignStructured = `{
  "specversion": "1.0",
  "id": "run-7/requested",
  "source": "https://workflows.example.com/graphs/42",
  "type": "dev.toolwire.run.requested.v1",
  "subject": "run-7",
  "time": "2025-03-14T10:26:53.5+01:00",
  "datacontenttype": "application/json",
  "dataschema": "https://toolwire.dev/schemas/run_request.schema.json",
  "runid": "run-7",
  "tenantid": "acme//",
  "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
  "data": {
    "run_id": "run-7",
    "tenant": {"org_id": "acme"},
    "agent": {"name": "a", "model": {"provider": "scripted", "name": "m"}, "enabled_tools": [], "policy": {}},
    "messages": [{"role": "user", "content": "hi"}]
  }
}`

func TestDecodeForeignStructuredEvent(t *testing.T) {
	for _, ct := range []string{
		"application/cloudevents+json",
		"application/cloudevents+json; charset=UTF-8",
		"Application/CloudEvents+JSON",
	} {
		for _, key := range []string{"content-type", "Content-Type", "CONTENT-TYPE"} {
			t.Run(key+": "+ct, func(t *testing.T) {
				m := &nats.Msg{Subject: "toolwire.run.run-7.requested", Header: nats.Header{key: {ct}}, Data: []byte(foreignStructured)}
				e, err := events.Decode(m)
				require.NoError(t, err)
				require.Equal(t, "run-7/requested", e.ID())
				require.Equal(t, "https://workflows.example.com/graphs/42", e.Source())
				require.Equal(t, events.TypeRunRequested, e.Type())
				require.Equal(t, "run-7", e.Subject())
				require.True(t, mustTime(t, "2025-03-14T09:26:53.5Z").Equal(e.Time()), "time %s", e.Time())
				require.Equal(t, "run-7", events.Ext(e, events.ExtRunID))
				require.Equal(t, "acme//", events.Ext(e, events.ExtTenantID))
				require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", events.TraceOf(e).TraceID())

				var req envelope.RunRequest
				require.NoError(t, events.DecodeData(e, &req))
				require.Equal(t, "run-7", req.RunID)
				require.Equal(t, "acme", req.Tenant.OrgID)
				require.NoError(t, req.Validate())
			})
		}
	}
}

func TestDecodeAcceptsHeadersInAnyCase(t *testing.T) {
	m := &nats.Msg{Subject: "toolwire.test", Data: []byte(`{"ok":true}`), Header: nats.Header{
		"Ce-Specversion": {"1.0"},
		"Ce-Id":          {"x%2F1"},
		"CE-TYPE":        {"dev.toolwire.test.v1"},
		"cE-sOuRcE":      {"/upstream"},
		"Ce-Time":        {"2025-03-14T09:26:53.589793Z"},
		"CE-RUNID":       {runID},
		"Content-Type":   {"application/json"},
	}}
	e, err := events.Decode(m)
	require.NoError(t, err)
	require.Equal(t, "x/1", e.ID())
	require.Equal(t, "dev.toolwire.test.v1", e.Type())
	require.Equal(t, "/upstream", e.Source())
	require.True(t, t0.Equal(e.Time()))
	require.Equal(t, runID, events.Ext(e, events.ExtRunID))
	require.Equal(t, event.ApplicationJSON, e.DataContentType())
	require.JSONEq(t, `{"ok":true}`, string(e.Data()))
}

func TestDecodeBinaryWithoutContentTypeIsJSON(t *testing.T) {
	m := &nats.Msg{Subject: "s", Data: []byte(`{"a":1}`), Header: nats.Header{
		"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-type": {"t"}, "ce-source": {"/s"},
	}}
	e, err := events.Decode(m)
	require.NoError(t, err)
	require.Empty(t, e.DataContentType(), "an absent content-type stays absent")
	require.Equal(t, []byte(`{"a":1}`), e.Data())
	var v struct{ A int }
	require.NoError(t, events.DecodeData(e, &v))
	require.Equal(t, 1, v.A)

	// No body and no content type: an event without data.
	m.Data = nil
	e, err = events.Decode(m)
	require.NoError(t, err)
	require.Empty(t, e.Data())
	require.Empty(t, e.DataContentType())
}

func TestDecodeRejects(t *testing.T) {
	valid := func() nats.Header {
		return nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-type": {"dev.toolwire.test.v1"}, "ce-source": {"/s"},
			"content-type": {"application/json"},
		}
	}
	with := func(k, v string) nats.Header { h := valid(); h[k] = []string{v}; return h }
	without := func(k string) nats.Header { h := valid(); delete(h, k); return h }
	structured := nats.Header{"content-type": {events.ContentTypeStructured}}

	cases := []struct {
		name   string
		header nats.Header
		body   string
		is     error
		msg    string
	}{
		{"no headers", nil, `{"a":1}`, events.ErrNotCloudEvent, "neither ce-specversion nor content-type"},
		{"no ce headers", nats.Header{"Nats-Msg-Id": {"1"}, "traceparent": {runTrace.TraceParent}}, `{}`, events.ErrNotCloudEvent, "neither ce-specversion"},
		{"plain json content type", nats.Header{"content-type": {"application/json"}}, `{}`, events.ErrNotCloudEvent, "neither ce-specversion"},
		{"no specversion", without("ce-specversion"), `{}`, events.ErrNotCloudEvent, "neither ce-specversion"},
		{"missing id", without("ce-id"), `{}`, events.ErrInvalidEvent, "id"},
		{"missing source", without("ce-source"), `{}`, events.ErrInvalidEvent, "source"},
		{"missing type", without("ce-type"), `{}`, events.ErrInvalidEvent, "type"},
		{"specversion 0.3", with("ce-specversion", "0.3"), `{}`, events.ErrInvalidEvent, `specversion "0.3", want 1.0`},
		{"specversion 2.0", with("Ce-Specversion", "2.0"), `{}`, events.ErrInvalidEvent, "specversion"},
		{"bad time", with("ce-time", "yesterday"), `{}`, events.ErrInvalidEvent, `ce-time "yesterday" is not RFC 3339`},
		{"time out of range", with("ce-time", "0000-01-01T00:00:00+01:00"), `{}`, events.ErrInvalidEvent, "out of range"},
		{"time without zone", with("ce-time", "2025-03-14T09:26:53"), `{}`, events.ErrInvalidEvent, "RFC 3339"},
		{"bad percent escape", with("ce-id", "a%zzb"), `{}`, events.ErrInvalidEvent, `bad percent escape "%zz"`},
		{"truncated percent escape", with("ce-subject", "ab%4"), `{}`, events.ErrInvalidEvent, "truncated percent escape"},
		{"lone percent", with("ce-source", "%"), `{}`, events.ErrInvalidEvent, "truncated percent escape"},
		{"bad extension name", with("ce-run_id", "x"), `{}`, events.ErrInvalidEvent, `extension "run_id"`},
		{"structured not json", structured, `not json`, events.ErrNotCloudEvent, "structured mode body"},
		{"structured empty", structured, ``, events.ErrNotCloudEvent, "structured mode body"},
		{"structured array", structured, `[1,2]`, events.ErrNotCloudEvent, "structured mode body"},
		{"structured no specversion", structured, `{"id":"1","source":"/s","type":"t"}`, events.ErrNotCloudEvent, "specversion"},
		{"structured missing id", structured, `{"specversion":"1.0","source":"/s","type":"t"}`, events.ErrInvalidEvent, "id"},
		{"structured missing type", structured, `{"specversion":"1.0","id":"1","source":"/s"}`, events.ErrInvalidEvent, "type"},
		{"structured specversion 0.3", structured, `{"specversion":"0.3","id":"1","source":"/s","type":"t"}`, events.ErrInvalidEvent, `specversion "0.3", want 1.0`},
		{"structured time out of range", structured, `{"specversion":"1.0","id":"1","source":"/s","type":"t","time":"9999-12-31T23:59:59-01:00"}`, events.ErrInvalidEvent, "out of range"},
		{"structured bad time", structured, `{"specversion":"1.0","id":"1","source":"/s","type":"t","time":"yesterday"}`, events.ErrNotCloudEvent, "structured mode body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := events.Decode(&nats.Msg{Subject: "toolwire.test", Header: tc.header, Data: []byte(tc.body)})
			require.Nil(t, e)
			require.ErrorIs(t, err, tc.is)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestEncodeRejectsInvalidEvent(t *testing.T) {
	e := event.New()
	e.SetType("t")
	_, err := events.Encode("s", &e)
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	_, err = events.EncodeStructured("s", &e)
	require.ErrorIs(t, err, events.ErrInvalidEvent)
}

// TestEncodeGolden pins the exact header set of one encoded event. Run with
// -update to rewrite testdata/encode_call_completed.golden.json.
func TestEncodeGolden(t *testing.T) {
	ten := envelope.Tenant{OrgID: "acme", WorkspaceID: `R&D "west"`, UserID: "zoë"}
	out, err := events.NewCallCompleted("/toolwire/executor", runID, fixtureEnvelope(), ten, runTrace)
	require.NoError(t, err)
	out.Event.SetTime(t0)
	m, err := events.Encode(out.Subject, &out.Event)
	require.NoError(t, err)

	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	type golden struct {
		Subject string            `json:"subject"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"` // exact bytes
	}
	g := golden{Subject: m.Subject, Headers: map[string]string{}, Body: string(m.Data)}
	for _, k := range keys {
		require.Len(t, m.Header[k], 1, k)
		g.Headers[k] = m.Header[k][0]
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	require.NoError(t, enc.Encode(g))
	got := buf.Bytes()

	path := filepath.Join("testdata", "encode_call_completed.golden.json")
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run TestEncodeGolden -update to create it")
	require.Equal(t, string(want), string(got))
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return v
}

// TestBothModesDecodeAlike: the SDK's setters trim white space around id,
// type and subject in binary mode; structured mode gives the same event.
func TestBothModesDecodeAlike(t *testing.T) {
	binary := &nats.Msg{Subject: "s", Data: []byte(`{}`), Header: nats.Header{
		"ce-specversion": {"1.0"}, "ce-id": {"%201%20"}, "ce-source": {"/s"},
		"ce-type": {"%20dev.toolwire.test.v1%09"}, "ce-subject": {"%20x"},
		"content-type": {"application/json"},
	}}
	structured := &nats.Msg{Subject: "s", Header: nats.Header{"content-type": {events.ContentTypeStructured}},
		Data: []byte(`{"specversion":"1.0","id":" 1 ","source":"/s","type":" dev.toolwire.test.v1\t","subject":" x","datacontenttype":"application/json","data":{}}`)}
	b, err := events.Decode(binary)
	require.NoError(t, err)
	s, err := events.Decode(structured)
	require.NoError(t, err)
	require.Equal(t, "1", b.ID())
	require.Equal(t, "dev.toolwire.test.v1", b.Type())
	require.Equal(t, "x", b.Subject())
	requireSameEvent(t, b, s)
}

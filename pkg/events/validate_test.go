package events

import (
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/stretchr/testify/require"
)

// The short road of validate accepts exactly what the SDK accepts, and a
// rejected event carries the SDK's own message.
func TestValidateAgreesWithTheSDK(t *testing.T) {
	base := func() event.Event {
		e := event.New()
		e.SetID("run-1/started")
		e.SetType(TypeRunStarted)
		e.SetSource("/toolwire/orchestrator")
		e.SetSubject("abc")
		e.SetDataSchema("https://toolwire.dev/schemas/x.json")
		_ = e.SetData(event.ApplicationJSON, []byte(`{}`))
		return e
	}
	ptr := func(s string) *string { return &s }
	cases := map[string]func(ec *event.EventContextV1){
		"valid":                      func(*event.EventContextV1) {},
		"empty id":                   func(ec *event.EventContextV1) { ec.ID = "" },
		"blank id":                   func(ec *event.EventContextV1) { ec.ID = " \t" },
		"non-breaking space id":      func(ec *event.EventContextV1) { ec.ID = "\u00a0" },
		"next-line id":               func(ec *event.EventContextV1) { ec.ID = "\u0085 " },
		"empty type":                 func(ec *event.EventContextV1) { ec.Type = "" },
		"blank type":                 func(ec *event.EventContextV1) { ec.Type = "\n" },
		"empty source":               func(ec *event.EventContextV1) { ec.Source = types.URIRef{} },
		"opaque source":              func(ec *event.EventContextV1) { ec.Source = *types.ParseURIRef("urn:toolwire:x") },
		"query-only source":          func(ec *event.EventContextV1) { ec.Source = *types.ParseURIRef("?a=b") },
		"fragment-only source":       func(ec *event.EventContextV1) { ec.Source = *types.ParseURIRef("#x") },
		"space path source":          func(ec *event.EventContextV1) { ec.Source.URL.Path = " " },
		"no content type":            func(ec *event.EventContextV1) { ec.DataContentType = nil },
		"json with charset":          func(ec *event.EventContextV1) { ec.DataContentType = ptr("application/json; charset=utf-8") },
		"text/plain":                 func(ec *event.EventContextV1) { ec.DataContentType = ptr("text/plain") },
		"blank content type":         func(ec *event.EventContextV1) { ec.DataContentType = ptr(" ") },
		"malformed content type":     func(ec *event.EventContextV1) { ec.DataContentType = ptr("application/") },
		"no data schema":             func(ec *event.EventContextV1) { ec.DataSchema = nil },
		"relative data schema":       func(ec *event.EventContextV1) { ec.DataSchema = types.ParseURI("/schemas/x.json") },
		"no subject":                 func(ec *event.EventContextV1) { ec.Subject = nil },
		"blank subject":              func(ec *event.EventContextV1) { ec.Subject = ptr("  ") },
		"subject with inner space":   func(ec *event.EventContextV1) { ec.Subject = ptr("a b") },
		"id with surrounding spaces": func(ec *event.EventContextV1) { ec.ID = " x " },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			e := base()
			ec, ok := e.Context.(*event.EventContextV1)
			require.True(t, ok)
			mutate(ec)
			want := e.Validate()
			got := validate(&e)
			if want == nil {
				require.NoError(t, got)
				return
			}
			require.Error(t, got)
			require.Equal(t, want.Error(), got.Error())
		})
	}
}

// An error a setter recorded, and a cloned event's context, take the SDK's
// road too.
func TestValidateSeesSetterErrorsAndClones(t *testing.T) {
	e := event.New()
	e.SetID("x")
	e.SetType(TypeRunStarted)
	e.SetSource("/toolwire")
	require.NoError(t, validate(&e))
	c := e.Clone()
	require.NoError(t, validate(&c))
	c.SetID("")
	require.Equal(t, c.Validate().Error(), validate(&c).Error())
	e.SetID("")
	require.Error(t, validate(&e))
	require.Equal(t, e.Validate().Error(), validate(&e).Error())
}

// mediaType reads the media type as the SDK does.
func TestMediaTypeAgreesWithTheSDK(t *testing.T) {
	for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "text/json ;x=y", " application/json ", "a;b;c"} {
		e := event.New()
		if ct != "" {
			e.SetDataContentType(ct)
		}
		require.Equal(t, e.DataMediaType(), mediaType(&e), "content type %q", ct)
	}
}

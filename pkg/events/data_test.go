package events_test

import (
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

func TestDecodeData(t *testing.T) {
	type target struct {
		RunID string `json:"run_id"`
		N     int    `json:"n"`
	}
	mk := func(ct, data string) *event.Event {
		e := event.New()
		e.SetID("1")
		e.SetType(events.TypeRunStarted)
		e.SetSource("/s")
		if ct != "" || data != "" {
			require.NoError(t, e.SetData(ct, []byte(data)))
		}
		return &e
	}
	cases := []struct {
		name, ct, data string
		want           target
		msg            string // "" means success
	}{
		{"ok", event.ApplicationJSON, `{"run_id":"r1","n":2}`, target{"r1", 2}, ""},
		{"text/json", "text/json", `{"run_id":"r1"}`, target{RunID: "r1"}, ""},
		{"no content type", "", `{"n":3}`, target{N: 3}, ""},
		{"whitespace after value", event.ApplicationJSON, "{\"n\":1}\n\t ", target{N: 1}, ""},
		{"unknown field", event.ApplicationJSON, `{"run_id":"r1","extra":true}`, target{}, `unknown field "extra"`},
		{"nested trailing value", event.ApplicationJSON, `{"n":1}{"n":2}`, target{}, "trailing content"},
		{"trailing garbage", event.ApplicationJSON, `{"n":1} x`, target{}, "trailing content"},
		{"trailing array", event.ApplicationJSON, `{"n":1}[]`, target{}, "trailing content"},
		{"trailing closing bracket", event.ApplicationJSON, `{"n":1}]`, target{}, "trailing content"},
		{"trailing closing brace", event.ApplicationJSON, "{\"n\":1} \n}", target{}, "trailing content"},
		{"wrong type", event.ApplicationJSON, `{"n":"two"}`, target{}, "cannot unmarshal"},
		{"not json", event.ApplicationJSON, `nope`, target{}, "invalid character"},
		{"xml", "application/xml", `<n>1</n>`, target{}, `data content type "application/xml", want application/json`},
		{"text", "text/plain", `{"n":1}`, target{}, `data content type "text/plain"`},
		{"json with charset", "application/json; charset=utf-8", `{"n":1}`, target{N: 1}, ""},
		{"no data", "", "", target{}, "has no data"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got target
			err := events.DecodeData(mk(tc.ct, tc.data), &got)
			if tc.msg == "" {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			require.ErrorIs(t, err, events.ErrInvalidEvent)
			require.ErrorContains(t, err, tc.msg)
			require.ErrorContains(t, err, events.TypeRunStarted, "the error names the event type")
		})
	}
}

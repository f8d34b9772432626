package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

func TestUsageEventRoundTripAndSchema(t *testing.T) {
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		u       events.Usage
		subject string
		id      string
	}{
		{"model turn", events.Usage{RunID: runID, N: 1, Kind: events.UsageKindModel, Tenant: tenant, Agent: "researcher",
			Iteration: 1, Provider: "openai", Model: "gpt-4o-mini", InputTokens: 1200, OutputTokens: 80, Cost: 0.000228},
			"toolwire.run." + runID + ".usage.1", runID + "/usage/1"},
		{"unpriced model", events.Usage{RunID: runID, N: 2, Kind: events.UsageKindModel, Tenant: tenant, Agent: "researcher",
			Iteration: 2, Provider: "openai", Model: "llama3", InputTokens: 10, Unpriced: true},
			"toolwire.run." + runID + ".usage.2", runID + "/usage/2"},
		{"tool call", events.Usage{RunID: runID, N: 12, Kind: events.UsageKindTool, Tenant: tenant, Agent: "researcher",
			Iteration: 1, Tool: "web_search@1.2.0", CallID: callID, Cost: 0.01, Billed: true},
			"toolwire.run." + runID + ".usage.12", runID + "/usage/12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := events.NewUsage("/toolwire/test", tc.u, runTrace)
			require.NoError(t, err)
			require.Equal(t, tc.subject, out.Subject)
			require.Equal(t, tc.id, out.Event.ID())
			require.Equal(t, events.TypeUsageRecorded, out.Event.Type())
			require.Equal(t, envelope.SchemaURL(events.SchemaUsage), out.Event.DataSchema())
			require.Equal(t, tenant.ID(), events.Ext(&out.Event, events.ExtTenantID))
			require.Equal(t, tc.u.CallID, events.Ext(&out.Event, events.ExtCallID))
			require.NoError(t, schemas.Validate(events.SchemaUsage, out.Event.Data()))

			m, err := events.Encode(out.Subject, &out.Event)
			require.NoError(t, err)
			require.Equal(t, tc.id, m.Header.Get(events.HeaderMsgID))
			got, err := events.Decode(m)
			require.NoError(t, err)
			var u events.Usage
			require.NoError(t, events.DecodeData(got, &u))
			require.Equal(t, tc.u, u)
		})
	}
}

func TestUsageRejectsBadInput(t *testing.T) {
	ok := events.Usage{RunID: runID, N: 1, Kind: events.UsageKindTool, Tenant: tenant, Tool: "echo@1.0.0", CallID: callID, Iteration: 1}
	for _, tc := range []struct {
		name   string
		change func(u *events.Usage)
		err    string
	}{
		{"unknown kind", func(u *events.Usage) { u.Kind = "storage" }, `usage kind "storage"`},
		{"negative cost", func(u *events.Usage) { u.Cost = -1 }, "negative"},
		{"negative tokens", func(u *events.Usage) { u.InputTokens = -5 }, "negative"},
		{"zero n", func(u *events.Usage) { u.N = 0 }, "must be at least 1"},
		{"unsafe run id", func(u *events.Usage) { u.RunID = "a.>" }, "run_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := ok
			tc.change(&u)
			_, err := events.NewUsage("/s", u, events.RunTrace{})
			require.ErrorContains(t, err, tc.err)
		})
	}

	// The schema refuses what a careless producer could send.
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	for name, data := range map[string]string{
		"model without model": `{"run_id":"r","n":1,"kind":"model","tenant":{"org_id":"o"},"agent":"a","iteration":1,"input_tokens":1,"output_tokens":1,"cost":0,"billed":true,"provider":"openai"}`,
		"tool without call":   `{"run_id":"r","n":1,"kind":"tool","tenant":{"org_id":"o"},"agent":"a","iteration":1,"input_tokens":0,"output_tokens":0,"cost":0,"billed":true,"tool":"echo@1.0.0"}`,
		"negative cost":       `{"run_id":"r","n":1,"kind":"tool","tenant":{"org_id":"o"},"agent":"a","iteration":1,"input_tokens":0,"output_tokens":0,"cost":-1,"billed":true,"tool":"echo@1.0.0","call_id":"ab"}`,
		"unknown field":       `{"run_id":"r","n":1,"kind":"tool","tenant":{"org_id":"o"},"agent":"a","iteration":1,"input_tokens":0,"output_tokens":0,"cost":0,"billed":true,"tool":"echo@1.0.0","call_id":"ab","price":3}`,
	} {
		require.ErrorIs(t, schemas.Validate(events.SchemaUsage, []byte(data)), envelope.ErrSchemaViolation, name)
	}
}

package events_test

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

func TestSchemaFSHoldsEveryEventSchema(t *testing.T) {
	names, err := fs.Glob(events.SchemaFS(), "*.schema.json")
	require.NoError(t, err)
	var got []string
	for _, n := range names {
		got = append(got, strings.TrimSuffix(n, ".schema.json"))
	}
	require.ElementsMatch(t, []string{
		events.SchemaRunStatus, events.SchemaTurn, events.SchemaCallRequest, events.SchemaCallStarted,
		events.SchemaApprovalRequest, events.SchemaDecision, events.SchemaCancelRequest,
		events.SchemaSandboxJob, events.SchemaSandboxResult, events.SchemaDelta,
	}, got)
}

// TestEventDataMatchesSchema validates the data of every constructor's event
// against the JSON Schema its dataschema names.
func TestEventDataMatchesSchema(t *testing.T) {
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	for _, c := range allConstructors(t) {
		t.Run(c.name, func(t *testing.T) {
			name := events.DataSchema(c.typ)
			require.Equal(t, envelope.SchemaURL(name), c.out.Event.DataSchema())
			require.NoError(t, schemas.Validate(name, c.out.Event.Data()))
		})
	}

	// And a violation is reported as one.
	err = schemas.Validate(events.SchemaCallStarted, []byte(`{"run_id":"a.b","call_id":"x"}`))
	require.ErrorIs(t, err, envelope.ErrSchemaViolation)
}

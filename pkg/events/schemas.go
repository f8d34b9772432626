package events

import (
	"embed"
	"fmt"
	"io/fs"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
)

//go:embed schemas/*.schema.json
var schemaFiles embed.FS

// Names of the event data schemas shipped in schemas/ (the dataschema of an
// event they describe is envelope.SchemaURL(name)). The files have no $id: a
// $ref names another event schema by its file name and a contract by its path
// on disk, ../../envelope/schemas/<name>.schema.json, so that the files resolve
// offline where they lie.
const (
	SchemaRunStatus   = "event_run_status"
	SchemaTurn        = "event_turn"
	SchemaCallRequest = "event_call_request"
	SchemaCallStarted = "event_call_started"
)

// SchemaFS returns the event data schema files.
func SchemaFS() fs.FS {
	sub, err := fs.Sub(schemaFiles, "schemas")
	if err != nil {
		panic(err) // the embedded tree always has the directory
	}
	return sub
}

// NewSchemas compiles the contract schemas of pkg/envelope together with the
// event data schemas, so that every event's data can be validated by name.
func NewSchemas() (*envelope.Schemas, error) {
	entries, err := fs.ReadDir(schemaFiles, "schemas")
	if err != nil {
		return nil, fmt.Errorf("read event schemas: %w", err)
	}
	extra := make(map[string][]byte, len(entries))
	for _, e := range entries {
		b, err := schemaFiles.ReadFile("schemas/" + e.Name())
		if err != nil {
			return nil, err
		}
		extra[strings.TrimSuffix(e.Name(), ".schema.json")] = b
	}
	return envelope.NewSchemas(extra)
}

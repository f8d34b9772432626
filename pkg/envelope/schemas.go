package envelope

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

//go:embed schemas/*.schema.json
var schemaFiles embed.FS

// Names of the contract schemas shipped in schemas/.
const (
	SchemaAgentOutputs   = "agent_outputs"
	SchemaToolEnvelope   = "tool_envelope"
	SchemaToolError      = "tool_error"
	SchemaToolDefinition = "tool_definition"
	SchemaRunRequest     = "run_request"
	SchemaPinnedHandle   = "pinned_handle"
	SchemaReplayBundle   = "replay_bundle"
)

// SchemaBaseURL is the prefix of every schema's URL; a schema named n has the URL
// SchemaBaseURL + n + ".schema.json", and its file is n + ".schema.json".
const SchemaBaseURL = "https://toolwire.dev/schemas/"

// SchemaURL is the URL that names the schema: the CloudEvents dataschema of an
// event whose data it describes, and the URL it is compiled at here.
//
// The files carry no $id: a schema's base is where it lies, and its $refs are
// relative to that (a sibling by file name, a contract from pkg/events/schemas/
// as ../../envelope/schemas/<name>.schema.json), so that a code generator reading
// the files from disk resolves every $ref without a network.
func SchemaURL(name string) string { return SchemaBaseURL + name + ".schema.json" }

// eventsToContracts is the path by which the event data schemas of pkg/events,
// in pkg/events/schemas/ on disk, reach a contract in pkg/envelope/schemas/.
const eventsToContracts = "../../envelope/schemas/"

// contractAliasURL is where a $ref of eventsToContracts + n + ".schema.json" from
// an extra schema compiled at SchemaURL lands; each contract is registered there
// too, so that such a $ref resolves to it.
func contractAliasURL(name string) string {
	u, err := url.Parse(SchemaURL("x"))
	if err != nil {
		panic(err) // SchemaBaseURL is a valid URL
	}
	return u.ResolveReference(&url.URL{Path: eventsToContracts + name + ".schema.json"}).String()
}

// SchemaFS returns the contract schema files, for serving or copying.
func SchemaFS() fs.FS {
	sub, err := fs.Sub(schemaFiles, "schemas")
	if err != nil {
		panic(err) // the embedded tree always has the directory
	}
	return sub
}

// ErrSchemaViolation is wrapped by every validation failure of a payload.
var ErrSchemaViolation = errors.New("payload violates its JSON Schema")

// SchemaError is a payload's validation failure, with one line per problem.
type SchemaError struct {
	Schema   string
	Problems []string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("%s %s: %s", e.Schema, ErrSchemaViolation, strings.Join(e.Problems, "; "))
}

func (e *SchemaError) Unwrap() error { return ErrSchemaViolation }

// Schemas holds compiled JSON Schemas. Build one with NewSchemas (the contract
// schemas) and add others with Add; it is safe for concurrent validation.
type Schemas struct {
	compiler *jsonschema.Compiler
	compiled map[string]*jsonschema.Schema
}

// NewSchemas compiles the contract schemas plus any extra files, given as name
// to schema document (for example the event data schemas of pkg/events). An
// extra schema named n is compiled at SchemaURL(n), and reaches a contract by a
// $ref to its file name (a sibling), to ../../envelope/schemas/ and its file name
// (the path from pkg/events/schemas/), or to its SchemaURL.
//
// Formats (date-time, uri-reference, ...) are asserted, not just annotations as
// draft 2020-12 makes them by default: a t_start that is not an RFC 3339
// timestamp is a violation.
func NewSchemas(extra map[string][]byte) (*Schemas, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	docs := map[string][]byte{}
	contracts := map[string]bool{}
	entries, err := fs.ReadDir(schemaFiles, "schemas")
	if err != nil {
		return nil, fmt.Errorf("read embedded schemas: %w", err)
	}
	for _, e := range entries {
		b, err := schemaFiles.ReadFile("schemas/" + e.Name())
		if err != nil {
			return nil, err
		}
		n := strings.TrimSuffix(e.Name(), ".schema.json")
		docs[n] = b
		contracts[n] = true
	}
	for n, b := range extra {
		docs[n] = b
		delete(contracts, n)
	}
	names := make([]string, 0, len(docs))
	for n, b := range docs {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("schema %s: %w", n, err)
		}
		if err := c.AddResource(SchemaURL(n), doc); err != nil {
			return nil, fmt.Errorf("schema %s: %w", n, err)
		}
		if contracts[n] {
			// Another resource of the same document: the contracts have no $id,
			// so the two do not clash.
			if err := c.AddResource(contractAliasURL(n), doc); err != nil {
				return nil, fmt.Errorf("schema %s: %w", n, err)
			}
		}
		names = append(names, n)
	}
	sort.Strings(names)
	s := &Schemas{compiler: c, compiled: make(map[string]*jsonschema.Schema, len(names))}
	for _, n := range names {
		sch, err := c.Compile(SchemaURL(n))
		if err != nil {
			return nil, fmt.Errorf("compile schema %s: %w", n, err)
		}
		s.compiled[n] = sch
	}
	return s, nil
}

// Validate checks raw JSON against the named schema. A violation is a
// *SchemaError; an unknown schema name or invalid JSON is a plain error.
func (s *Schemas) Validate(name string, raw []byte) error {
	sch, ok := s.compiled[name]
	if !ok {
		return fmt.Errorf("unknown schema %q", name)
	}
	v, err := decodeInstance(raw)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", name, ErrInvalidJSON, err)
	}
	return validateValue(name, sch, v)
}

// ValidateValue checks a Go value by marshalling it first.
func (s *Schemas) ValidateValue(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s: marshal: %w", name, err)
	}
	return s.Validate(name, b)
}

func validateValue(name string, sch *jsonschema.Schema, v any) error {
	err := sch.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("%s: %w", name, err)
	}
	return &SchemaError{Schema: name, Problems: ValidationProblems(ve)}
}

// ValidationProblems flattens a validator error into "at /path: message" lines,
// leaves only, in a stable order. The path is a JSON Pointer (RFC 6901) into the
// payload.
//
// The validator checks a propertyNames subschema against the name alone, so the
// causes of such a failure are located at "/" (the name), not at the object, and
// the object's own location is unreliable (jsonschema v6.0.3 aliases it); such
// lines are prefixed with the offending property name instead. The contract
// schemas use patternProperties, which reports at the object.
func ValidationProblems(ve *jsonschema.ValidationError) []string {
	printer := message.NewPrinter(language.English)
	var out []string
	var walk func(e *jsonschema.ValidationError, prefix string)
	walk = func(e *jsonschema.ValidationError, prefix string) {
		if pn, ok := e.ErrorKind.(*kind.PropertyNames); ok {
			prefix += fmt.Sprintf("property name %q: ", pn.Property)
		}
		if len(e.Causes) == 0 {
			out = append(out, fmt.Sprintf("at %s: %s%s", jsonPointer(e.InstanceLocation), prefix, e.ErrorKind.LocalizedString(printer)))
			return
		}
		for _, c := range e.Causes {
			walk(c, prefix)
		}
	}
	walk(ve, "")
	sort.Strings(out)
	return out
}

// jsonPointer joins reference tokens into a JSON Pointer, escaping '~' and '/'.
func jsonPointer(tokens []string) string {
	var b strings.Builder
	b.WriteByte('/')
	for i, t := range tokens {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// CompileToolSchema compiles a tool's input or output schema (any draft the
// document declares, 2020-12 by default) under a synthetic URL.
func CompileToolSchema(url string, doc []byte) (*jsonschema.Schema, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("tool schema %s: %w: %w", url, ErrInvalidJSON, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(url, v); err != nil {
		return nil, fmt.Errorf("tool schema %s: %w", url, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("tool schema %s: %w", url, err)
	}
	return sch, nil
}

// ValidateAgainst validates raw JSON against a compiled tool schema and returns
// a *SchemaError listing the problems.
func ValidateAgainst(name string, sch *jsonschema.Schema, raw []byte) error {
	v, err := decodeInstance(raw)
	if err != nil {
		return &SchemaError{Schema: name, Problems: []string{"not valid JSON: " + err.Error()}}
	}
	return validateValue(name, sch, v)
}

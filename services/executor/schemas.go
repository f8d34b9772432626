package executor

import (
	"bytes"
	"net/url"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/toolwire/toolwire/pkg/envelope"
)

// toolSchemas are the compiled schemas of one registry entry.
type toolSchemas struct {
	inputDoc, outputDoc []byte
	input, output       *jsonschema.Schema // output nil: the tool declares none
	err                 error              // the definition's schemas do not compile
}

// schemaCache compiles each tool's schemas once per name@version. An entry is
// compiled again only when the registry changes that version's schema
// documents.
type schemaCache struct {
	mu sync.Mutex
	m  map[string]*toolSchemas
}

func newSchemaCache() *schemaCache { return &schemaCache{m: map[string]*toolSchemas{}} }

// get returns def's compiled schemas; err says that they do not compile.
func (c *schemaCache) get(def *envelope.ToolDefinition) (*toolSchemas, error) {
	key := def.Ref().String()
	c.mu.Lock()
	defer c.mu.Unlock()
	if ts, ok := c.m[key]; ok && bytes.Equal(ts.inputDoc, def.InputSchema) && bytes.Equal(ts.outputDoc, def.OutputSchema) {
		return ts, ts.err
	}
	ts := compileToolSchemas(def)
	c.m[key] = ts
	return ts, ts.err
}

func compileToolSchemas(def *envelope.ToolDefinition) *toolSchemas {
	ts := &toolSchemas{
		inputDoc:  bytes.Clone(def.InputSchema),
		outputDoc: bytes.Clone(def.OutputSchema),
	}
	base := "https://toolwire.dev/tools/" + url.PathEscape(def.Name) + "/" + url.PathEscape(def.Version)
	ts.input, ts.err = envelope.CompileToolSchema(base+"/input.schema.json", def.InputSchema)
	if ts.err != nil || len(def.OutputSchema) == 0 {
		return ts
	}
	ts.output, ts.err = envelope.CompileToolSchema(base+"/output.schema.json", def.OutputSchema)
	return ts
}

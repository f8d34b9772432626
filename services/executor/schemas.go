package executor

import (
	"bytes"
	"sync"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// compiledSchemas are the compiled schemas of one registry entry, with the
// documents they were compiled from.
type compiledSchemas struct {
	inputDoc, outputDoc []byte
	schemas             *toolapi.Schemas
	err                 error // the definition's schemas do not compile
}

// schemaCache compiles each tool's schemas once per name@version. An entry is
// compiled again only when the registry changes that version's schema
// documents.
type schemaCache struct {
	mu sync.Mutex
	m  map[string]*compiledSchemas
}

func newSchemaCache() *schemaCache { return &schemaCache{m: map[string]*compiledSchemas{}} }

// get returns def's compiled schemas; err says that they do not compile.
func (c *schemaCache) get(def *envelope.ToolDefinition) (*toolapi.Schemas, error) {
	key := def.Ref().String()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs, ok := c.m[key]; ok && bytes.Equal(cs.inputDoc, def.InputSchema) && bytes.Equal(cs.outputDoc, def.OutputSchema) {
		return cs.schemas, cs.err
	}
	cs := &compiledSchemas{inputDoc: bytes.Clone(def.InputSchema), outputDoc: bytes.Clone(def.OutputSchema)}
	cs.schemas, cs.err = toolapi.CompileSchemas(def)
	c.m[key] = cs
	return cs.schemas, cs.err
}

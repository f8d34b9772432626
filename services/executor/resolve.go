package executor

import (
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// toolFor returns the Tool that runs a registry entry, by its implementation
// kind: the in-process tool of its builtin key (package builtin, web, or a
// Config.Tools one), the HTTP endpoint (package httptool), the MCP server's
// tool (package mcp) or a sandbox job (package sandboxtool); or the error
// that explains why this executor cannot run it.
func (s *Service) toolFor(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError) {
	ref := def.Ref()
	switch def.Implementation.Kind {
	case envelope.ImplHTTP:
		t, err := s.endpoints.Tool(def)
		if err != nil {
			return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run: %v", ref, err)
		}
		return t, nil
	case envelope.ImplSandbox:
		t, err := s.jobs.Tool(def)
		if err != nil {
			return nil, envelope.NewToolError(envelope.CodeSandboxError, "%v", err)
		}
		return t, nil
	case envelope.ImplMCP:
		t, err := s.mcp.Tool(def)
		if err != nil {
			return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: %v", ref, err)
		}
		return t, nil
	}
	key, err := toolapi.BuiltinKey(def)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: %v", ref, err)
	}
	t, ok := s.tools[key]
	if !ok {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s: builtin %q is not available in this executor", ref, key)
	}
	return t, nil
}

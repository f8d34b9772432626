package executor

import (
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// toolFor returns the Tool that runs a registry entry, by its implementation
// kind: the in-process tool of its builtin key (Config.Tools or a family's),
// or the tool the Kind of its implementation kind makes of it (the standard
// families' http, mcp and sandbox kinds); or the error that explains why
// this executor cannot run it.
func (s *Service) toolFor(def *envelope.ToolDefinition) (toolapi.Tool, *envelope.ToolError) {
	ref := def.Ref()
	switch kind := def.Implementation.Kind; kind {
	case envelope.ImplBuiltin:
	case envelope.ImplHTTP, envelope.ImplMCP, envelope.ImplSandbox:
		k, ok := s.kinds[kind]
		if !ok {
			// Only an executor built without the standard families (a
			// worker's) lacks these kinds.
			return nil, envelope.NewToolError(envelope.CodeUnknown,
				"tool %s cannot run here: it is a %s tool, and this worker runs only its own Go tools (the toolwire executor runs %s tools)", ref, kind, kind)
		}
		return k.Tool(def)
	default:
		if k, ok := s.kinds[kind]; ok {
			return k.Tool(def)
		}
	}
	key, err := toolapi.BuiltinKey(def)
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s cannot run in this executor: %v", ref, err)
	}
	t, ok := s.tools[key]
	if !ok && def.Queue != "" && !s.ownQueue(def.Queue) {
		// A worker's Go tool: its worker runs it (workers.go).
		return workerTool{s: s, def: *def, queue: def.Queue}, nil
	}
	if !ok {
		return nil, envelope.NewToolError(envelope.CodeUnknown, "tool %s: builtin %q is not available in this executor", ref, key)
	}
	return t, nil
}

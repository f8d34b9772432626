package sandbox

import (
	"encoding/json"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// PythonExecRef is the generic code tool the sandbox service registers.
var PythonExecRef = envelope.ToolRef{Name: "python_exec", Version: "1.0.0"}

// PythonExecDefinition is the registry entry of python_exec@1.0.0: it runs the
// code it is given. Its side effects are none: the code runs with no network
// and sees nothing of the host but read-only system directories, and what it
// writes is gone when it ends. Its cache is none, since code may use the
// clock or randomness. Like every tool, an agent can call it only when its
// enabled_tools name it.
func PythonExecDefinition() envelope.ToolDefinition {
	cfg, err := json.Marshal(events.SandboxToolConfig{Language: events.SandboxPython, CodeFromInput: true})
	if err != nil {
		panic(err) // a fixed struct always marshals
	}
	return envelope.ToolDefinition{
		Name:    PythonExecRef.Name,
		Version: PythonExecRef.Version,
		Description: "Run Python 3 code in an isolated sandbox: no network, no files of the host, bounded time, memory, " +
			"processes and output. `input` (any JSON) is given to the code as JSON on stdin; the result is what the " +
			"code printed on stdout and stderr. Only the standard library is available.",
		InputSchema: json.RawMessage(`{
  "type": "object",
  "required": ["code"],
  "properties": {
    "code": {"type": "string", "minLength": 1, "maxLength": 262144, "description": "Python 3 source to run."},
    "input": {"description": "Any JSON value, given to the code as JSON on stdin."}
  },
  "additionalProperties": false
}`),
		OutputSchema: json.RawMessage(`{
  "type": "object",
  "required": ["stdout", "stderr"],
  "properties": {
    "stdout": {"type": "string"},
    "stderr": {"type": "string"}
  },
  "additionalProperties": false
}`),
		Metadata: envelope.ToolMetadata{
			Category:    envelope.CategoryCode,
			SideEffects: envelope.SideEffectsNone,
			Cache:       envelope.CacheNone,
		},
		TimeoutMS:      30_000,
		Implementation: envelope.Implementation{Kind: envelope.ImplSandbox, Config: cfg},
		// Its dry run is the code and the limits it would run under
		// (services/executor/tools/sandboxtool).
		SupportsPreview: true,
	}
}

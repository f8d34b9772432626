package executor

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/tools/mcp"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
)

// TestWithoutFamilies: an executor built without families (a worker's) runs
// only its own tools; a registry entry of kind http, mcp or sandbox on its
// queue is answered with an error envelope that says so, and nothing runs.
func TestWithoutFamilies(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	reg := openRegistry(t, env.JS)
	s, err := New(testDeps(t, env, nil), Config{ID: "worker-0"}.With(WithTools(testtools.Tools()...)))
	require.NoError(t, err)
	startStopping(t, s)
	var names []string
	for _, def := range s.Definitions() {
		names = append(names, def.Name)
	}
	require.ElementsMatch(t, []string{"failing", "sleep"}, names, "no built-in, no web tool")

	base := testtools.Sleep().Definition()
	kinds := map[string]envelope.Implementation{
		"remote": {Kind: envelope.ImplHTTP, Config: json.RawMessage(`{"url":"http://127.0.0.1:9/hook"}`)},
		"calc":   mcp.Implementation(mcp.Config{Server: "calc", Transport: mcp.Stdio, Command: "/bin/true", Tool: "add"}),
		"py":     {Kind: envelope.ImplSandbox, Config: json.RawMessage(`{"language":"python","source":"print(1)"}`)},
	}
	const runID = "run-worker"
	w := watchRun(t, env.JS, runID)
	pub := publish.NewPublisher(env.JS)
	var reqs []events.CallRequest
	for name, impl := range kinds {
		putEntry(t, reg, base, registry.StateActive, func(d *envelope.ToolDefinition) {
			d.Name, d.Version, d.Implementation = name, "1.0.0", impl
		})
		req := callRequest(t, runID, len(reqs)+1, name, "1.0.0", `{"ms":1}`)
		publishApproved(t, pub, req)
		reqs = append(reqs, req)
	}
	for _, req := range reqs {
		e := w.envelopeOf(t, schemas, req)
		require.NotNil(t, e.Error, req.Name)
		require.Equal(t, envelope.CodeUnknown, e.Error.Code)
		require.Contains(t, e.Error.Message, "this worker runs only its own Go tools", req.Name)
	}
}

// Package envelope holds toolwire's data contracts: the stable AgentOutputs of an
// agent node, the ToolEnvelope receipt of every tool call, the ToolError taxonomy,
// tool definitions, run requests, pinned handles and replay bundles.
//
// The package does no I/O and knows nothing of NATS, so any upstream system can
// import it to build requests or read results. Every contract also ships as a JSON
// Schema (see Schemas) that is validated against real payloads in the tests.
package envelope

// Package executor is toolwire's Tool Executor (spec 2.2.3): it runs the tool
// calls that the Policy Guard approved and answers each with a ToolEnvelope.
//
// # Wiring
//
// Every replica pulls from one shared durable JetStream consumer, "executor",
// on the TOOLWIRE_CALLS stream, filtered to toolwire.call.*.*.approved. For each
// approved call (data: events.CallRequest) it publishes
// toolwire.call.<run>.<call>.started, runs the tool, and publishes
// toolwire.call.<run>.<call>.completed whose data is the envelope. The message
// is acknowledged only after the completed event is stored (PubAck). Event ids
// are deterministic ("<run>/<call>/completed") and are the Nats-Msg-Id, so a
// redelivered call whose completion was already published yields no second
// completed event; on a redelivery the executor also looks for that completion
// first and, finding it, acknowledges without running the tool again.
//
// Calls run in parallel (spec 6.3): up to Config.Concurrency per replica, and
// as many replicas as are deployed.
//
// # Catalog
//
// The executor watches the tool registry (a JetStream KV bucket) and looks each
// call's name@version up in that in-memory catalog, asking the registry itself
// before calling a tool unknown (a tool registered a moment ago may not have
// reached the watch yet). At Start it ensures the definition of every tool it
// implements in the registry, so that the other services see their schemas.
//
// A registry entry names its implementation. The executor runs entries of kind
// builtin: Implementation{Kind: "builtin", Config: {"builtin": "<key>"}} is run
// by the in-process Tool whose own definition carries that key (no config means
// the key is the tool's name). Several registry entries may therefore share one
// implementation: an operator can register sleep@0.0.1-test with a 50ms
// timeout, and the sleep built-in runs it under that definition's schemas and
// timeout. Entries of other kinds (http, mcp, sandbox) are not run by this
// executor yet and fail with UNKNOWN.
//
// # Outcomes
//
// Tool failures are data, never redeliveries; the envelope's error.code is one
// of the taxonomy's stable codes:
//
//   - VALIDATION_ERROR: the tool is not in the registry ("unknown tool
//     name@version"), or the input does not match the tool's input schema
//     (details: the list of problems, one "at /pointer: message" line each), or
//     a tool rejected its input itself (calculator syntax, unknown timezone).
//   - POLICY_DENIED: the registry marks the version blocked.
//   - TIMEOUT: the tool ran past its definition's timeout (timeout_ms, default
//     30s). Its context is cancelled at the deadline; a tool that ignores its
//     context is abandoned after a short grace period and logged.
//   - PROVIDER_ERROR: the tool's output is not JSON or does not match the
//     tool's own output schema (details: the problems). The output schema is
//     the tool's promise to its callers; output that breaks it is a failure of
//     the tool's provider, not of the caller's input, and is not passed on.
//   - UNKNOWN: the tool panicked or returned an error that is not a
//     *envelope.ToolError. The message is generic ("internal error in tool
//     name@version"); the real error is logged, never put in the envelope.
//   - any code: a tool that returns a *envelope.ToolError keeps its code,
//     message and details.
//
// Only infrastructure failures return an error to the consumer runner, which
// redelivers the call with back-off (and dead-letters it after the last
// attempt): an event that cannot be published, a registry that cannot be read,
// a shutdown that interrupts a call. A malformed approved event is
// dead-lettered at once.
//
// # Observability
//
// Each call has an OpenTelemetry span "execute_tool {name}" following the
// GenAI semantic conventions (gen_ai.operation.name, gen_ai.tool.name,
// gen_ai.tool.call.id, gen_ai.tool.type "extension": the tool runs on the
// agent's side), plus toolwire.run_id, toolwire.tool.version and, on failure,
// error.type (the error code). Its parent is the hop's trace context that the
// consumer runner extracted, and the started and completed events carry it on.
// Prometheus metrics: toolwire_executor_tool_calls_total{tool,code},
// toolwire_executor_tool_call_duration_seconds{tool} and
// toolwire_executor_tool_calls_in_flight.
package executor

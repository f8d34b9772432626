// Package executor is toolwire's Tool Executor (docs/architecture.md, The
// services; docs/tools.md, The pipeline): it runs the tool calls that the
// Policy Guard approved and answers each with a ToolEnvelope.
//
// # Wiring
//
// The Policy Guard routes each approved call to its tool's queue
// (toolwire.call.<run>.<call>.approved.<queue>; a tool definition names its
// queue, "default" when it names none). The executor serves Config.Queues
// (default ["default"]): for each, every replica serving it pulls from one
// shared durable JetStream consumer on the TOOLWIRE_CALLS stream, filtered to
// events.ApprovedFilter(queue) and named DurableFor(queue) ("executor" for
// the default queue, "executor-<queue>" for the others). For each approved
// call (data: events.CallRequest) it runs the tool and publishes
// toolwire.call.<run>.<call>.completed whose data is the envelope, and
// toolwire.call.<run>.<call>.started only when the call is still running
// after Config.StartedAfter (250ms by default; a quick call's t_start is in
// its envelope), or when it resolved secrets, whose scopes the started event
// records. A quick call thus stores two events: approved and completed. The
// message is acknowledged only after the events are stored (PubAck). Event
// ids are deterministic ("<run>/<call>/completed") and are the Nats-Msg-Id,
// so a redelivered call whose completion was already published yields no
// second completed event; on a redelivery the executor also looks for that
// completion first and, finding it, acknowledges without running the tool
// again.
//
// The completed envelope carries the call's cost (envelope.ToolEnvelope.Cost):
// the registry definition's cost when the envelope is billable (the tool ran,
// or may have: success, a provider or network error, a timeout; not served
// from the cache), else 0 (refused, invalid, rate limited, missing secrets,
// cached). Billing reads tool costs there; contract v2 has no usage event.
//
// Calls run in parallel (docs/tools.md, Scale-out): up to Config.Concurrency
// per replica and queue, and as many replicas as are deployed.
//
// # Catalog
//
// The executor watches the tool registry (a JetStream KV bucket) and looks each
// call's name@version up in that in-memory catalog, asking the registry itself
// before calling a tool unknown (a tool registered a moment ago may not have
// reached the watch yet). At Start it ensures the definition of every tool it
// implements in the registry, so that the other services see their schemas.
//
// A registry entry names its implementation, and its kind says who runs it
// (resolve.go):
//
//   - builtin: Implementation{Kind: "builtin", Config: {"builtin": "<key>"}}
//     is run by the in-process toolapi.Tool whose own definition carries that
//     key (no config means the key is the tool's name). Several registry entries
//     may therefore share one implementation: an operator can register
//     echo@0.0.1-test with a 50ms timeout, and the echo built-in runs it
//     under that definition's schemas and timeout.
//   - mcp: the tool of an MCP server, called through one session per server
//     (package tools/mcp).
//   - http: an HTTP endpoint (envelope.HTTPConfig): the call's input is
//     POSTed to it as JSON, with the config's headers, its secret headers
//     and, for a writes tool, Idempotency-Key: <run_id>.<call_id> (the same
//     on every run of the call), through
//     the web tools' SSRF-guarded client; the JSON body of a 2xx response is
//     the output (package tools/httptool). An entry whose config cannot run
//     (one stored before configs were checked) fails with UNKNOWN, saying
//     why.
//   - sandbox: code, sent to the sandbox service as a job; the executor holds
//     the call until the job's result comes back (package tools/sandboxtool).
//
// The kinds other than builtin are run by the Kinds of Config.Families; an
// executor without them (a worker's) answers a call of such an entry with
// UNKNOWN ("this worker runs only its own Go tools") and runs nothing.
//
// # Tools
//
// The pipeline (this package) runs every tool the same way; the tools live in
// one package per family under services/executor/tools, and implement
// toolapi.Tool (package toolapi), which imports nothing of the pipeline. This
// package imports none of them: it runs Config.Tools and the tools and kinds
// of Config.Families (Family, Kind), and package standard assembles the
// families of the executor binary (standard.Build), so that a worker, which
// builds this package's core with its own tools (Build), links none of them:
//
//   - builtin: echo, calculator, get_current_time, json_query.
//   - web: http_request (writes), http_get and web_fetch (reads), on one HTTP
//     client whose dialer refuses loopback, private, link-local, metadata and
//     other special-purpose addresses after DNS resolution, on every
//     connection: a refusal is POLICY_DENIED and nothing is sent.
//     TOOLWIRE_HTTP_ALLOW_HOSTS names the host[:port]s an operator trusts.
//   - httptool, mcp and sandboxtool: the runners of those kinds of registry
//     entries.
//   - testtools: failing and sleep, which only tests and benchmarks register
//     (Config.Tools, WithTools); a production executor never runs them.
//
// # Outcomes
//
// Tool failures are data, never redeliveries; the envelope's error.code is one
// of the taxonomy's stable codes:
//
//   - VALIDATION_ERROR: the tool is not in the registry ("unknown tool
//     name@version"), or the input does not match the tool's input schema
//     (details: the list of problems, one "at /pointer: message" line each), or
//     the input leaves no room in one message for the envelope that carries
//     it (the tool does not run; the input's size and the limit are named),
//     or a tool rejected its input itself (calculator syntax, unknown
//     timezone).
//   - POLICY_DENIED: the registry marks the version blocked.
//   - TIMEOUT: the tool ran past its definition's timeout (timeout_ms, default
//     30s). Its context is cancelled at the deadline; a tool that ignores its
//     context is abandoned after a short grace period and logged. A tool that
//     fails once its deadline has passed times out, whatever it failed with
//     (a ToolError of its own, a plain error, a panic); an output that comes
//     back is the outcome.
//   - PROVIDER_ERROR: the tool's output is not JSON or does not match the
//     tool's own output schema (details: the problems). The output schema is
//     the tool's promise to its callers; output that breaks it is a failure of
//     the tool's provider, not of the caller's input, and is not passed on.
//   - UNKNOWN: the tool panicked or returned an error that is not a
//     *envelope.ToolError. The message is generic ("internal error in tool
//     name@version"); the real error is logged, never put in the envelope.
//   - any code: a tool that returns a *envelope.ToolError keeps its code,
//     message and details.
//   - RATE_LIMIT: the tenant's token bucket for the tool (the definition's
//     rate_limit) is empty; retry_after_s says when a token is back.
//   - PROVIDER_ERROR with retry_after_s: the tool's circuit is open after
//     consecutive PROVIDER_ERROR, NETWORK_ERROR or TIMEOUT outcomes.
//   - UNKNOWN with the message MsgOutcomeUnknown: a writes call whose
//     executor stopped in the middle of it; it is not run again.
//   - TIMEOUT or POLICY_DENIED with details.cancelled (see Cancellation).
//
// # Cancellation
//
// Every replica subscribes to the runs' cancel requests
// (events.FilterRunCancelRequested, core NATS, no queue group) and
// remembers the runs cancelled lately, at most 4096 for an hour (cancel.go).
// A running call of a cancelled run is cut: its tool's context ends with a
// cause that says so (an HTTP tool's request is cancelled with it, the MCP
// client sends notifications/cancelled, a worker's call is stopped with
// toolwire.worker.<queue>.cancel) and the call is answered at once with
// events.CancelledCallError(true, ...): TIMEOUT, details.cancelled. A writes
// call cut short records that envelope as its outcome. A call of a
// cancelled run that has not started is answered
// events.CancelledCallError(false, ...), POLICY_DENIED, and never runs (a
// writes call with an outcome record is answered from it); a stale call
// also looks for the run's stored cancel request on the runs stream's
// leader, and a call whose run's end is stored is dropped (runover.go). A
// cancel whose tenant is not the call's (its org, and its workspace when it
// names one) stops nothing.
//
// # Runtime
//
// Between the input validation and the tool, a call meets the cache (KV
// toolwire_cache, per-key TTL, tenant-scoped envelope.CacheKey; tools with
// side effects none or reads and cache ttl or forever; a hit is the stored
// envelope with cached true and the call's own call_id, input and times), the
// tool's circuit (per replica, github.com/sony/gobreaker; Health reports it)
// and its rate limit (KV toolwire_rate, one token bucket per tenant and tool
// name, compare-and-set, shared by all replicas). A writes call is claimed in
// KV toolwire_outcomes (kv.Create, key "<run_id>.<call_id>") before it runs,
// kept alive by a heartbeat, and its envelope recorded there by
// compare-and-set: every later delivery publishes that record instead of
// running the tool, waits while a live claim's heartbeat goes on, and declares
// the outcome unknown once the heartbeat has stopped for a lease, unless the
// tool declares metadata.idempotent: then it retakes the claim and runs the
// tool again under the same idempotency key, within the bounds of retry.go.
// After the
// tool, an output larger than Config.MaxOutputBytes (64 KiB by default, at
// most 192 KiB, measured as the event encodes it), or whose envelope would
// not fit in one NATS message, is stored whole in the object store
// toolwire_blobs (package blobs) and replaced by a TruncatedOutput preview,
// itself cut to MaxOutputBytes, with truncated true and a blob attachment: no
// completed event grows with a tool's output.
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
// Prometheus metrics, each with the tool label name@version
// (service.ToolLabel; "_unknown" for a tool not in the registry):
// toolwire_executor_tool_calls_total{tool,code},
// toolwire_executor_tool_call_duration_seconds{tool},
// toolwire_executor_tool_calls_in_flight, toolwire_executor_tools_abandoned_total,
// toolwire_executor_cache_lookups_total{tool,result},
// toolwire_executor_rate_limited_total{tool},
// toolwire_executor_outputs_truncated_total{tool},
// toolwire_executor_circuit_state{tool} (0 closed, 1 half-open, 2 open),
// toolwire_executor_circuit_rejections_total{tool},
// toolwire_executor_write_redeliveries_total{tool,outcome},
// toolwire_executor_calls_cancelled_total{tool,stage} (refused, cut) and
// toolwire_executor_cancel_requests_invalid_total.
//
// # Lifecycle
//
// Service embeds service.Core (its Lifecycle among it): New reads no environment and does no I/O
// (Build reads the Config from the environment, then calls New); Start's
// context bounds the start only, and the registry watch, the MCP sessions,
// the preview server, the claims' heartbeats and the consumer run until Stop,
// which drains the calls in flight first.
package executor

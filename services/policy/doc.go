// Package policy is the Policy Guard (spec 2.2.4, 5.1, 7.2): the gate that
// checks every iteration of an agent run before the model is called, and
// every tool call before it is executed.
//
// The rules are pure functions over the event's data (the run's policy, the
// agent's enabled tools, the call's sequence number) and the tool registry's
// entry for the called version, so a Guard is unit-testable without NATS and
// the service keeps no state between events. Service wires a Guard to two
// durable consumers:
//
//   - iteration checks (toolwire.run.<run_id>.iteration.<n>.requested) are
//     answered with a verdict, .approved or .denied;
//   - tool call requests (toolwire.call.<run_id>.<call_id>.requested) are
//     re-published unchanged as .approved for the executor, or answered with
//     a POLICY_DENIED ToolEnvelope as the call's .completed event, which the
//     orchestrator hands back to the model as the tool's result.
//
// New rules (budget, side-effect ceiling, scopes, approvals) are added as
// further IterationRule or CallRule values; the first denial wins.
package policy

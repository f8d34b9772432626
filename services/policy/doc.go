// Package policy is the Policy Guard (spec 2.2.4, 5.1, 7.2): the gate that
// checks every iteration of an agent run before the model is called, and
// every tool call before it is executed.
//
// The rules are pure functions over the event's data (the run's policy, the
// agent's enabled tools, the call's sequence number) and the tool registry's
// entry for the called version, so a Guard is unit-testable without NATS and
// the service keeps no state between events. Service wires a Guard to three
// durable consumers (the subjects are events.Filter* constants):
//
//   - iteration checks (toolwire.run.<run_id>.iteration.<n>.requested) are
//     answered with a verdict, .approved or .denied (data: Verdict with the
//     code and reason);
//   - tool call requests (toolwire.call.<run_id>.<call_id>.requested) are
//     re-published unchanged as .approved for the executor, answered with a
//     POLICY_DENIED ToolEnvelope as the call's .completed event (its message
//     is the rule's reason), which the orchestrator hands back to the model
//     as the tool's result, or held for an operator's approval
//     (.approval_required, see below);
//   - operators' decisions (toolwire.call.<run_id>.<call_id>.decided).
//
// These events are the verdicts: every one carries its reason (a denial's in
// its envelope's error message, an approval request's in its reason field;
// an approval is the request itself, unchanged, which the executor consumes).
// The rule that decided, the reason and any warning (a deprecated tool) are
// also on the check's span and in the logs, and counted in
// toolwire_policy_verdicts_total and toolwire_policy_denials_total{rule}. No
// separate verdict event is published for calls: it would double the guard's
// publishes for nothing a consumer of the call's subjects cannot see.
//
// # Rules
//
// Iterations: max_iterations (default 10), then max_budget (budget.go).
// Tool calls, in order, the first denial winning: enabled_tools (a strict
// allow-list of name@version), max_tool_calls (default 25; calls are numbered
// in order across the parallel calls of a turn, so a turn that crosses the cap
// runs its first calls and is refused the rest), registered (the registry
// holds the version), lifecycle (blocked is refused, deprecated warns),
// side_effects (the node's ceiling none < reads < writes: a read-only node
// never runs a tool that writes; a tool declaring none is taken as writes),
// scopes (every scope in the tool's required_scopes must be in the policy's
// scopes), max_budget (budget.go). Each denial is POLICY_DENIED with the
// rule's reason; see the tests for the exact wording.
//
// # Approvals
//
// A policy may require approval for tools that write and for named tools
// (envelope.Policy.RequireApproval), with a deadline (ApprovalTimeoutS,
// default 15 minutes). An allowed call that needs approval is stored pending
// in the KV bucket events.BucketApprovals, and toolwire.call.<run>.<call>.
// approval_required carries an events.ApprovalRequest: tool, agent, an
// arguments summary with secret-looking fields and long values stripped
// (SummarizeArgs), a description of the effect, the call id as correlation
// id, the deadline and, when the tool's definition declares
// supports_preview, the executor's dry run of the call (asked by core NATS
// request/reply on events.SubjectPreview; "preview unavailable: <why>" when
// no executor answers in time or the tool has none). The other calls of the
// turn run meanwhile, and no goroutine waits: the record is all the state.
//
// An operator answers with `toolwire approve|deny|revise RUN CALL` (the event
// .decided). The first decision wins by compare-and-set on the record, and
// only then is the outcome published, from the record, under a deterministic
// event id:
//
//	approve  the call as requested, published as .approved: the executor runs it.
//	deny     POLICY_DENIED "approval denied[ by BY][: NOTE]",
//	         details {"approval": "deny", "by", "note"}.
//	revise   POLICY_DENIED "revision requested[ by BY]: NOTE",
//	         details {"approval": "revise", "by", "note"}: the model reads the
//	         operator's note as the call's result and may propose another call.
//	timeout  POLICY_DENIED "approval timed out: no decision within D",
//	         details {"approval": "timeout", "deadline"}.
//
// Deadlines are kept without a goroutine per call: each replica watches the
// bucket and sweeps the due records every Config.ApprovalSweep (500ms), and
// compare-and-set makes exactly one replica (or a decision arriving at the
// same moment) win. A decision for an unknown call, or one already decided
// or expired, is ignored, logged and counted
// (toolwire_policy_approvals_total{outcome="ignored"}); the CLI refuses it
// first.
package policy

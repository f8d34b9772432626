// Package policy is the Policy Guard service (docs/policy.md, Guard and
// Registry): the gate every tool call of an agent run passes before it is
// executed.
//
// The rules themselves are pure functions in pkg/rules, shared with the
// orchestrator: the loop rules (max_iterations, and max_budget before a
// model call) run where the loop runs, and their verdict is recorded on the
// turn event; this service runs the call rules. It keeps no state between
// events: a model turn carries everything a decision needs (the agent's
// policy and enabled tools, the run's spend, each call's number, declared
// cost and queue), and the tool registry is read from a watched in-memory
// catalog. Two durable consumers (the subjects are events.Filter*
// constants):
//
//   - model turns (toolwire.run.<run_id>.turn.<n>.completed, data
//     events.Turn, consumer DurableTurns). For every call of an allowed turn
//     that the orchestrator did not answer itself (TurnCall.Answered), in
//     seq order, rules.CheckCall judges it; the turn's outcomes are then
//     published together:
//     an allowed call is published as toolwire.call.<run_id>.<call_id>.
//     approved.<queue> (data events.CallRequest, Queue the call's queue,
//     "default" when its tool names none) for the workers of that queue; a
//     denied one as the call's toolwire.call.<run_id>.<call_id>.completed, a
//     POLICY_DENIED ToolEnvelope whose message is the rule's reason (its
//     input the turn's, byte for byte; cost 0: it never ran), which the
//     orchestrator hands back to the model as the tool's result; a call
//     that needs an operator is held (.approval_required, see below) after
//     the others are published, so that a slow preview holds back no other
//     call. A denied turn, or one without calls, needs nothing of the guard.
//   - operators' decisions (toolwire.call.<run_id>.<call_id>.decided).
//
// These events are the verdicts: every one carries its reason (a denial's in
// its envelope's error message, an approval request's in its reason field;
// an approval is the call itself, which its workers consume). The rule that
// decided, the reason and any warning (a deprecated tool) are also on the
// call's span (policy check_tool_call, a child of the turn's policy
// check_turn) and in the logs, and counted in
// toolwire_policy_verdicts_total{kind="call"} and
// toolwire_policy_denials_total{kind="call",rule}. There is no
// kind="iteration" any more: the loop verdicts are the orchestrator's, on
// its turn events.
//
// Every outcome has a deterministic event id (<run>/<call>/approved,
// /completed, /approval_required), so a turn handled twice stores each one
// once. A redelivered turn (the first delivery failed after storing part of
// its outcomes) does not judge again a call whose outcome is stored or that
// is held for approval: it publishes exactly what is missing, even if the
// registry changed in between. A turn that cannot be judged safely (ids
// that do not match its subject, a call id or queue that is not a subject
// token, two calls with one id or one number, a negative cost or spend) is
// dead-lettered whole, before anything of it is published.
//
// # Rules
//
// Tool calls, in order, the first denial winning (rules.DefaultCallRules):
// enabled_tools (a strict allow-list of name@version), max_tool_calls
// (default 25; calls are numbered in order across the parallel calls of a
// turn, so a turn that crosses the cap runs its first calls and is refused
// the rest), registered (the registry holds the version), lifecycle
// (blocked is refused, deprecated warns), side_effects (the node's ceiling
// none < reads < writes: a read-only node never runs a tool that writes; a
// tool declaring none is taken as writes), scopes (every scope in the
// tool's required_scopes must be in the policy's scopes), max_budget (the
// run's spend plus the declared cost of the turn's calls up to this one,
// the call's own at the higher of the turn's and the registry's, must stay
// within the budget: a turn that would cross it runs its first calls). Each
// denial is POLICY_DENIED with the rule's reason; see pkg/rules' tests for
// the exact wording.
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
//	approve  the call as the turn made it, published as .approved.<queue>
//	         (operator_approved set): its workers run it.
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

// Package approvals reads the calls waiting for a human (PendingApproval,
// ResolveCallID from a short id) and publishes an operator's decision on one
// (PublishDecision), as `toolwire approve` and the timeline do.
package approvals

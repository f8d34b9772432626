package sandbox

import (
	"fmt"
	"strings"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
)

// Cancelled runs (pkg/events/cancel.go; docs/agent-loop.md, Cancellation).
// Every replica subscribes to the runs' cancel requests, live and outside
// any queue group, and kills the jobs of a cancelled run it runs: the job's
// context ends with a cause that says so (cancels.Cause), and the supervisor kills every
// process of the job as it does at a timeout (the runtime's stop, then the
// cgroup, the process group, the job uid's processes: process.go). The job
// is answered TIMEOUT with details.cancelled (events.CancelledCallError).
// A job of a run cancelled lately that comes after the cancel (bounded in
// number and age) is answered so without running. The executor has
// answered the job's call already (it got the cancel too); the result is
// the job's record.

// tenantOf is the tenant of a job's tenant id ("org/workspace/user").
func tenantOf(id string) envelope.Tenant {
	org, rest, _ := strings.Cut(id, "/")
	ws, user, _ := strings.Cut(rest, "/")
	return envelope.Tenant{OrgID: org, WorkspaceID: ws, UserID: user}
}

// notRun is the error of a job of a cancelled run that did not run: a
// TIMEOUT (what a sandbox result may carry) whose details say cancelled,
// as events.CancelledCallError's do.
func notRun(said string) *envelope.ToolError {
	return envelope.NewToolError(envelope.CodeTimeout, "not run: the run was %s", said).
		WithDetails(map[string]any{"cancelled": true, "reason": said, "started": false})
}

// watchCancels subscribes to the runs' cancel requests (the runs are kept
// by pkg/jetstream/cancels); the returned func unsubscribes.
func (s *Service) watchCancels() (func(), error) {
	stop, err := cancels.Listen(s.JS.Conn(), s.cancels,
		func(req events.CancelRequest, n int) {
			if n > 0 {
				s.Log.Info("run cancelled: its jobs here are killed", "run_id", req.RunID, "jobs", n, "reason", req.Said())
			}
		},
		func(subject string, err error) {
			s.metrics.cancelsInvalid.Inc()
			s.Log.Warn("cancel request dropped", "subject", subject, "err", err)
		})
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return stop, nil
}

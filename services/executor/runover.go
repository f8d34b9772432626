package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
)

// Nothing of a run follows its end (issue 30 in the tracker; docs/tools.md,
// "Calls of ended runs"). An approved call whose run's deadline has passed
// is not started, and a running one is cut at that deadline (invoke); the
// orchestrator fails the run at its deadline, so a call started later
// could only run for nobody, and a writes call would have an effect its
// run never records. A call delivered again, or stored a while before it is
// delivered (a queue that waited through an outage), is checked against
// the run's end as the runs stream's leader has it: a run that has ended
// (completed, or failed for any reason) runs none of its calls.

// staleCall is how long after it was stored a call's first delivery is
// checked against its run's end: a call delivered at once belongs to a run
// that has just made it.
const staleCall = 5 * time.Second

// runOver reports why req, delivered as d, must not be started: over, when
// nothing of it is published (its run's deadline has passed, or its run
// has ended), or cancelled, why its run was cancelled (cancel.go), when it
// is answered POLICY_DENIED without running. Both "": it may start.
//
// A call of a run this replica knows cancelled, and a stale call (delivered
// again, or stored a while before its delivery), are checked against the
// run's end on the runs stream's leader; a stale call also against the
// run's stored cancel request, which a replica that was down when it was
// sent missed live.
func (s *Service) runOver(ctx context.Context, d *consume.Delivery, req *events.CallRequest) (over, cancelled string, err error) {
	now := s.now()
	if req.PastRunDeadline(now) {
		return "deadline", "", nil
	}
	said, known := s.cancels.Said(req.RunID, req.Tenant)
	stale := d.Attempt > 1 || d.Meta != nil && now.Sub(d.Meta.Timestamp) > staleCall
	if !stale && !known {
		return "", "", nil
	}
	ended, err := runEnded(ctx, s, req.RunID)
	switch {
	case err != nil:
		return "", "", err
	case ended:
		return "ended", "", nil
	case known:
		return "", said, nil
	}
	said, known, err = s.cancelStored(ctx, req.RunID, req.Tenant)
	if err != nil || !known {
		return "", "", err
	}
	return "", said, nil
}

// runEnded reports whether the runs stream holds the run's end (completed,
// failed or cancelled), read from
// its leader.
func runEnded(ctx context.Context, s *Service, runID string) (bool, error) {
	m, err := direct.RunEnd(ctx, s.JS, runID)
	if err != nil {
		return false, fmt.Errorf("executor: is run %s over: %w", runID, err)
	}
	return m != nil, nil
}

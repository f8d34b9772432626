package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/cancels"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
)

// Cancelled runs (pkg/events/cancel.go; docs/agent-loop.md, Cancellation).
// Every replica subscribes to the runs' cancel requests, live and outside
// any queue group: a run's calls may run on any replica. It remembers the
// runs cancelled lately (bounded in number and age) and cancels the
// context of each call of such a run it is running, with a cause that says
// so (cancels.Cause; pkg/jetstream/cancels keeps the runs): the tool stops (a worker's call is stopped on the
// worker too: workers.go), and the call is answered TIMEOUT with
// details.cancelled (events.CancelledCallError(true, ...)); a writes call
// cut short records that envelope as its outcome, so that a redelivery
// never runs it again. A call of a cancelled run that has not started is
// answered POLICY_DENIED (events.CancelledCallError(false, ...)) and never
// runs, unless its run's end is stored: then nothing of it is published
// (runover.go). A replica that missed the live request (it was down) finds
// it stored: a call delivered late or again looks for it on the runs
// stream's leader before it starts (runOver).

// watchCancels subscribes to the runs' cancel requests; the returned func
// unsubscribes, draining what was received.
func (s *Service) watchCancels() (func(), error) {
	stop, err := cancels.Listen(s.JS.Conn(), s.cancels,
		func(req events.CancelRequest, n int) {
			s.Log.Info("run cancelled: its calls here are stopped", "run_id", req.RunID, "cut", n, "reason", req.Said())
		},
		func(subject string, err error) {
			s.metrics.cancelsInvalid.Inc()
			s.Log.Warn("cancel request dropped", "subject", subject, "err", err)
		})
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	return stop, nil
}

// cancelStored looks for the run's cancel request on the runs stream's
// leader (a replica that was down missed it live) and, finding one made
// for tenant t, remembers it and returns why.
func (s *Service) cancelStored(ctx context.Context, runID string, t envelope.Tenant) (string, bool, error) {
	subj, err := events.RunSubject(runID, events.VerbCancelRequested)
	if err != nil {
		return "", false, err
	}
	m, err := direct.Last(ctx, s.JS, events.StreamRuns, subj)
	switch {
	case errors.Is(err, direct.ErrNotStored):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("executor: is run %s cancelled: %w", runID, err)
	}
	e, err := events.Decode(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	var req events.CancelRequest
	if err == nil {
		req, err = events.DecodeCancel(e, m.Subject)
	}
	if err != nil {
		s.metrics.cancelsInvalid.Inc()
		s.Log.Warn("stored cancel request ignored", "subject", m.Subject, "err", err)
		return "", false, nil
	}
	s.cancels.Cancel(req)
	said, ok := s.cancels.Said(runID, t)
	return said, ok, nil
}

package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
)

// Queues nobody serves (docs/tools.md, Queues nobody serves). The guard routes
// each approved call to its tool's queue; a queue with no live worker (no
// heartbeat of a process serving it: registry.Workers) would hold the call
// until its run's deadline, and the run with it. So before the approvals of a
// turn go out, the guard waits, at most Config.QueueWait, for a live worker of
// each of their queues, and answers each call whose queue still has none with
// a PROVIDER_ERROR envelope that names the queue: the model gets it as the
// call's result, as any failed call's, and the run goes on.
//
// A call an operator approved is checked the same way when its approval is
// settled (routeApproved); the result is stored in its approval record
// first, so that every replica settling it publishes the same outcome.
//
// The check is made here, where calls are routed, rather than in the agent
// loop or by a worker: no worker of that queue exists to answer, and the
// approval is not published at all, so a worker that starts later never runs
// a call whose failure the model was already given. The outcome is stable
// on a redelivered turn: the call's completion is in the stream, and
// judgedBefore keeps it.

// route is an approved call of a turn: its approval is outs[out].
type route struct {
	out int
	req events.CallRequest
}

// toServedQueues waits for a live worker of the queues of routes, then
// replaces the approval of each call whose queue has none with its
// completion.
func (s *Service) toServedQueues(ctx context.Context, outs []events.Outgoing, routes []route, rt events.RunTrace) error {
	if len(routes) == 0 {
		return nil
	}
	queues := make([]string, 0, len(routes))
	for _, r := range routes {
		queues = append(queues, cmp.Or(r.req.Queue, envelope.DefaultQueue))
	}
	missing, err := s.workers.Wait(ctx, queues, s.cfg.QueueWait)
	if err != nil || len(missing) == 0 {
		return err
	}
	now := time.Now()
	for _, r := range routes {
		q := cmp.Or(r.req.Queue, envelope.DefaultQueue)
		if !slices.Contains(missing, q) {
			continue
		}
		env := UnservedEnvelope(&r.req, q, s.cfg.QueueWait, now)
		out, err := events.NewCallCompleted(s.cfg.Source, r.req.RunID, env, r.req.Tenant, rt)
		if err != nil {
			return consume.Permanent(fmt.Errorf("turn: call %s on unserved queue %s: %w", r.req.CallID, q, err))
		}
		outs[r.out] = out
		s.metrics.unserved.WithLabelValues(q).Inc()
		s.Log.WarnContext(ctx, "no live worker serves the queue of an approved call: answered PROVIDER_ERROR",
			append(callArgs(&r.req), "queue", q, "waited", s.cfg.QueueWait)...)
	}
	return nil
}

// MsgNoWorker starts the message of an unserved call's envelope.
const MsgNoWorker = "no live worker serves queue"

// UnservedEnvelope is the receipt of a call whose queue had no live worker
// within wait: PROVIDER_ERROR, naming the queue, with what to do; details
// for programs ({"queue": ..., "waited_ms": ...}).
func UnservedEnvelope(req *events.CallRequest, queue string, wait time.Duration, now time.Time) envelope.ToolEnvelope {
	now = now.UTC()
	return envelope.ToolEnvelope{
		CallID:  req.CallID,
		Name:    req.Name,
		Version: req.Version,
		Input:   req.Input,
		Error: &envelope.ToolError{Code: envelope.CodeProviderError,
			Message: fmt.Sprintf("%s %q (waited %s): the tool %s cannot run until a worker of that queue is started (`toolwire tools list` shows each queue's workers)",
				MsgNoWorker, queue, wait, req.Ref()),
			Details: map[string]any{"queue": queue, "waited_ms": wait.Milliseconds()}},
		TStart: now,
		TEnd:   now,
	}
}

// routeApproved waits for a live worker of an operator-approved call's
// queue and stores the result in its record (Routed, and Unserved when there
// was none) by compare-and-set, returning the record and revision the
// outcome is published from. When another replica stored its result first,
// that one is returned.
func (s *Service) routeApproved(ctx context.Context, key string, rec events.ApprovalRecord, rev uint64) (events.ApprovalRecord, uint64, error) {
	q := cmp.Or(rec.Call.Queue, envelope.DefaultQueue)
	missing, err := s.workers.Wait(ctx, []string{q}, s.cfg.QueueWait)
	if err != nil {
		return rec, rev, err
	}
	rec.Routed = true
	if len(missing) > 0 {
		rec.Unserved = q
	}
	n, err := s.update(ctx, key, &rec, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// Routed (or settled) meanwhile by another replica: its result holds.
		cur, gerr := s.approvals.Get(ctx, key)
		if gerr != nil {
			return rec, rev, fmt.Errorf("read approval %s: %w", key, gerr)
		}
		stored, derr := events.DecodeApprovalRecord(cur.Value())
		if derr != nil {
			return rec, rev, consume.Permanent(fmt.Errorf("approval %s: %w", key, derr))
		}
		if !stored.Routed && !stored.Settled {
			return rec, rev, fmt.Errorf("approval %s changed while its queue was checked; retrying", key)
		}
		return stored, cur.Revision(), nil
	}
	if err != nil {
		return rec, rev, err
	}
	if rec.Unserved != "" {
		s.metrics.unserved.WithLabelValues(q).Inc()
		s.Log.WarnContext(ctx, "no live worker serves the queue of an operator-approved call: answered PROVIDER_ERROR",
			append(callArgs(&rec.Call), "queue", q, "waited", s.cfg.QueueWait)...)
	}
	return rec, n, nil
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Now()
	}
	return *t
}

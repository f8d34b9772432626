package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
)

// DurableCancels is the guard's consumer of cancel requests: the approvals
// a cancelled run waits for are withdrawn (docs/agent-loop.md,
// Cancellation).
const DurableCancels = "policy-cancels"

// cancelSpec is the consumer of the cancel requests.
func (s *Service) cancelSpec() consume.RunnerConfig {
	return consume.RunnerConfig{
		Spec: provision.ConsumerSpec{Stream: events.StreamRuns, Durable: DurableCancels,
			Filters: events.Filters(events.FilterRunCancelRequested)},
		Handler: s.handleCancel,
	}
}

// handleCancel withdraws every approval the run waits for: each record
// becomes withdrawn (a decision that comes later is refused) and its call
// is answered POLICY_DENIED, saying the run was cancelled; the orchestrator
// ends the run once its calls are all answered.
func (s *Service) handleCancel(ctx context.Context, d *consume.Delivery) error {
	c, err := events.DecodeCancel(d.Event, d.Subject)
	if err != nil {
		return consume.Permanent(fmt.Errorf("policy: %w", err))
	}
	lister, err := s.approvals.ListKeysFiltered(ctx, c.RunID+".*")
	if err != nil {
		return fmt.Errorf("policy: list the approvals of run %s: %w", c.RunID, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	withdrawn := 0
	for _, key := range keys {
		done, err := s.withdraw(ctx, key, c)
		if err != nil {
			return err
		}
		if done {
			withdrawn++
		}
	}
	if withdrawn > 0 {
		s.Log.InfoContext(ctx, "approvals of a cancelled run withdrawn", "run_id", c.RunID, "withdrawn", withdrawn)
	}
	return nil
}

// withdraw withdraws the approval record key when it is pending (or settles
// it when an earlier delivery withdrew it and died), reporting whether it
// withdrew it.
func (s *Service) withdraw(ctx context.Context, key string, c events.CancelRequest) (bool, error) {
	for range 5 {
		e, err := s.approvals.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read approval %s: %w", key, err)
		}
		rec, err := events.DecodeApprovalRecord(e.Value())
		if err != nil {
			return false, consume.Permanent(fmt.Errorf("approval %s: %w", key, err))
		}
		if !rec.Pending() {
			if rec.State == events.ApprovalWithdrawn && !rec.Settled {
				return false, s.settle(ctx, key, rec, e.Revision())
			}
			return false, nil // decided before the cancel: its outcome stands
		}
		now := time.Now().UTC()
		rec.State, rec.Withdrawn, rec.DecidedAt = events.ApprovalWithdrawn, strings.TrimSpace(c.Said()), &now
		rev, err := s.update(ctx, key, &rec, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return false, err
		}
		s.metrics.approvals.WithLabelValues(string(rec.State)).Inc()
		return true, s.settle(ctx, key, rec, rev)
	}
	return false, fmt.Errorf("withdraw %s: the record kept changing", key)
}

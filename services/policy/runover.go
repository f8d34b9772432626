package policy

import (
	"context"
	"fmt"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/direct"
)

// Nothing of a run follows its end. The guard judges no call of a turn
// whose run's deadline has passed, nor, when the turn is delivered again or
// late (staleTurn after it was stored: a guard that waited through an
// outage), of a run that has ended; and an approval settled after its run
// is over publishes no outcome (neither the call approved to its queue nor
// a denial). The executor checks the same before it starts a call
// (services/executor/runover.go).

// staleTurn is how long after it was stored a turn's first delivery is
// checked against its run's end.
const staleTurn = 5 * time.Second

// turnOver reports why the calls of turn t, delivered as d, must not be
// judged ("" when they may).
func (s *Service) turnOver(ctx context.Context, d *consume.Delivery, t *events.Turn) (string, error) {
	now := time.Now()
	if t.Deadline != nil && now.After(*t.Deadline) {
		return "deadline", nil
	}
	if d.Attempt <= 1 && (d.Meta == nil || now.Sub(d.Meta.Timestamp) <= staleTurn) {
		return "", nil
	}
	return s.ended(ctx, t.RunID)
}

// callOver reports why the outcome of an approval of call c must not be
// published ("" when it may).
func (s *Service) callOver(ctx context.Context, c *events.CallRequest) (string, error) {
	if c.PastRunDeadline(time.Now()) {
		return "deadline", nil
	}
	return s.ended(ctx, c.RunID)
}

// ended is "ended" when the runs stream's leader holds the run's end.
func (s *Service) ended(ctx context.Context, runID string) (string, error) {
	m, err := direct.RunEnd(ctx, s.JS, runID)
	switch {
	case err != nil:
		return "", fmt.Errorf("policy: is run %s over: %w", runID, err)
	case m != nil:
		return "ended", nil
	}
	return "", nil
}

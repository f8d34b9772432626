package consume

import (
	"context"
	"errors"
	"fmt"
)

// Lag is how far one durable consumer is behind, as its server counts it.
type Lag struct {
	Stream, Consumer string
	// Pending are the messages of the consumer's subjects not yet delivered
	// to it: the backlog an autoscaler (KEDA's nats-jetstream scaler) and an
	// alert watch.
	Pending uint64
	// AckPending are the messages delivered and not yet acknowledged: in
	// the handlers, or held by a replica that died until their ack wait.
	AckPending uint64
	// Redelivered are the messages delivered more than once and not yet
	// acknowledged.
	Redelivered uint64
}

// ErrNotStarted is returned by Lag of a runner that was never started.
var ErrNotStarted = errors.New("runner not started")

// Lag asks the server how far the runner's consumer is behind; ctx bounds
// the request.
func (r *Runner) Lag(ctx context.Context) (Lag, error) {
	l := Lag{Stream: r.cfg.Spec.Stream, Consumer: r.cfg.Spec.Durable}
	if r.cons == nil {
		return l, fmt.Errorf("lag of %s: %w", l.Consumer, ErrNotStarted)
	}
	info, err := r.cons.Info(ctx)
	if err != nil {
		return l, fmt.Errorf("lag of %s: %w", l.Consumer, err)
	}
	l.Pending = info.NumPending
	l.AckPending = uint64(max(info.NumAckPending, 0))   //nolint:gosec // not negative
	l.Redelivered = uint64(max(info.NumRedelivered, 0)) //nolint:gosec // not negative
	return l, nil
}

// LagTracker is an Observer that also follows the runners a Runners group
// starts with it, to report their lag (service.ConsumerMetrics): the group
// calls Track once a runner consumes and Untrack once it stopped.
type LagTracker interface {
	Track(r *Runner)
	Untrack(r *Runner)
}

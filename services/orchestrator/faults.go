package orchestrator

import "context"

// FaultPoint names a point of the agent loop where a test can make the
// orchestrator fail as if its process died there.
type FaultPoint string

// Fault points, in the order a turn passes them.
const (
	// FaultBeforeModel: the model call of a turn is due; the model is not
	// called yet.
	FaultBeforeModel FaultPoint = "before_model"
	// FaultAfterModel: the model answered; its turn is not published.
	FaultAfterModel FaultPoint = "after_model"
	// FaultAfterPublishTurn: the turn is published (the guard judges its
	// calls); the run state does not record it yet.
	FaultAfterPublishTurn FaultPoint = "after_publish_turn"
	// FaultAfterRecordEnvelope: a call's envelope is recorded in the run
	// state; what follows (the next model call) is not done.
	FaultAfterRecordEnvelope FaultPoint = "after_record_envelope"
	// FaultBeforePublishOutputs: the run has ended in its state; its
	// completed (or failed) event is not published.
	FaultBeforePublishOutputs FaultPoint = "before_publish_outputs"
)

// FaultPoints lists every fault point.
func FaultPoints() []FaultPoint {
	return []FaultPoint{FaultBeforeModel, FaultAfterModel, FaultAfterPublishTurn,
		FaultAfterRecordEnvelope, FaultBeforePublishOutputs}
}

// Faults injects failures for tests; production leaves Config.Faults nil.
// Fault is called at each point with the run and iteration at hand; returning
// an error, panicking or blocking until ctx ends simulates the process dying
// there: the handler stops, nothing after the point happens, and the event is
// redelivered to this or another replica.
type Faults interface {
	Fault(ctx context.Context, point FaultPoint, runID string, iteration int) error
}

// FaultsFunc adapts a function to Faults.
type FaultsFunc func(ctx context.Context, point FaultPoint, runID string, iteration int) error

// Fault implements Faults.
func (f FaultsFunc) Fault(ctx context.Context, point FaultPoint, runID string, iteration int) error {
	return f(ctx, point, runID, iteration)
}

func (s *Service) fault(ctx context.Context, p FaultPoint, runID string, iteration int) error {
	if s.cfg.Faults == nil {
		return nil
	}
	return s.cfg.Faults.Fault(ctx, p, runID, iteration)
}

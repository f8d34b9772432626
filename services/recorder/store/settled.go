package store

import (
	"context"
	"time"
)

// SettleWait is how long after its end a reader waits for a run to settle
// (the envelopes of its last calls): several fetch intervals of a loaded
// recorder. The live stream, the replay bundle and `toolwire replay` use it.
const SettleWait = 5 * time.Second

// Settled reports whether a run has ended and every tool call it made has its
// envelope recorded: nothing the run did is still on its way to the store.
//
// The recorder keeps a run's own events and its calls' events on separate
// consumers, with no order between them, so a run can be recorded as ended
// while the envelopes of its last calls are still being written (a fetch
// interval or so later). A reader that wants the whole run (a replay bundle,
// the end of a live stream) waits for Settled within a bound: a run one of
// whose calls never gets its envelope never settles.
func Settled(run Run, calls []ToolCall) bool {
	if !IsTerminal(run.Status) {
		return false
	}
	for _, c := range calls {
		if c.Status != CallCompleted {
			return false
		}
	}
	return len(calls) >= run.ToolCalls
}

// AwaitSettled reads run runID until it is Settled, a non-terminal run is
// read (a run still going is not waited for), or bound has passed since the
// run's last update (its UpdatedAt, the time of its latest event: a run that
// ended long ago and never settled is not waited for again at every read),
// looking again every poll (25 ms when poll is not positive). It returns the
// last run read, whether it is settled, and the error of a read that failed
// (ErrRunNotFound for a run s does not have) or ctx's.
func AwaitSettled(ctx context.Context, s Store, runID string, bound, poll time.Duration) (Run, bool, error) {
	if poll <= 0 {
		poll = 25 * time.Millisecond
	}
	deadline := time.Now().Add(bound)
	for first := true; ; first = false {
		run, err := s.Run(ctx, runID)
		if err != nil {
			return Run{}, false, err
		}
		if !IsTerminal(run.Status) {
			return run, false, nil
		}
		calls, err := s.ToolCalls(ctx, runID)
		if err != nil {
			return run, false, err
		}
		if Settled(run, calls) {
			return run, true, nil
		}
		if first && !run.UpdatedAt.IsZero() {
			if end := run.UpdatedAt.Add(bound); end.Before(deadline) {
				deadline = end
			}
		}
		wait := min(poll, time.Until(deadline))
		if wait <= 0 {
			return run, false, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return run, false, ctx.Err()
		case <-t.C:
		}
	}
}

package eventstest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolwire/toolwire/pkg/events"
)

// Ended is what AfterEnd found of one run that ended.
type Ended struct {
	RunID string
	// Ends are the subjects of the run's end events, in storage order: one,
	// unless the run ended twice.
	Ends []string
	// After are the run's events stored after its first end (subject and
	// event type), in any stream: none, unless something of the run went on
	// after it ended.
	After []string
}

// AfterEnd reads every message of the runs, calls and sandbox streams and
// returns, for each run that ended more than once or has events stored after
// its first end (a cancel request aside: anyone allowed may ask at any
// time), what broke the rule "nothing of a run follows its end": an
// empty result means it held for every run. Messages of different streams
// are ordered by the time the server stored them. The reads are bounded by
// ctx.
func AfterEnd(ctx context.Context, js jetstream.JetStream) ([]Ended, error) {
	type stored struct {
		subject string
		at      time.Time
		seq     uint64
		stream  int
	}
	byRun := map[string][]stored{}
	for i, name := range []string{events.StreamRuns, events.StreamCalls, events.StreamSandbox} {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("after end: %s: %w", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("after end: %s: %w", name, err)
		}
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("after end: %s #%d: %w", name, seq, err)
			}
			tokens := strings.Split(m.Subject, ".")
			if len(tokens) < 3 {
				continue
			}
			byRun[tokens[2]] = append(byRun[tokens[2]], stored{subject: m.Subject, at: m.Time, seq: seq, stream: i})
		}
	}
	var out []Ended
	for run, msgs := range byRun {
		slices.SortFunc(msgs, func(a, b stored) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			if a.stream != b.stream {
				return a.stream - b.stream
			}
			return cmp.Compare(a.seq, b.seq)
		})
		e := Ended{RunID: run}
		for _, m := range msgs {
			switch {
			case isEnd(run, m.subject):
				e.Ends = append(e.Ends, m.subject)
			case isCancelRequest(run, m.subject):
				// A request from outside, which anyone allowed may send at
				// any time: not something of the run.
			case len(e.Ends) > 0:
				e.After = append(e.After, m.subject)
			}
		}
		if len(e.Ends) > 1 || len(e.After) > 0 {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Ended) int { return strings.Compare(a.RunID, b.RunID) })
	return out, nil
}

func isCancelRequest(runID, subject string) bool {
	s, err := events.RunSubject(runID, events.VerbCancelRequested)
	return err == nil && s == subject
}

func isEnd(runID, subject string) bool {
	for _, v := range events.EndVerbs() {
		if s, err := events.RunSubject(runID, v); err == nil && s == subject {
			return true
		}
	}
	return false
}

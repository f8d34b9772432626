package postgres_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestPostgresGateAcrossConcurrentWriters: recorder replicas write a run's
// events in concurrent transactions, in any order: one writes the calls'
// completions while another writes the turn that made them. Whichever
// commits first, nothing is lost: a completion parked for want of its turn
// is applied by the transaction that writes the turn (the runs' advisory
// locks order the two), so every run ends as in order.
func TestPostgresGateAcrossConcurrentWriters(t *testing.T) {
	s, _ := newPostgres(t)
	const runs = 24
	var fxs []*storetest.Run
	var wg sync.WaitGroup
	errs := make(chan error, 2*runs)
	for i := range runs {
		fx := storetest.CompletedRun(t, fmt.Sprintf("run-race-%02d", i), "weather", storetest.TenantA, storetest.Base)
		fxs = append(fxs, fx)
		var turn, rest []store.Record
		for _, r := range fx.Records(t) {
			if r.Event.Type == events.TypeTurnCompleted {
				turn = append(turn, r)
			} else {
				rest = append(rest, r)
			}
		}
		// Two writers, racing: the turn alone, and everything else.
		for _, recs := range [][]store.Record{rest, turn} {
			wg.Go(func() {
				if err := s.Write(testCtx(t), recs...); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, fx := range fxs {
		storetest.CheckRun(t, s, fx)
	}
}

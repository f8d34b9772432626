package storetest

import (
	"testing"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
)

// runIDContract: a store keys events per run (store.EventKey). Event ids are
// deterministic for what they announce (issue 29), so one tenant can learn
// those of another's run to come and give its own run's events those ids:
// that must neither drop the other run's events as redeliveries nor park
// or release one run's events for the other's.
func runIDContract(t *testing.T, newStore func(t *testing.T) store.Store) {
	// squat is the victim's run and a run of another tenant whose every
	// event has the id of the victim's event at the same place (both runs
	// make the same calls, so even the call ids agree).
	squat := func(t *testing.T) (victim, squatter *Run, vrecs, srecs []store.Record) {
		victim = CompletedRun(t, "run-victim", "weather", TenantB, Base)
		squatter = CompletedRun(t, "run-squatter", "weather", TenantA, Base)
		if len(victim.Events) != len(squatter.Events) {
			t.Fatalf("the fixtures differ: %d and %d events", len(victim.Events), len(squatter.Events))
		}
		for i := range squatter.Events {
			squatter.Events[i].Event.SetID(victim.Events[i].Event.ID())
		}
		return victim, squatter, victim.Records(t), squatter.Records(t)
	}
	check := func(t *testing.T, s store.Store, runs ...*Run) {
		t.Helper()
		for _, fx := range runs {
			CheckRun(t, s, fx)
			evs, err := s.Events(ctx(t), fx.RunID)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != len(fx.Events) {
				t.Fatalf("run %s: %d events, want %d", fx.RunID, len(evs), len(fx.Events))
			}
			want := map[string]string{} // id: subject
			for _, o := range fx.Events {
				want[o.Event.ID()] = o.Subject
			}
			for _, e := range evs {
				if e.RunID != fx.RunID || want[e.ID] != e.Subject {
					t.Fatalf("run %s has event %s of run %s on %s, want it on %q", fx.RunID, e.ID, e.RunID, e.Subject, want[e.ID])
				}
				delete(want, e.ID)
			}
		}
	}

	t.Run("AnotherRunsEventIDsSuppressNothing", func(t *testing.T) {
		s := newStore(t)
		victim, squatter, vrecs, srecs := squat(t)
		for _, rec := range srecs {
			mustWrite(t, s, rec)
		}
		for _, rec := range vrecs {
			mustWrite(t, s, rec)
		}
		check(t, s, victim, squatter)
		// Each run's own redelivery is still one event.
		mustWrite(t, s, vrecs...)
		mustWrite(t, s, srecs...)
		check(t, s, victim, squatter)
	})

	t.Run("OneBatchOfTwoRunsUnderOneSetOfIDs", func(t *testing.T) {
		s := newStore(t)
		victim, squatter, vrecs, srecs := squat(t)
		var mixed []store.Record
		for i := range vrecs {
			mixed = append(mixed, srecs[i], vrecs[i])
		}
		mustWrite(t, s, mixed...)
		check(t, s, victim, squatter)
	})

	t.Run("ParkedPerRun", func(t *testing.T) {
		s := newStore(t)
		victim, squatter, vrecs, srecs := squat(t)
		// Everything but the requests first: both runs' events wait, under
		// the same ids; the squatter's request lets in its own only.
		isRequest := func(r *store.Record) bool { return r.Event.Type == events.TypeRunRequested }
		for i := range vrecs {
			if !isRequest(&srecs[i]) {
				mustWrite(t, s, srecs[i])
			}
			if !isRequest(&vrecs[i]) {
				mustWrite(t, s, vrecs[i])
			}
		}
		for i := range srecs {
			if isRequest(&srecs[i]) {
				mustWrite(t, s, srecs[i])
			}
		}
		if _, err := s.Run(ctx(t), victim.RunID); err == nil {
			t.Fatal("the victim's run has a row before its request")
		}
		for i := range vrecs {
			if isRequest(&vrecs[i]) {
				mustWrite(t, s, vrecs[i])
			}
		}
		check(t, s, victim, squatter)
	})
}

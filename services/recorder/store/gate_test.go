package store_test

import (
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestAdmit: the gate's decisions, record by record, without a store.
func TestAdmit(t *testing.T) {
	fx := storetest.CompletedRun(t, "run-admit", "weather", storetest.TenantA, storetest.Base)
	recs := fx.Records(t)
	byType := func(typ string) []store.Record {
		var out []store.Record
		for _, r := range recs {
			if r.Event.Type == typ {
				out = append(out, r)
			}
		}
		return out
	}
	request, turn := byType(events.TypeRunRequested)[0], byType(events.TypeTurnCompleted)[0]
	done := byType(events.TypeCallCompleted)[0]
	end := byType(events.TypeRunCompleted)[0]

	// Nothing known, no parked records: a completion waits, and nil maps
	// are fine.
	a := store.Admit([]store.Record{done}, nil, nil)
	if len(a.Apply) != 0 || len(a.Park) != 1 || a.Park[0].Stored {
		t.Fatalf("completion of an unknown run: %+v", a)
	}

	// The request lets in what was parked, in order, and a call event
	// waits for its turn, which lets it in.
	parked := map[string][]store.Parked{fx.RunID: {{Record: done, Stored: true}, {Record: turn, Stored: true}}}
	a = store.Admit([]store.Record{request}, map[string]*store.RunGate{}, parked)
	if ids := eventIDs(a.Apply); len(ids) != 3 || ids[0] != request.Event.ID || ids[1] != turn.Event.ID || ids[2] != done.Event.ID {
		t.Fatalf("applied %v; want the request, the turn, then the completion", ids)
	}
	if len(a.Released) != 2 || len(a.Park) != 0 {
		t.Fatalf("released %v parked %+v", a.Released, a.Park)
	}

	// After the end: a later event is dropped, an earlier one applies, a
	// second request is dropped.
	endAt := end.Event.Time
	gates := map[string]*store.RunGate{fx.RunID: {Known: true, End: &endAt, Calls: map[string]bool{done.Event.CallID: true}}}
	late := done
	late.Event.ID, late.Event.Time = "late", endAt.Add(time.Millisecond)
	a = store.Admit([]store.Record{late, done, request}, gates, nil)
	if ids := eventIDs(a.Apply); len(ids) != 1 || ids[0] != done.Event.ID {
		t.Fatalf("applied %v; want only the completion dated before the end", ids)
	}
	if ids := eventIDs(a.Dropped); len(ids) != 2 || ids[0] != "late" || ids[1] != request.Event.ID {
		t.Fatalf("dropped %v; want the late completion and the second request", ids)
	}
}

func eventIDs(recs []store.Record) []string {
	ids := make([]string, 0, len(recs))
	for _, r := range recs {
		ids = append(ids, r.Event.ID)
	}
	return ids
}

// TestParkedRecordRoundTrip: a parked record reads back as it was, but for
// its event's data and extensions (kept in the events table).
func TestParkedRecordRoundTrip(t *testing.T) {
	fx := storetest.CompletedRun(t, "run-park", "weather", storetest.TenantA, storetest.Base)
	for _, r := range fx.Records(t) {
		doc, err := store.EncodeParked(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := store.DecodeParked(doc)
		if err != nil {
			t.Fatal(err)
		}
		want := r
		want.Event.Data, want.Event.Extensions = nil, nil
		a, _ := store.EncodeParked(want)
		b, _ := store.EncodeParked(got)
		if string(a) != string(b) || store.IsRunRequest(&got) != store.IsRunRequest(&r) ||
			(got.Run != nil && (got.Run.Spend == nil) != (r.Run.Spend == nil)) {
			t.Fatalf("%s: parked %s\nread back %s", r.Event.ID, a, b)
		}
	}
}

package postgres_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/postgres"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestALongTransactionHidesNoEvents: a transaction left open elsewhere on the
// server (another service's, an operator's psql, a vacuum) must not hide the
// events recorded while it runs, from the full read nor from the live
// stream's paging. The events table used to show only events older than the
// oldest running transaction, so one idle session stalled every run's
// stream until it ended.
func TestALongTransactionHidesNoEvents(t *testing.T) {
	s, pool := newPostgres(t)
	ctx := testCtx(t)
	idle, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = idle.Rollback(context.Background()) }()
	var xid string
	if err := idle.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}

	fx := storetest.CompletedRun(t, "run-long-tx", "weather", storetest.TenantA, storetest.Base)
	recs := fx.Records(t)
	for _, rec := range recs {
		if err := s.Write(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.Events(ctx, fx.RunID)
	if err != nil || len(evs) != len(recs) {
		t.Fatalf("Events with transaction %s open = %d events, %v; want %d", xid, len(evs), err, len(recs))
	}
	page, err := s.EventsAfter(ctx, fx.RunID, evs[0].Seq, 2)
	if err != nil || len(page) != 2 || page[0].Seq != evs[1].Seq {
		t.Fatalf("EventsAfter(seq %d, 2) = %d events, %v; want the next two", evs[0].Seq, len(page), err)
	}
}

// TestWritersOfOneRunCommitInSeqOrder: two recorders writing events of the
// same run commit them in the order of their seqs, so a reader paging by seq
// never sees a higher seq while a lower one is still to commit (it would skip
// it for good). The second writer, whose seqs come later, waits for the
// first; a writer of another run does not.
func TestWritersOfOneRunCommitInSeqOrder(t *testing.T) {
	s, pool := newPostgres(t)
	ctx := testCtx(t)
	recs := storetest.CompletedRun(t, "run-order", "weather", storetest.TenantA, storetest.Base).Records(t)
	other := storetest.CompletedRun(t, "run-other", "weather", storetest.TenantA, storetest.Base).Records(t)

	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(context.Background()) }()
	if err := postgres.WriteTx(ctx, first, recs[:1]); err != nil {
		t.Fatal(err)
	}

	// Another run's writer goes through while the first is open.
	if err := s.Write(ctx, other...); err != nil {
		t.Fatalf("a writer of another run: %v", err)
	}

	second := make(chan error, 1)
	go func() { second <- s.Write(ctx, recs[1:]...) }()
	// Wait until the second writer waits for the run's lock.
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = $1
			AND objsubid = 2 AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`, postgres.RunLockClass).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-second:
			t.Fatalf("the second writer of the run committed (err %v) before the first", err)
		case <-ctx.Done():
			t.Fatal("the second writer never waited for the run's lock")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if evs, err := s.Events(ctx, "run-order"); err != nil || len(evs) != 0 {
		t.Fatalf("events before either commits = %d, %v; want none", len(evs), err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the second writer never committed")
	}
	evs, err := s.Events(ctx, "run-order")
	if err != nil || len(evs) != len(recs) {
		t.Fatalf("events = %d, %v; want %d", len(evs), err, len(recs))
	}
	if evs[0].ID != recs[0].Event.ID {
		t.Fatalf("lowest seq holds %s; want the first writer's %s", evs[0].ID, recs[0].Event.ID)
	}
	if !slices.IsSortedFunc(evs, func(a, b store.EventRow) int { return int(a.Seq - b.Seq) }) {
		t.Fatal("events are not in seq order")
	}
}

package postgres

import (
	"io/fs"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestEventsPerRunMigratesAnExistingDatabase: migration 00007 keys events
// per run on a database that a recorder of version 6 wrote: its rows stay,
// and another run's events of the same ids are stored beside them.
func TestEventsPerRunMigratesAnExistingDatabase(t *testing.T) {
	ctx := testContext(t)
	pool, err := NewPool(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	dir, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, dir, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	// What version 6 held: an old run's events, one of no run, a parked one.
	old := storetest.CompletedRun(t, "run-old", "weather", storetest.TenantA, storetest.Base)
	for _, o := range old.Events {
		if _, err := pool.Exec(ctx, `INSERT INTO events (event_id, run_id, type, subject, source, time)
			VALUES ($1, $2, $3, $4, $5, $6)`, o.Event.ID(), old.RunID, o.Event.Type(), o.Subject, o.Event.Source(), o.Event.Time()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO events (event_id, type, subject, source, time) VALUES ('loose', 't', 's', 'src', now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO parked_events (event_id, run_id, record) VALUES ('p-1', 'run-parked', '{}')`); err != nil {
		t.Fatal(err)
	}

	res, err := Migrate(ctx, pool, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) == 0 || res.Applied[0] != 7 {
		t.Fatalf("applied %v, want 7 on", res.Applied)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil || n != len(old.Events)+1 {
		t.Fatalf("events after the migration: %d (err %v), want %d", n, err, len(old.Events)+1)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM parked_events WHERE event_id = 'p-1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("parked events after the migration: %d (err %v)", n, err)
	}

	// A new run whose events have the old run's ids is recorded whole.
	s := New(pool)
	fx := storetest.CompletedRun(t, "run-new", "weather", storetest.TenantB, storetest.Base)
	for i := range fx.Events {
		fx.Events[i].Event.SetID(old.Events[i].Event.ID())
	}
	if err := s.Write(ctx, fx.Records(t)...); err != nil {
		t.Fatal(err)
	}
	storetest.CheckRun(t, s, fx)
	// An event of no run is still one row however often it comes.
	for range 2 {
		if _, err := pool.Exec(ctx, insertEventsSQL, []string{"loose"}, []*string{nil}, []*string{nil}, []string{"t"},
			[]string{"s"}, []string{"src"}, []any{storetest.Base}, []*string{nil}, []*int64{nil}, []*string{nil}, []*string{nil}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE event_id = 'loose'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("events of no run under one id: %d (err %v), want 1", n, err)
	}
}

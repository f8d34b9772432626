package sqlite

import (
	"io/fs"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestEventsPerRunMigratesAnExistingDatabase: migration 00005 rebuilds the
// events and parked_events tables keyed per run on a database that a
// recorder of version 4 wrote: its rows stay, in their recorded order, and
// another run's events of the same ids are stored beside them.
func TestEventsPerRunMigratesAnExistingDatabase(t *testing.T) {
	ctx := t.Context()
	s, err := Open(URL(filepath.Join(t.TempDir(), "recorder.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	dir, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, s.db, dir, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 4); err != nil {
		t.Fatal(err)
	}
	old := storetest.CompletedRun(t, "run-old", "weather", storetest.TenantA, storetest.Base)
	for _, o := range old.Events {
		if _, err := s.db.ExecContext(ctx, `INSERT INTO events (event_id, run_id, type, subject, source, time, recorded_at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)`, o.Event.ID(), old.RunID, o.Event.Type(), o.Subject, o.Event.Source(),
			fmtTime(o.Event.Time())); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO parked_events (event_id, run_id, record) VALUES ('p-1', 'run-parked', '{}')`); err != nil {
		t.Fatal(err)
	}

	res, err := Migrate(ctx, s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) == 0 || res.Applied[0] != 5 {
		t.Fatalf("applied %v, want 5 on", res.Applied)
	}
	evs, err := s.Events(ctx, old.RunID)
	if err != nil || len(evs) != len(old.Events) {
		t.Fatalf("events after the migration: %d (err %v), want %d", len(evs), err, len(old.Events))
	}
	for i, e := range evs {
		if e.ID != old.Events[i].Event.ID() {
			t.Fatalf("event %d is %s, want %s: the recorded order is kept", i, e.ID, old.Events[i].Event.ID())
		}
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM parked_events WHERE event_id = 'p-1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("parked events after the migration: %d (err %v)", n, err)
	}

	fx := storetest.CompletedRun(t, "run-new", "weather", storetest.TenantB, storetest.Base)
	for i := range fx.Events {
		fx.Events[i].Event.SetID(old.Events[i].Event.ID())
	}
	if err := s.Write(ctx, fx.Records(t)...); err != nil {
		t.Fatal(err)
	}
	storetest.CheckRun(t, s, fx)
	if evs, err := s.Events(ctx, fx.RunID); err != nil || len(evs) != len(fx.Events) || evs[0].Seq <= int64(len(old.Events)) {
		t.Fatalf("the new run's events: %d (err %v), want %d after the old ones", len(evs), err, len(fx.Events))
	}
}

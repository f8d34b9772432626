package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/postgres"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// newPostgres returns a migrated store in a fresh schema, and its pool.
func newPostgres(t *testing.T) (*postgres.Store, *pgxpool.Pool) {
	t.Helper()
	dsn := pgtest.Schema(t)
	pool, err := postgres.NewPool(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := postgres.Migrate(testCtx(t), pool, quietLog()); err != nil {
		t.Fatal(err)
	}
	return postgres.New(pool), pool
}

func TestPostgresStoreContract(t *testing.T) {
	storetest.RunStoreContract(t, func(t *testing.T) store.Store {
		s, _ := newPostgres(t)
		return s
	})
}

func TestMigrationsTwiceAreANoop(t *testing.T) {
	dsn := pgtest.Schema(t)
	pool, err := postgres.NewPool(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	first, err := postgres.Migrate(testCtx(t), pool, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Applied) == 0 || first.Version != first.Applied[len(first.Applied)-1] {
		t.Fatalf("first migration = %+v; want every version applied", first)
	}
	second, err := postgres.Migrate(testCtx(t), pool, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Applied) != 0 || second.Version != first.Version {
		t.Fatalf("second migration = %+v; want nothing applied, version %d", second, first.Version)
	}
	// The tables are in the test's schema and nowhere else.
	var schema string
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT current_schema(), count(*) FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_name IN ('events', 'runs', 'tool_calls', 'model_turns', 'verdicts', 'goose_db_version')`).
		Scan(&schema, &n); err != nil {
		t.Fatal(err)
	}
	if n != 6 {
		t.Fatalf("schema %s holds %d of the 6 tables", schema, n)
	}
}

// TestMigrationsConcurrently starts several migrations of one schema at once:
// the advisory lock lets one apply and the others find nothing to do.
func TestMigrationsConcurrently(t *testing.T) {
	dsn := pgtest.Schema(t)
	pool, err := postgres.NewPool(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const n = 4
	results := make(chan store.MigrationResult, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			res, err := postgres.Migrate(testCtx(t), pool, quietLog())
			results <- res
			errs <- err
		}()
	}
	applied := 0
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if res := <-results; len(res.Applied) > 0 {
			applied++
		}
	}
	if applied != 1 {
		t.Fatalf("%d migrations applied versions; want exactly 1", applied)
	}
}

// TestPostgresRefusesNULAtomically: a text column cannot hold a NUL byte (here
// a run's reason; the document holding it as \u0000 is json, which can). Such
// a record fails as ErrUnstorable (dead-lettered, not retried), and the batch
// holding it leaves nothing behind.
func TestPostgresRefusesNULAtomically(t *testing.T) {
	s, pool := newPostgres(t)
	fx := storetest.StartedRun(t, "run-nul", "weather", storetest.TenantA, storetest.Base)
	o, err := events.Build(events.TypeRunStarted, "run-nul/started", fx.Events[1].Subject,
		events.Attrs{Source: storetest.Source, RunID: "run-nul", Time: storetest.Base},
		map[string]any{"run_id": "run-nul", "status": "started", "tenant": map[string]any{"org_id": "org-a"},
			"reason": "nul \u0000 here"})
	if err != nil {
		t.Fatal(err)
	}
	recs := storetest.Records(t, fx.Events[0], o)
	err = s.Write(testCtx(t), recs...)
	if !errors.Is(err, store.ErrUnstorable) {
		t.Fatalf("Write = %v; want ErrUnstorable", err)
	}
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM runs)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a failed batch left %d rows", n)
	}
}

// TestPostgresRefusesNULHoweverBatched: a NUL byte in a value the batch's
// merge drops (here the reason of a status that loses to a later one of
// the same rank) is refused as it would be written alone: json holds the
// event's data with its \u0000, but the record is unstorable either way.
func TestPostgresRefusesNULHoweverBatched(t *testing.T) {
	s, pool := newPostgres(t)
	fx := storetest.StartedRun(t, "run-nul2", "weather", storetest.TenantA, storetest.Base)
	status := func(id string, at time.Time, reason string) events.Outgoing {
		t.Helper()
		o, err := events.Build(events.TypeRunStarted, id, fx.Events[1].Subject,
			events.Attrs{Source: storetest.Source, RunID: "run-nul2", Time: at},
			map[string]any{"run_id": "run-nul2", "status": "started", "tenant": map[string]any{"org_id": "org-a"},
				"reason": reason})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	recs := storetest.Records(t, fx.Events[0], status("run-nul2/started-a", storetest.Base, "later, so it wins"),
		status("run-nul2/started-b", storetest.Base.Add(-time.Second), "nul \u0000 here"))
	for name, batch := range map[string][]store.Record{"batch": recs, "alone": recs[2:]} {
		err := s.Write(testCtx(t), batch...)
		if !errors.Is(err, store.ErrUnstorable) || !strings.Contains(err.Error(), "run-nul2/started-b") ||
			!strings.Contains(err.Error(), "reason holds a NUL byte") {
			t.Fatalf("%s: Write = %v; want ErrUnstorable naming run-nul2/started-b and its reason", name, err)
		}
	}
	var n int
	if err := pool.QueryRow(testCtx(t), `SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM runs)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a refused batch left %d rows", n)
	}
	// The rest of the batch is storable, and so is \u0000 in a document:
	// json keeps the data as sent.
	if err := s.Write(testCtx(t), recs[:2]...); err != nil {
		t.Fatal(err)
	}
	doc := []byte(`{ "text" : "nul \u0000 here",  "b":1, "a":2 }`)
	ev := recs[1]
	ev.Event.ID, ev.Event.Data, ev.Run = "run-nul2/doc", doc, nil
	if err := s.Write(testCtx(t), ev); err != nil {
		t.Fatal(err)
	}
	stored, err := s.Events(testCtx(t), "run-nul2")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(stored, func(e store.EventRow) bool { return e.ID == "run-nul2/doc" })
	if i < 0 {
		t.Fatalf("run-nul2/doc not stored: %v", stored)
	}
	if !bytes.Equal(stored[i].Data, doc) {
		t.Fatalf("stored data %q; want the bytes as sent, %q", stored[i].Data, doc)
	}
}

func TestNewPoolHidesThePassword(t *testing.T) {
	_, err := postgres.NewPool("postgres://u:s3cret@host:notaport/db")
	if err == nil {
		t.Fatal("NewPool accepted a bad URL")
	}
	if got := err.Error(); strings.Contains(got, "s3cret") {
		t.Fatalf("error shows the password: %s", got)
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func quietLog() *slog.Logger {
	return slog.New(slog.DiscardHandler)
}

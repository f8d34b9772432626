package recorder

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// The schema is versioned with goose: numbered SQL files, embedded in the
// binary so that a recorder migrates its own database at start with nothing
// to ship beside it. goose runs on database/sql, which pgx serves through its
// stdlib driver on the very pool the store uses (so the same search_path), and
// it has a SQLite dialect for the `toolwire dev` store to come. Every change
// of schema is a new file; a file once released is never edited.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the embedded migration files.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded tree always has the directory
	}
	return sub
}

// MigrationResult says what Migrate did.
type MigrationResult struct {
	// Applied lists the versions applied by this call; empty when the schema
	// was already up to date.
	Applied []int64
	// Version is the schema version after the call.
	Version int64
}

// Migrate brings the schema of pool's search_path up to date. It is safe to
// call from several replicas at once: a Postgres advisory lock, keyed by the
// schema, lets one migrate while the others wait; recorders in different
// schemas of one database (tests, for one) do not wait on each other.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (MigrationResult, error) {
	if log == nil {
		log = slog.Default()
	}
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return MigrationResult{}, fmt.Errorf("migrate: current schema: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte("toolwire-recorder\x00" + schema))
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(h.Sum64()>>1)), // >>1: a positive bigint
		lock.WithLockTimeout(1, 300),         // up to 5 minutes behind another replica
	)
	if err != nil {
		return MigrationResult{}, fmt.Errorf("migrate: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }() // closes the database/sql handle, not the pool
	p, err := goose.NewProvider(goose.DialectPostgres, db, Migrations(),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(log.With("component", "migrate")),
	)
	if err != nil {
		return MigrationResult{}, fmt.Errorf("migrate: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return MigrationResult{}, fmt.Errorf("migrate schema %q: %w", schema, err)
	}
	var res MigrationResult
	for _, r := range results {
		res.Applied = append(res.Applied, r.Source.Version)
	}
	if res.Version, err = p.GetDBVersion(ctx); err != nil {
		return MigrationResult{}, fmt.Errorf("migrate: version: %w", err)
	}
	return res, nil
}

//go:embed migrations/sqlite/*.sql
var sqliteMigrationFiles embed.FS

// SQLiteMigrations returns the embedded migration files of the SQLite store.
func SQLiteMigrations() fs.FS {
	sub, err := fs.Sub(sqliteMigrationFiles, "migrations/sqlite")
	if err != nil {
		panic(err) // the embedded tree always has the directory
	}
	return sub
}

// MigrateSQLite brings the schema of a SQLite store up to date. One process
// owns a SQLite store, so no lock is taken.
func MigrateSQLite(ctx context.Context, s *SQLiteStore, log *slog.Logger) (MigrationResult, error) {
	if log == nil {
		log = slog.Default()
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, s.DB(), SQLiteMigrations(),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(log.With("component", "migrate")),
	)
	if err != nil {
		return MigrationResult{}, fmt.Errorf("migrate: %w", err)
	}
	results, err := p.Up(ctx)
	if err != nil {
		return MigrationResult{}, fmt.Errorf("migrate sqlite %s: %w", s.Path(), err)
	}
	var res MigrationResult
	for _, r := range results {
		res.Applied = append(res.Applied, r.Source.Version)
	}
	if res.Version, err = p.GetDBVersion(ctx); err != nil {
		return MigrationResult{}, fmt.Errorf("migrate: version: %w", err)
	}
	return res, nil
}

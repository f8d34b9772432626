package postgres

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// The schema is versioned with goose: numbered SQL files, embedded in the
// binary so that a recorder migrates its own database at start with nothing
// to ship beside it. goose runs on database/sql, which pgx serves through its
// stdlib driver on the very pool the store uses (so the same search_path).
// Every change of schema is a new file; a file once released is never edited.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate brings the schema of pool's search_path up to date. It is safe to
// call from several replicas at once: a Postgres advisory lock, keyed by the
// schema, lets one migrate while the others wait; recorders in different
// schemas of one database (tests, for one) do not wait on each other.
func Migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (store.MigrationResult, error) {
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return store.MigrationResult{}, fmt.Errorf("migrate: current schema: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte("toolwire-recorder\x00" + schema))
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(h.Sum64()>>1)), // >>1: a positive bigint
		lock.WithLockTimeout(1, 300),         // up to 5 minutes behind another replica
	)
	if err != nil {
		return store.MigrationResult{}, fmt.Errorf("migrate: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }() // closes the database/sql handle, not the pool
	return sqlstore.Migrate(ctx, goose.DialectPostgres, db, migrationFiles, fmt.Sprintf("schema %q", schema), log,
		goose.WithSessionLocker(locker))
}

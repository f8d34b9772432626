package sqlite

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/internal/sqlstore"
)

// The schema of the SQLite store, versioned with goose like the Postgres one
// (store/postgres): numbered SQL files embedded in the binary; a file once
// released is never edited.
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

// Migrate creates the database file (and its folder, see Prepare) when
// missing and brings its schema up to date. One process owns a SQLite store, so no lock is taken.
func Migrate(ctx context.Context, s *Store, log *slog.Logger) (store.MigrationResult, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := s.Prepare(); err != nil {
		return store.MigrationResult{}, err
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, s.db, Migrations(),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(log.With("component", "migrate")),
	)
	if err != nil {
		return store.MigrationResult{}, fmt.Errorf("migrate: %w", err)
	}
	return sqlstore.Up(ctx, p, "sqlite "+s.path)
}

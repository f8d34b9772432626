package sqlite

import (
	"context"
	"embed"
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

// Migrate creates the database file (and its folder, see Prepare) when
// missing and brings its schema up to date. One process owns a SQLite store,
// so no lock is taken.
func Migrate(ctx context.Context, s *Store, log *slog.Logger) (store.MigrationResult, error) {
	if err := s.Prepare(); err != nil {
		return store.MigrationResult{}, err
	}
	return sqlstore.Migrate(ctx, goose.DialectSQLite3, s.db, migrationFiles, "sqlite "+s.path, log)
}

package recorder

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
)

// backend is the database a recorder writes to: the store and what the
// recorder needs around it (a ping, migrations, a close).
type backend struct {
	store   Store
	ping    func(context.Context) error
	migrate func(context.Context, *slog.Logger) (MigrationResult, error)
	close   func()
	kind    string // "postgres" or "sqlite"
	where   string // for logs: the SQLite file, or the Postgres URL without its password
}

// openBackend opens the store url names: a sqlite: URL a SQLite file, anything
// else a Postgres database. It does no I/O: the first query connects.
func openBackend(databaseURL string) (*backend, error) {
	if IsSQLiteURL(databaseURL) {
		s, err := OpenSQLite(databaseURL)
		if err != nil {
			return nil, err
		}
		return &backend{
			store: s, ping: s.Ping, kind: "sqlite", where: s.Path(),
			migrate: func(ctx context.Context, log *slog.Logger) (MigrationResult, error) {
				return MigrateSQLite(ctx, s, log)
			},
			close: func() { _ = s.Close() },
		}, nil
	}
	pool, err := NewPool(databaseURL)
	if err != nil {
		return nil, err
	}
	where := "postgres"
	if u, err := url.Parse(databaseURL); err == nil && u.Host != "" {
		where = u.Redacted()
	}
	return &backend{
		store: NewPostgresStore(pool), ping: pool.Ping, kind: "postgres", where: where,
		migrate: func(ctx context.Context, log *slog.Logger) (MigrationResult, error) { return Migrate(ctx, pool, log) },
		close:   pool.Close,
	}, nil
}

// OpenStore opens the store a DATABASE_URL names (sqlite:<path> or a
// Postgres URL) for reading, as `toolwire replay --database-url` does: it
// neither creates nor migrates anything. close releases it.
func OpenStore(databaseURL string) (store Store, closeStore func(), err error) {
	if databaseURL == "" {
		return nil, nil, ErrNoDatabase
	}
	if IsSQLiteURL(databaseURL) {
		path, err := sqlitePath(databaseURL)
		if err != nil {
			return nil, nil, err
		}
		if _, err := os.Stat(path); err != nil {
			return nil, nil, fmt.Errorf("recorder: sqlite database %s: %w", path, err)
		}
	}
	b, err := openBackend(databaseURL)
	if err != nil {
		return nil, nil, err
	}
	return b.store, b.close, nil
}

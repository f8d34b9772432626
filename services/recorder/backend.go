package recorder

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/postgres"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
)

// backend is the database a recorder writes to: the store and what the
// recorder needs around it (a ping, migrations, a close).
type backend struct {
	store store.Store
	// prepare makes what the database needs before it can answer (the
	// SQLite file's folder); nil: nothing.
	prepare func() error
	ping    func(context.Context) error
	migrate func(context.Context, *slog.Logger) (store.MigrationResult, error)
	close   func()
	kind    string // "postgres" or "sqlite"
	// writers is how many write transactions the recorder keeps in progress
	// at once (batchWriter.writers).
	writers int
	where   string // for logs: the SQLite file, or the Postgres URL without its password
}

// openBackend opens the store url names: a sqlite: URL a SQLite file, anything
// else a Postgres database. It does no I/O: the first query connects, and
// migrate creates what is missing.
func openBackend(databaseURL string) (*backend, error) {
	if sqlite.IsURL(databaseURL) {
		s, err := sqlite.Open(databaseURL)
		if err != nil {
			return nil, fmt.Errorf("recorder: %s: %w", EnvDatabaseURL, err)
		}
		return &backend{
			store: s, prepare: s.Prepare, ping: s.Ping, kind: "sqlite", where: s.Path(), writers: 1,
			migrate: func(ctx context.Context, log *slog.Logger) (store.MigrationResult, error) {
				return sqlite.Migrate(ctx, s, log)
			},
			close: func() { _ = s.Close() },
		}, nil
	}
	pool, err := postgres.NewPool(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("recorder: %s: %w", EnvDatabaseURL, err)
	}
	where := "postgres"
	if u, err := url.Parse(databaseURL); err == nil && u.Host != "" {
		where = u.Redacted()
	}
	return &backend{
		// Two transactions at once: while one waits for a round trip (a
		// batch is several: the runs' locks, the inserts, the gate's reads,
		// the effects, the commit), the other uses the CPU, so that a
		// backlog drains sooner. They are safe together as two replicas'
		// are: each locks the runs it writes, in one order
		// (TestPostgresGateAcrossConcurrentWriters). SQLite writes one
		// transaction at a time whatever its callers do.
		store: postgres.New(pool), ping: pool.Ping, kind: "postgres", where: where, writers: 2,
		migrate: func(ctx context.Context, log *slog.Logger) (store.MigrationResult, error) {
			return postgres.Migrate(ctx, pool, log)
		},
		close: pool.Close,
	}, nil
}

// OpenStore opens the store a DATABASE_URL names (sqlite:<path> or a
// Postgres URL) for reading, as `toolwire replay --database-url` does: it
// neither creates nor migrates anything. closeStore releases it.
func OpenStore(databaseURL string) (st store.Store, closeStore func(), err error) {
	if databaseURL == "" {
		return nil, nil, ErrNoDatabase
	}
	b, err := openBackend(databaseURL)
	if err != nil {
		return nil, nil, err
	}
	if b.kind == "sqlite" {
		if _, err := os.Stat(b.where); err != nil {
			b.close()
			return nil, nil, fmt.Errorf("recorder: sqlite database %s: %w", b.where, err)
		}
	}
	return b.store, b.close, nil
}

// OpenTokens opens the API tokens of the recorder's database (sqlite:<path>
// or a Postgres URL) for `toolwire tokens`: it brings the schema up to date
// first (as a starting recorder would; safe beside running recorders), so
// that tokens can be made before the recorder's first start. closeTokens
// releases it.
func OpenTokens(ctx context.Context, databaseURL string, log *slog.Logger) (tokens store.Tokens, closeTokens func(), err error) {
	if databaseURL == "" {
		return nil, nil, ErrNoDatabase
	}
	b, err := openBackend(databaseURL)
	if err != nil {
		return nil, nil, err
	}
	if b.prepare != nil {
		if err := b.prepare(); err != nil {
			b.close()
			return nil, nil, fmt.Errorf("recorder: %w", err)
		}
	}
	if _, err := b.migrate(ctx, log); err != nil {
		b.close()
		return nil, nil, fmt.Errorf("recorder: %s database %s: %w", b.kind, b.where, err)
	}
	return b.store, b.close, nil
}

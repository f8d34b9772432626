package bench

import (
	"context"
	"fmt"

	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgschema"
)

// scratchSchema creates a schema of its own for the bench's recorder in the
// Postgres at dsn and returns its name, the connection string that writes
// into it and a func that drops it. Every bench run so starts from empty tables, as the
// baseline starts from an empty stream: a database grown by earlier runs
// (millions of events, indexes larger than the server's buffers) makes each
// insert dearer and the figures incomparable, and the bench's records are of
// no use to anyone afterwards.
func scratchSchema(ctx context.Context, dsn string) (string, string, func(context.Context) error, error) {
	sc, err := pgschema.New(ctx, nil, dsn, "toolwire_bench_")
	if err != nil {
		return "", "", nil, fmt.Errorf("bench: the recorder's Postgres: %w", err)
	}
	return sc.Name, sc.DSN, func(ctx context.Context) error {
		if err := sc.Drop(ctx); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		return nil
	}, nil
}

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// scratchSchema creates a schema of its own for the bench's recorder in the
// Postgres at dsn and returns the connection string that writes into it and
// a func that drops it. Every bench run so starts from empty tables, as the
// baseline starts from an empty stream: a database grown by earlier runs
// (millions of events, indexes larger than the server's buffers) makes each
// insert dearer and the figures incomparable, and the bench's records are of
// no use to anyone afterwards.
func scratchSchema(ctx context.Context, dsn string) (string, func(context.Context) error, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", nil, fmt.Errorf("bench: connect to the recorder's Postgres: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "toolwire_bench_" + strconv.FormatInt(time.Now().Unix(), 10) + "_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("bench: create schema %s: %w", name, err)
	}
	drop := func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("bench: drop schema %s: %w", name, err)
		}
		defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
		if _, err := c.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("bench: drop schema %s: %w", name, err)
		}
		return nil
	}
	withPath, err := withSearchPath(dsn, name)
	if err != nil {
		_ = drop(ctx)
		return "", nil, err
	}
	return withPath, drop, nil
}

// withSearchPath sets search_path in a Postgres URL or key=value string.
func withSearchPath(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("bench: database url: %w", err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return strings.TrimSpace(dsn) + " search_path=" + schema, nil
}

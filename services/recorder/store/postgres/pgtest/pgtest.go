// Package pgtest gives tests a real Postgres: each test its own fresh schema in
// the database at TOOLWIRE_TEST_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), dropped when
// the test ends. Tests of any module may import it.
//
// When Postgres cannot be reached the test fails, with a message saying how to
// start it; outside CI (CI=true), TOOLWIRE_SKIP_POSTGRES=1 skips instead.
package pgtest

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgschema"
)

// Environment variables read by Schema.
const (
	EnvURL  = "TOOLWIRE_TEST_DATABASE_URL"
	EnvSkip = "TOOLWIRE_SKIP_POSTGRES"
	EnvCI   = "CI"
)

// DefaultURL is the database used when EnvURL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// SchemaPrefix starts the name of every schema Schema creates.
const SchemaPrefix = "toolwire_test_"

// staleAfter is the age past which a test schema left behind by a killed test
// process is dropped by the next Schema call.
const staleAfter = 6 * time.Hour

// URL returns the test database's connection string.
func URL() string {
	if v := os.Getenv(EnvURL); v != "" {
		return v
	}
	return DefaultURL
}

// Schema creates a schema for t and returns a connection string whose
// connections use it (its search_path is the schema alone), so that whatever
// the test creates, migrations included, lands there. The schema is dropped,
// with everything in it, by t.Cleanup; register cleanups that close pools on
// it after calling Schema, so that they run first.
func Schema(t testing.TB) string {
	t.Helper()
	base := URL()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		unreachable(t, base, err)
		return ""
	}
	defer func() { _ = conn.Close(context.Background()) }()

	dropStale(ctx, t, conn)
	sc, err := pgschema.New(ctx, conn, base, SchemaPrefix)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sc.Drop(ctx); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return sc.DSN
}

// dropStale drops the test schemas that killed test processes left behind.
func dropStale(ctx context.Context, t testing.TB, conn *pgx.Conn) {
	rows, err := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, SchemaPrefix)
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, n := range names {
		if at, ok := pgschema.Created(n, SchemaPrefix); !ok || time.Since(at) < staleAfter {
			continue
		}
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{n}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("pgtest: drop stale schema %s: %v", n, err)
		}
	}
}

func unreachable(t testing.TB, dsn string, err error) {
	t.Helper()
	where := redact(dsn)
	if os.Getenv(EnvCI) == "true" {
		t.Fatalf("pgtest: Postgres at %s is unreachable: %v\nCI runs these tests against a real Postgres: start it before the tests, or point %s at one", where, err, EnvURL)
	}
	if os.Getenv(EnvSkip) == "1" {
		t.Skipf("pgtest: Postgres at %s is unreachable (%v); skipped because %s=1", where, err, EnvSkip)
	}
	t.Fatalf("pgtest: Postgres at %s is unreachable: %v\nstart one (user postgres, trust auth), point %s at one, or set %s=1 to skip these tests", where, err, EnvURL, EnvSkip)
}

// redact hides a URL's password.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		if strings.Contains(dsn, "password") {
			return "(connection string with a password)"
		}
		return dsn
	}
	return u.Redacted()
}

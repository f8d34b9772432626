package pgschema_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgschema"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
)

// A scratch schema holds what is created through its DSN, and Drop leaves
// nothing of it.
func TestScratchSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := pgtest.Schema(t) // a reachable Postgres, or the test fails in CI
	sc, err := pgschema.New(ctx, nil, base, "toolwire_pgschema_test_")
	require.NoError(t, err)
	at, ok := pgschema.Created(sc.Name, "toolwire_pgschema_test_")
	require.True(t, ok)
	require.WithinDuration(t, time.Now(), at, time.Minute)

	c, err := pgx.Connect(ctx, sc.DSN)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `CREATE TABLE t (x int)`)
	require.NoError(t, err)
	var schema string
	require.NoError(t, c.QueryRow(ctx, `SELECT table_schema FROM information_schema.tables WHERE table_name = 't'`).Scan(&schema))
	require.Equal(t, sc.Name, schema)
	require.NoError(t, c.Close(ctx))

	require.NoError(t, sc.Drop(ctx))
	c, err = pgx.Connect(ctx, base)
	require.NoError(t, err)
	defer func() { _ = c.Close(context.Background()) }()
	var n int
	require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, sc.Name).Scan(&n))
	require.Zero(t, n)
	require.NoError(t, sc.Drop(ctx), "dropping twice is harmless")
}

func TestCreated(t *testing.T) {
	for name, ok := range map[string]bool{
		"p_1700000000_abcdef": true, "p_1700000000": false, "q_1700000000_ab": false, "p_x_ab": false,
	} {
		_, got := pgschema.Created(name, "p_")
		require.Equal(t, ok, got, name)
	}
}

func TestWithSearchPath(t *testing.T) {
	got, err := pgschema.WithSearchPath("postgres://u:secret@h:5432/db?sslmode=disable", "s1")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:secret@h:5432/db?search_path=s1&sslmode=disable", got)
	got, err = pgschema.WithSearchPath(" host=h dbname=db ", "s1")
	require.NoError(t, err)
	require.Equal(t, "host=h dbname=db search_path=s1", got)
	_, err = pgschema.WithSearchPath("postgres://u:secret@h:bad/db", "s1")
	require.Error(t, err)
	require.False(t, strings.Contains(err.Error(), "secret"), "the error must not repeat the password: %v", err)
}

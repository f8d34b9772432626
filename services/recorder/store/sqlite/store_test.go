package sqlite_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/services/recorder/store"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite/sqlitetest"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newSQLite returns a migrated SQLite store in a fresh file.
func newSQLite(t *testing.T) *sqlite.Store {
	t.Helper()
	return sqlitetest.Store(t)
}

func TestSQLiteStoreContract(t *testing.T) {
	storetest.RunStoreContract(t, func(t *testing.T) store.Store { return newSQLite(t) })
}

func TestSQLiteURLs(t *testing.T) {
	for _, bad := range []string{"sqlite:", "sqlite://", "sqlite::memory:", "sqlite:/tmp/a.db?mode=ro", "sqlite:/tmp/a#b"} {
		if _, err := sqlite.Open(bad); err == nil {
			t.Errorf("Open(%q) accepted", bad)
		}
	}
	for url, want := range map[string]bool{"sqlite:x.db": true, "sqlite:///var/x.db": true, "postgres://h/db": false, "host=h": false} {
		if sqlite.IsURL(url) != want {
			t.Errorf("IsURL(%q) = %t", url, !want)
		}
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

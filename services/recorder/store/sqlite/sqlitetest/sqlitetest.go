// Package sqlitetest gives tests a migrated SQLite store in a fresh file of
// the test's temporary folder, closed when the test ends: the SQLite
// counterpart of pgtest. Tests of any module may import it.
package sqlitetest

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
)

// Store opens a SQLite store in a file of a folder not created yet, migrates
// it and closes it when t ends.
func Store(t testing.TB) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(sqlite.URL(filepath.Join(t.TempDir(), "data", "recorder.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := sqlite.Migrate(t.Context(), s, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return s
}

package recorder_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/storetest"
)

// newSQLite returns a migrated SQLite store in a fresh file.
func newSQLite(t *testing.T) *recorder.SQLiteStore {
	t.Helper()
	s, err := recorder.OpenSQLite(recorder.SQLiteURL(filepath.Join(t.TempDir(), "data", "recorder.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := recorder.MigrateSQLite(testCtx(t), s, quietLog()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSQLiteStoreContract(t *testing.T) {
	storetest.RunStoreContract(t, func(t *testing.T) recorder.Store { return newSQLite(t) })
}

// TestRecorderOnSQLite runs the recorder binary's way (service.Run, configured
// by environment) on a SQLite file: it migrates, records a run and serves it.
func TestRecorderOnSQLite(t *testing.T) {
	env := eventstest.Start(t)
	addr := freeAddr(t)
	path := filepath.Join(t.TempDir(), "nested", "recorder.db")
	vars := map[string]string{
		service.EnvNATSURL: env.URL, service.EnvHTTPAddr: addr, service.EnvLogLevel: "error",
		service.EnvOTelExporter: "none", recorder.EnvDatabaseURL: recorder.SQLiteURL(path),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, "recorder", ":8080", func(k string) string { return vars[k] }, recorder.Build)
	}()
	fx := storetest.CompletedRun(t, "sqlite-run", "weather", storetest.TenantA, time.Now())
	pub := events.NewPublisher(env.JS)
	for _, o := range fx.Events {
		if err := pub.Publish(testCtx(t), o); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the run to be recorded in SQLite", func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/v1/runs/sqlite-run/envelopes")
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		var envs recorder.EnvelopesJSON
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&envs) != nil {
			return false, resp.Status
		}
		return len(envs.Envelopes) == 2, fmt.Sprintf("%d envelopes", len(envs.Envelopes))
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("service.Run: %v", err)
	}
	// The file holds the run after the recorder has gone.
	s, err := recorder.OpenSQLite(recorder.SQLiteURL(path))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	storetest.CheckRun(t, s, fx)
}

func TestSQLiteURLs(t *testing.T) {
	for _, bad := range []string{"sqlite:", "sqlite://", "sqlite::memory:", "sqlite:/tmp/a.db?mode=ro", "sqlite:/tmp/a#b"} {
		if _, err := recorder.OpenSQLite(bad); err == nil {
			t.Errorf("OpenSQLite(%q) accepted", bad)
		}
	}
	if _, _, err := recorder.OpenStore(recorder.SQLiteURL(filepath.Join(t.TempDir(), "missing.db"))); err == nil {
		t.Error("OpenStore of a missing SQLite file: no error")
	}
	if _, _, err := recorder.OpenStore(""); err == nil {
		t.Error("OpenStore without a URL: no error")
	}
	for url, want := range map[string]bool{"sqlite:x.db": true, "sqlite:///var/x.db": true, "postgres://h/db": false, "host=h": false} {
		if recorder.IsSQLiteURL(url) != want {
			t.Errorf("IsSQLiteURL(%q) = %t", url, !want)
		}
	}
}

package recorder_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestRecorderOnSQLite runs the recorder binary's way (service.Run, configured
// by environment) on a SQLite file: it migrates, records a run and serves it.
func TestRecorderOnSQLite(t *testing.T) {
	env := eventstest.Start(t)
	addr := servicetest.FreeAddr(t)
	path := filepath.Join(t.TempDir(), "nested", "recorder.db")
	vars := map[string]string{
		service.EnvNATSURL: env.URL, service.EnvHTTPAddr: addr, service.EnvLogLevel: "error",
		service.EnvOTelExporter: "none", recorder.EnvDatabaseURL: sqlite.URL(path),
	}
	stop := runRecorder(t, vars)
	fx := storetest.CompletedRun(t, "sqlite-run", "weather", storetest.TenantA, time.Now())
	publish(t, env.JS, fx.Events...)
	eventually(t, "the run to be recorded in SQLite", func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/v1/runs/sqlite-run/envelopes")
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		var envs apitypes.EnvelopesJSON
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&envs) != nil {
			return false, resp.Status
		}
		return len(envs.Envelopes) == 2, fmt.Sprintf("%d envelopes", len(envs.Envelopes))
	})
	stop()
	// The file holds the run after the recorder has gone.
	s, err := sqlite.Open(sqlite.URL(path))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	storetest.CheckRun(t, s, fx)
}

// TestOpenStore: `toolwire replay --database-url` reads an existing
// database; it neither creates one nor runs without a URL.
func TestOpenStore(t *testing.T) {
	if _, _, err := recorder.OpenStore(sqlite.URL(filepath.Join(t.TempDir(), "missing.db"))); err == nil {
		t.Error("OpenStore of a missing SQLite file: no error")
	}
	if _, _, err := recorder.OpenStore(""); err == nil {
		t.Error("OpenStore without a URL: no error")
	}
}

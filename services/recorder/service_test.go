package recorder_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/apiclient"
	"github.com/toolwire/toolwire/services/recorder/apitypes"
	"github.com/toolwire/toolwire/services/recorder/store/postgres/pgtest"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
	"github.com/toolwire/toolwire/services/recorder/store/storetest"
)

// TestServiceRun runs the recorder as its binary does (service.Run with
// Build, configured by environment): it gets ready, records a run, serves it
// beside the probes, and shuts down cleanly.
func TestServiceRun(t *testing.T) {
	env := eventstest.Start(t)
	dsn := pgtest.Schema(t)
	addr := servicetest.FreeAddr(t)
	stop := runRecorder(t, binaryEnv(env.URL, addr, map[string]string{recorder.EnvDatabaseURL: dsn, recorder.EnvBatch: "8"}))

	base := "http://" + addr
	eventually(t, "the recorder to be ready", func() (bool, string) {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})

	fx := storetest.StartedRun(t, "svc-run", "weather", storetest.TenantA, time.Now())
	publishEvents(t, env.JS, fx.Events...)
	eventually(t, "the run to be recorded", func() (bool, string) {
		resp, err := http.Get(base + "/v1/runs/svc-run")
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		var run apitypes.RunDetailJSON
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&run) != nil {
			return false, resp.Status
		}
		return run.Status == events.StatusStarted && run.Agent == "weather", run.Status
	})

	stop()
}

func TestServiceRunWithoutDatabase(t *testing.T) {
	env := eventstest.Start(t)
	err := runBinary(testCtx(t), binaryEnv(env.URL, servicetest.FreeAddr(t), nil))
	if !errors.Is(err, recorder.ErrNoDatabase) || !strings.Contains(err.Error(), "DATABASE_URL is required") {
		t.Fatalf("service.Run without DATABASE_URL = %v", err)
	}
}

// TestServiceRunWithADatabaseThatNeverAnswers: a database nothing answers at
// fails the start within TOOLWIRE_RECORDER_DATABASE_WAIT, with what to check,
// instead of a recorder waiting forever. The proxy accepts connections and
// then says nothing: the worst case, a host that drops packets.
func TestServiceRunWithADatabaseThatNeverAnswers(t *testing.T) {
	env := eventstest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	for _, dsn := range []string{
		"postgres://toolwire:secret@" + ln.Addr().String() + "/toolwire?sslmode=disable&connect_timeout=1", // silent
		"postgres://toolwire:secret@" + servicetest.FreeAddr(t) + "/toolwire?sslmode=disable",              // refused
	} {
		err := runBinary(testCtx(t), binaryEnv(env.URL, servicetest.FreeAddr(t),
			map[string]string{recorder.EnvDatabaseURL: dsn, recorder.EnvDatabaseWait: "2s"}))
		var unreachable *recorder.DatabaseUnreachableError
		if !errors.As(err, &unreachable) || unreachable.Waited != 2*time.Second {
			t.Fatalf("service.Run with %s = %v; want a DatabaseUnreachableError after 2s", dsn, err)
		}
		for _, want := range []string{"did not answer within 2s", "DATABASE_URL", "TOOLWIRE_RECORDER_DATABASE_WAIT", "postgres"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error %q shows the password", err)
		}
	}
}

// TestRecorderOnSQLite runs the recorder binary's way (service.Run, configured
// by environment) on a SQLite file: it migrates, records a run and serves it.
func TestRecorderOnSQLite(t *testing.T) {
	env := eventstest.Start(t)
	addr := servicetest.FreeAddr(t)
	path := filepath.Join(t.TempDir(), "nested", "recorder.db")
	stop := runRecorder(t, binaryEnv(env.URL, addr, map[string]string{recorder.EnvDatabaseURL: sqlite.URL(path)}))
	fx := storetest.CompletedRun(t, "sqlite-run", "weather", storetest.TenantA, time.Now())
	publishEvents(t, env.JS, fx.Events...)
	// The run and its calls are recorded by separate consumers: wait for
	// both (settled), not only for the envelopes.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	run, err := apiclient.WaitSettled(ctx, "http://"+addr, "sqlite-run", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.ToolCalls) != 2 || run.Status != events.StatusCompleted {
		t.Fatalf("settled run: status %s, %d calls", run.Status, len(run.ToolCalls))
	}
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

package recorder_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/store/sqlite"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestConfigFromEnv(t *testing.T) {
	// DATABASE_URL is required, but by New: an option may still fill it in.
	c, err := recorder.ConfigFromEnv(env(nil))
	if err != nil || c.DatabaseURL != "" {
		t.Fatalf("without DATABASE_URL: %+v %v", c, err)
	}
	if err := c.Validate(); !errors.Is(err, recorder.ErrNoDatabase) || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("Validate without DATABASE_URL: %v", err)
	}
	if _, err := recorder.Build(service.Deps{Getenv: env(nil)}); !errors.Is(err, recorder.ErrNoDatabase) {
		t.Fatalf("Build without DATABASE_URL: %v", err)
	}
	c, err = recorder.ConfigFromEnv(env(map[string]string{"DATABASE_URL": "postgres://x@h/db"}))
	if err != nil || c.Batch != recorder.DefaultBatch || c.DatabaseURL != "postgres://x@h/db" {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = recorder.ConfigFromEnv(env(map[string]string{"DATABASE_URL": "postgres://x@h/db", "TOOLWIRE_RECORDER_BATCH": "32"}))
	if err != nil || c.Batch != 32 {
		t.Fatalf("batch 32: %+v %v", c, err)
	}
	for _, bad := range []string{"0", "-1", "many", "100000"} {
		_, err := recorder.ConfigFromEnv(env(map[string]string{"DATABASE_URL": "postgres://x@h/db", "TOOLWIRE_RECORDER_BATCH": bad}))
		if err == nil || !strings.Contains(err.Error(), "TOOLWIRE_RECORDER_BATCH") {
			t.Errorf("batch %q: %v", bad, err)
		}
	}
	if c.Poll != recorder.DefaultPoll {
		t.Errorf("default poll: %s", c.Poll)
	}
	for v, want := range map[string]time.Duration{"50ms": 50 * time.Millisecond, "0": -1} {
		c, err := recorder.ConfigFromEnv(env(map[string]string{"DATABASE_URL": "postgres://x@h/db", "TOOLWIRE_RECORDER_POLL": v}))
		if err != nil || c.Poll != want {
			t.Errorf("poll %q: %+v %v", v, c, err)
		}
	}
	for _, bad := range []string{"-5ms", "soon", "1h"} {
		_, err := recorder.ConfigFromEnv(env(map[string]string{"DATABASE_URL": "postgres://x@h/db", "TOOLWIRE_RECORDER_POLL": bad}))
		if err == nil || !strings.Contains(err.Error(), "TOOLWIRE_RECORDER_POLL") {
			t.Errorf("poll %q: %v", bad, err)
		}
	}
	// Every bad value is reported at once.
	_, err = recorder.ConfigFromEnv(env(map[string]string{"TOOLWIRE_RECORDER_BATCH": "many", "TOOLWIRE_RECORDER_POLL": "soon"}))
	if err == nil || !strings.Contains(err.Error(), "TOOLWIRE_RECORDER_BATCH") || !strings.Contains(err.Error(), "TOOLWIRE_RECORDER_POLL") {
		t.Errorf("two bad values: %v", err)
	}
	c, err = recorder.ConfigFromEnv(env(map[string]string{"TOOLWIRE_ADMIN_TOKEN": "  s3cret "}))
	if err != nil || c.AdminToken != "s3cret" {
		t.Errorf("admin token: %q %v", c.AdminToken, err)
	}
	if got := recorder.EnvVars(); len(got) != 5 {
		t.Errorf("EnvVars = %v", got)
	}
}

// Every documented variable is read, and its example takes effect.
func TestEnvVarsTakeEffect(t *testing.T) {
	servicetest.VarsTakeEffect(t, recorder.EnvVars(), recorder.ConfigFromEnv)
}

// Build reads the environment, then applies its options (stack sets the
// database of `toolwire dev` with one); the recorder runs with the result.
func TestBuildAppliesOptionsAfterTheEnvironment(t *testing.T) {
	e := eventstest.Start(t)
	dbURL := sqlite.URL(filepath.Join(t.TempDir(), "recorder.db"))
	rec, err := recorder.Build(service.Deps{JS: e.JS, Getenv: env(map[string]string{
		recorder.EnvDatabaseURL: "postgres://nobody@127.0.0.1:1/none", recorder.EnvBatch: "32", recorder.EnvAdminToken: "tok",
	})}, func(c *recorder.Config) { c.DatabaseURL = dbURL })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer func() {
		if err := rec.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	want := recorder.Config{DatabaseURL: dbURL, Batch: 32, Poll: recorder.DefaultPoll, AdminToken: "tok",
		DatabaseWait: recorder.DefaultDatabaseWait}
	if got := rec.Config(); got != want {
		t.Fatalf("Config() = %+v, want %+v", got, want)
	}
}

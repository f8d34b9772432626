package recorder_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/recorder"
	"github.com/toolwire/toolwire/services/recorder/auth"
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
	if c.AckWait != recorder.DefaultAckWait {
		t.Errorf("default ack wait: %s", c.AckWait)
	}
	if c, err := recorder.ConfigFromEnv(env(map[string]string{"TOOLWIRE_RECORDER_ACK_WAIT": "12s"})); err != nil || c.AckWait != 12*time.Second {
		t.Errorf("ack wait 12s: %+v %v", c, err)
	}
	for _, bad := range []string{"500ms", "0", "-1s", "soon", "1h"} {
		_, err := recorder.ConfigFromEnv(env(map[string]string{"TOOLWIRE_RECORDER_ACK_WAIT": bad}))
		if err == nil || !strings.Contains(err.Error(), "TOOLWIRE_RECORDER_ACK_WAIT") {
			t.Errorf("ack wait %q: %v", bad, err)
		}
	}
	for _, bad := range []time.Duration{time.Millisecond, time.Hour} {
		if err := (recorder.Config{DatabaseURL: "sqlite:x.db", AckWait: bad}).Validate(); err == nil ||
			!strings.Contains(err.Error(), "TOOLWIRE_RECORDER_ACK_WAIT") {
			t.Errorf("Validate with ack wait %s: %v", bad, err)
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
	c, err = recorder.ConfigFromEnv(env(map[string]string{"TOOLWIRE_AUTH": "on", "TOOLWIRE_INSECURE_NO_AUTH": "1",
		"TOOLWIRE_OIDC_ISSUER": "https://id.example", "TOOLWIRE_OIDC_AUDIENCE": "tw"}))
	if err != nil || !c.AuthRequired || !c.InsecureNoAuth || c.OIDC.Issuer != "https://id.example" || c.OIDC.Audience != "tw" {
		t.Errorf("auth settings: %+v %v", c, err)
	}
	c, err = recorder.ConfigFromEnv(env(map[string]string{"TOOLWIRE_INSECURE_COOKIE": "1"}))
	if err != nil || !c.InsecureCookie {
		t.Errorf("TOOLWIRE_INSECURE_COOKIE=1: %+v %v", c, err)
	}
	if c, err := recorder.ConfigFromEnv(env(nil)); err != nil || c.InsecureCookie {
		t.Errorf("the session cookie is Secure by default: %+v %v", c, err)
	}
	if _, err := recorder.ConfigFromEnv(env(map[string]string{"TOOLWIRE_AUTH": "maybe"})); err == nil || !strings.Contains(err.Error(), "TOOLWIRE_AUTH") {
		t.Errorf("TOOLWIRE_AUTH=maybe: %v", err)
	}
	// The embedding origins: full origins only.
	c, err = recorder.ConfigFromEnv(env(map[string]string{recorder.EnvCORSOrigins: "https://editor.example, http://127.0.0.1:8080/"}))
	if err != nil || !reflect.DeepEqual(c.CORSOrigins, []string{"https://editor.example", "http://127.0.0.1:8080"}) {
		t.Errorf("%s: %v %v", recorder.EnvCORSOrigins, c.CORSOrigins, err)
	}
	for _, bad := range []string{"*", "https://*.example", "editor.example", "ftp://editor.example", "https://editor.example/path", "https://u@editor.example"} {
		if _, err := recorder.ConfigFromEnv(env(map[string]string{recorder.EnvCORSOrigins: bad})); err == nil || !strings.Contains(err.Error(), recorder.EnvCORSOrigins) {
			t.Errorf("%s=%s: %v, want refused", recorder.EnvCORSOrigins, bad, err)
		}
		if err := (recorder.Config{DatabaseURL: "sqlite:x.db", CORSOrigins: []string{bad}}).Validate(); err == nil {
			t.Errorf("Validate(CORSOrigins %s) passed", bad)
		}
	}
	for _, bad := range []recorder.Config{
		{DatabaseURL: "sqlite:x.db", OIDC: auth.OIDCConfig{Issuer: "id.example", Audience: "tw"}},
		{DatabaseURL: "sqlite:x.db", OIDC: auth.OIDCConfig{Issuer: "https://id.example"}},
		{DatabaseURL: "sqlite:x.db", OIDC: auth.OIDCConfig{Audience: "tw"}},
	} {
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "TOOLWIRE_OIDC_") {
			t.Errorf("Validate(%+v) = %v, want the OIDC variables named", bad.OIDC, err)
		}
	}
	if c, err := recorder.ConfigFromEnv(env(nil)); err != nil || c.MCPStdio {
		t.Errorf("the registry page starts no stdio MCP server by default: %+v %v", c, err)
	}
	if c, err := recorder.ConfigFromEnv(env(map[string]string{recorder.EnvMCPStdio: "1"})); err != nil || !c.MCPStdio {
		t.Errorf("%s=1: %+v %v", recorder.EnvMCPStdio, c, err)
	}
	if got := recorder.EnvVars(); len(got) != 16 {
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
		DatabaseWait: recorder.DefaultDatabaseWait, AckWait: recorder.DefaultAckWait}
	if got := rec.Config(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Config() = %+v, want %+v", got, want)
	}
}

// TestCheckExposure: without authentication the recorder serves loopback
// only, unless told loudly; the refusal says how to configure it.
func TestCheckExposure(t *testing.T) {
	open := recorder.Config{}
	for _, tc := range []struct {
		addr string
		cfg  recorder.Config
		ok   bool
	}{
		{"127.0.0.1:8088", open, true},
		{"[::1]:8088", open, true},
		{"localhost:8088", open, true},
		{"127.0.0.1:0", open, true},
		{"", open, true}, // no listener of its own (stack checks its own)
		{":8080", open, false},
		{"0.0.0.0:8080", open, false},
		{"10.1.2.3:8080", open, false},
		{"[::]:8080", open, false},
		{"recorder.internal:8080", open, false},
		{":8080", recorder.Config{AuthRequired: true}, true},
		{":8080", recorder.Config{OIDC: auth.OIDCConfig{Issuer: "https://id.example", Audience: "tw"}}, true},
		{":8080", recorder.Config{InsecureNoAuth: true}, true},
		{":8080", recorder.Config{AdminToken: "only-guards-the-admin-routes"}, false},
	} {
		err := recorder.CheckExposure(tc.addr, tc.cfg)
		if tc.ok != (err == nil) {
			t.Errorf("CheckExposure(%q, %+v) = %v", tc.addr, tc.cfg, err)
			continue
		}
		if err != nil {
			if !errors.Is(err, recorder.ErrExposed) {
				t.Errorf("%q: %v is not ErrExposed", tc.addr, err)
			}
			for _, want := range []string{"TOOLWIRE_AUTH=on", "toolwire tokens create", "TOOLWIRE_INSECURE_NO_AUTH=1", "127.0.0.1"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q: the refusal does not say %q: %v", tc.addr, want, err)
				}
			}
		}
	}
	// The binary's default address, :8080, is refused at New.
	e := eventstest.Start(t)
	_, err := recorder.New(service.Deps{JS: e.JS, Common: service.Common{HTTPAddr: ":8080"}},
		recorder.Config{DatabaseURL: sqlite.URL(filepath.Join(t.TempDir(), "r.db"))})
	if !errors.Is(err, recorder.ErrExposed) {
		t.Fatalf("New on :8080 without auth: %v, want ErrExposed", err)
	}
}

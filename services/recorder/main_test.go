package recorder_test

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor/tools/mcp/mcptest"
	"github.com/toolwire/toolwire/services/recorder"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// recorder, runner, pool, writer and embedded server must be stopped.
func TestMain(m *testing.M) {
	// The registry page's test starts this binary as a stdio MCP server.
	if code, served := mcptest.ServeIfAsked(); served {
		os.Exit(code)
	}
	// nats.go v1.55.0: the object store's Put clears the publisher's status
	// channel while this goroutine waits on it, so it can wait forever (a
	// client-library race, jetstream/object.go and publish.go; not ours).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// publishEvents publishes outs on js, as the services do.
func publishEvents(t testing.TB, js jetstream.JetStream, outs ...events.Outgoing) {
	t.Helper()
	pub := publish.NewPublisher(js)
	for _, o := range outs {
		if err := pub.Publish(testCtx(t), o); err != nil {
			t.Fatal(err)
		}
	}
}

// binaryEnv is the environment a test runs the recorder's binary with: NATS
// at natsURL, serving on addr, quiet, exporting no spans; extra (the
// database, the recorder's settings) is added to it.
func binaryEnv(natsURL, addr string, extra map[string]string) map[string]string {
	vars := map[string]string{service.EnvNATSURL: natsURL, service.EnvHTTPAddr: addr,
		service.EnvLogLevel: "error", service.EnvOTelExporter: "none"}
	maps.Copy(vars, extra)
	return vars
}

// runBinary runs the recorder as its binary does until ctx ends and returns
// what service.Run returned.
func runBinary(ctx context.Context, vars map[string]string) error {
	return service.Run(ctx, "recorder", ":8080", servicetest.Getenv(vars), service.Builder(recorder.Build))
}

// runRecorder runs the recorder as its binary does (service.Run with Build)
// on the environment vars; stop cancels it and fails the test unless it
// shuts down cleanly within 30s.
func runRecorder(t *testing.T, vars map[string]string) (stop func()) {
	t.Helper()
	stopRun := servicetest.Run(t, "recorder", ":8080", vars, service.Builder(recorder.Build))
	return func() {
		t.Helper()
		if err := stopRun(); err != nil {
			t.Fatalf("service.Run: %v", err)
		}
	}
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

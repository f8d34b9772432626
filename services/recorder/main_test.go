package recorder_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// recorder, runner, pool, writer and embedded server must be stopped.
func TestMain(m *testing.M) {
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

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

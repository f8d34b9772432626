package stack_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when one leaves a goroutine behind.
func TestMain(m *testing.M) {
	// nats.go v1.55.0: the object store's Put clears the publisher's status
	// channel while this goroutine waits on it, so it can wait forever (a
	// client-library race, jetstream/object.go and publish.go; not ours: the
	// recorder, executor and events packages ignore it too).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

package executor

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/services/executor/tools/mcp/mcptest"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// executor, watch and tool the tests start must be stopped. The binary also
// serves as the stdio MCP server of mcp_test.go.
func TestMain(m *testing.M) {
	// nats.go v1.55.0: the object store's Put clears the publisher's status
	// channel while this goroutine waits on it, so it can wait forever (a
	// client-library race, jetstream/object.go and publish.go; not ours).
	mcptest.Main(m, goleak.IgnoreAnyFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

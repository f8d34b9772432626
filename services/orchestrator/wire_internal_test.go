package orchestrator

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/events"
)

func TestTraceIDOfMatchesTheEventsPackage(t *testing.T) {
	for _, tp := range []string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"", "garbage", "00-xyz-00f067aa0ba902b7-01",
	} {
		rt := events.RunTrace{TraceParent: tp}
		require.Equal(t, rt.TraceID(), traceIDOf(rt), tp)
	}
}

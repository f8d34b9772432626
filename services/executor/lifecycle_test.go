package executor

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/events/registry"
	"github.com/toolwire/toolwire/pkg/service"
	"github.com/toolwire/toolwire/pkg/service/eventstest"
)

// TestOutlivesItsStartContext: the service binary starts the executor with a
// start-up context that service.Run ends (60s after start, or here, at
// once). The registry watch, the consumer and the preview server live on:
// a registry change reaches the catalog, calls are still consumed, and
// previews are still answered.
func TestOutlivesItsStartContext(t *testing.T) {
	env := eventstest.Start(t)
	schemas, err := events.NewSchemas()
	require.NoError(t, err)
	s := startExecutor(t, env, Config{ID: "executor-life"}) // its start context has ended
	reg, err := registry.Open(t.Context(), env.JS)
	require.NoError(t, err)

	const runID = "run-life"
	w := watchRun(t, env.JS, runID)
	pub := events.NewPublisher(env.JS)
	first := callRequest(t, runID, 1, "echo", "1.0.0", `{"text":"before"}`)
	publishApproved(t, pub, first)
	e := w.envelopeOf(t, schemas, first)
	require.Nil(t, e.Error)

	// A registry change after the start: the watch delivers it to the
	// catalog, and the next call meets it.
	ref := envelope.ToolRef{Name: "echo", Version: "1.0.0"}
	require.NoError(t, reg.SetState(t.Context(), ref, registry.StateBlocked))
	require.Eventually(t, func() bool {
		entry, ok := s.catalog.Lookup(ref)
		return ok && entry.State == registry.StateBlocked
	}, waitLimit, 5*time.Millisecond, "the catalog's watch follows the registry")
	second := callRequest(t, runID, 2, "echo", "1.0.0", `{"text":"after"}`)
	publishApproved(t, pub, second)
	e = w.envelopeOf(t, schemas, second)
	require.NotNil(t, e.Error)
	require.Equal(t, envelope.CodePolicyDenied, e.Error.Code)

	// The preview server answers.
	b, err := json.Marshal(callRequest(t, runID, 3, "calculator", "1.0.0", `{"expression":"1"}`))
	require.NoError(t, err)
	resp, err := env.Connect(t).RequestWithContext(t.Context(), events.SubjectPreview, b)
	require.NoError(t, err)
	var p events.ApprovalPreview
	require.NoError(t, json.Unmarshal(resp.Data, &p))
	require.Equal(t, "preview unavailable: tool calculator@1.0.0 does not declare supports_preview", p.Unavailable)
}

// TestFailedStartReleases: a Start that fails after it started the registry
// watch and the MCP pool releases them (no goroutine is left), and the
// service is stopped.
func TestFailedStartReleases(t *testing.T) {
	env := eventstest.Start(t)
	require.NoError(t, env.JS.DeleteKeyValue(t.Context(), events.BucketOutcomes))
	d := testDeps(t, env, nil)
	s := newExecutor(t, d, Config{})
	// The connection's request multiplexer (one subscription for all its
	// requests, for its whole life) is not the executor's.
	_, err := d.JS.AccountInfo(t.Context())
	require.NoError(t, err)
	before := goleak.IgnoreCurrent()
	err = s.Start(t.Context())
	require.ErrorContains(t, err, "kv "+events.BucketOutcomes)
	goleak.VerifyNone(t, before)
	require.ErrorIs(t, s.Start(t.Context()), service.ErrStopped)
	require.NoError(t, s.Stop(t.Context()))
}

package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/web"
)

// Every expiry of a tool's time limit is TIMEOUT naming the limit, whatever
// the tool was doing when it ran out: reading a body that drips in, or
// failing in any way once its time was up.

// timeoutBound bounds how long a timed-out call may take to be answered: a
// generous safety net far above the tools' limits (300ms, 100ms), not a
// measure of how long it took.
const timeoutBound = 10 * time.Second

// newDripServer answers every request with its headers at once, then a byte
// of its body every 100ms, until the client goes away; hits counts the
// requests per path.
func newDripServer(t *testing.T, hits map[string]*atomic.Int64) string {
	t.Helper()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n := hits[r.URL.Path]; n != nil {
			n.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		_, _ = w.Write([]byte(`{"temp_c":`))
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
				if _, err := w.Write([]byte(" ")); err != nil {
					return
				}
				if err := rc.Flush(); err != nil {
					return
				}
			}
		}
	})
	return srv.URL
}

// TestSlowDripBodyIsTimeout: the web tools and an http tool whose response
// body drips in past their 300ms time limit end in TIMEOUT naming the limit,
// soon after it (before, a body read cut by the deadline panicked in package
// web, and the call ended UNKNOWN). A writes tool's TIMEOUT is its recorded
// outcome, and it ran once.
func TestSlowDripBodyIsTimeout(t *testing.T) {
	hits := map[string]*atomic.Int64{"/get": {}, "/request": {}, "/reads": {}, "/writes": {}}
	base := newDripServer(t, hits)
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	host := base[len("http://"):]
	s := startExecutor(t, env, Config{ID: "executor-drip"}, std.withWeb(web.Config{AllowHosts: []string{host}}))

	reg := openRegistry(t, env.JS)
	const version = "1.0.1-drip"
	for _, name := range []string{"http_get", "http_request"} {
		putEntry(t, reg, definitionOf(t, s, name), registry.StateActive, func(d *envelope.ToolDefinition) {
			d.Version, d.TimeoutMS = version, 300
		})
	}
	for _, side := range []envelope.SideEffects{envelope.SideEffectsReads, envelope.SideEffectsWrites} {
		d := httpDef("drip_"+string(side), side, `{"url":"`+base+`/`+string(side)+`"}`)
		d.TimeoutMS = 300
		created, err := reg.Register(t.Context(), d)
		require.NoError(t, err)
		require.True(t, created)
	}

	const runID = "run-drip"
	w := watchRun(t, env.JS, runID)
	tests := []struct {
		tool, version, input, path string
		writes                     bool
	}{
		{tool: "http_get", version: version, input: input(map[string]any{"url": base + "/get"}), path: "/get"},
		{tool: "http_request", version: version, input: input(map[string]any{"method": "POST", "url": base + "/request", "body": "x"}), path: "/request", writes: true},
		{tool: "drip_reads", version: "1.0.0", input: `{"city":"Lyon"}`, path: "/reads"},
		{tool: "drip_writes", version: "1.0.0", input: `{"city":"Lyon"}`, path: "/writes", writes: true},
	}
	reqs := make([]events.CallRequest, len(tests))
	for i, tc := range tests {
		reqs[i] = callRequest(t, runID, i+1, tc.tool, tc.version, tc.input)
	}
	publishAllApproved(t, env.JetStream(t), reqs)
	outcomes, err := env.JS.KeyValue(t.Context(), provision.BucketOutcomes)
	require.NoError(t, err)
	for i, tc := range tests {
		t.Run(tc.tool, func(t *testing.T) {
			got := w.envelopeOf(t, schemas, reqs[i])
			require.NotNil(t, got.Error)
			require.Equal(t, envelope.CodeTimeout, got.Error.Code, got.Error.Message)
			require.Equal(t, fmt.Sprintf("tool %s@%s timed out after 300ms", tc.tool, tc.version), got.Error.Message)
			require.Less(t, got.Latency(), timeoutBound, "cut at the limit, not left to drip")
			require.EqualValues(t, 1, hits[tc.path].Load(), "sent once")
			if !tc.writes {
				return
			}
			e, err := outcomes.Get(t.Context(), outcomeKey(runID, reqs[i].CallID))
			require.NoError(t, err)
			var rec outcomeRecord
			require.NoError(t, json.Unmarshal(e.Value(), &rec))
			require.Equal(t, outcomeDone, rec.State)
			require.NotNil(t, rec.Envelope.Error)
			require.Equal(t, envelope.CodeTimeout, rec.Envelope.Error.Code, "the recorded outcome is the timeout")
		})
	}
}

// TestFailureAfterTheTimeLimitIsTimeout: a tool that ignores its context for
// a while after its deadline, then fails in any way, ends in TIMEOUT naming
// its limit, not in the code of what it failed with.
func TestFailureAfterTheTimeLimitIsTimeout(t *testing.T) {
	// overdue waits for the deadline, ignores it a little, then fails with
	// fail's result.
	overdue := func(fail func(ctx context.Context) error) func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond) // busy with something that ignores ctx
			return nil, fail(ctx)
		}
	}
	tests := []struct {
		name string
		run  func(context.Context, json.RawMessage) (json.RawMessage, error)
	}{
		{name: "plain_error", run: overdue(func(context.Context) error { return errors.New("read: connection reset") })},
		{name: "wrapped_context_error", run: overdue(func(ctx context.Context) error { return fmt.Errorf("reading the body: %w", ctx.Err()) })},
		{name: "tool_error", run: overdue(func(context.Context) error {
			return envelope.NewToolError(envelope.CodeNetworkError, "the connection broke")
		})},
		{name: "panic", run: overdue(func(context.Context) error { panic("nil response") })},
		{name: "at_its_own_deadline", run: func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			// Its own clock, not ctx: a worker's tool under the deadline the
			// call carried.
			dl, ok := ctx.Deadline()
			if !ok {
				return nil, errors.New("no deadline")
			}
			time.Sleep(time.Until(dl))
			return nil, envelope.NewToolError(envelope.CodeTimeout, "ran past its timeout of 99ms")
		}},
	}
	opts := make([]Option, 0, len(tests))
	for _, tc := range tests {
		tl := newTestTool(tc.name, tc.run)
		tl.def.TimeoutMS = 100
		opts = append(opts, WithTools(tl))
	}
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	startExecutor(t, env, Config{ID: "executor-overdue", Concurrency: len(tests)}, opts...)

	const runID = "run-overdue"
	w := watchRun(t, env.JS, runID)
	reqs := make([]events.CallRequest, len(tests))
	for i, tc := range tests {
		reqs[i] = callRequest(t, runID, i+1, tc.name, "1.0.0", `{}`)
	}
	publishAllApproved(t, env.JetStream(t), reqs)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := w.envelopeOf(t, schemas, reqs[i])
			require.NotNil(t, got.Error)
			require.Equal(t, envelope.CodeTimeout, got.Error.Code, got.Error.Message)
			require.Equal(t, "tool "+tc.name+"@1.0.0 timed out after 100ms", got.Error.Message)
			require.Less(t, got.Latency(), timeoutBound)
		})
	}
}

// overduePreview previews past its 100ms time limit: it waits for its
// deadline, ignores it a little, then fails with a plain error.
type overduePreview struct{ testTool }

func (overduePreview) Preview(ctx context.Context, _ json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	<-ctx.Done()
	time.Sleep(20 * time.Millisecond) // busy with something that ignores ctx
	return nil, errors.New("read: connection reset")
}

// TestPreviewAfterTheTimeLimitTimesOut: a dry run that fails once its time
// is up says it timed out, naming the limit, as a call does.
func TestPreviewAfterTheTimeLimitTimesOut(t *testing.T) {
	tl := overduePreview{newTestTool("overdue_preview", nil)}
	tl.def.TimeoutMS, tl.def.SupportsPreview = 100, true
	env := eventstest.Start(t)
	startExecutor(t, env, Config{}, WithTools(tl))
	nc := env.Connect(t)

	b, err := json.Marshal(callRequest(t, "run-pv-overdue", 1, "overdue_preview", "1.0.0", `{}`))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), timeoutBound)
	defer cancel()
	resp, err := nc.RequestWithContext(ctx, events.SubjectPreview, b)
	require.NoError(t, err)
	var p events.ApprovalPreview
	require.NoError(t, json.Unmarshal(resp.Data, &p))
	require.Equal(t, "preview unavailable: the dry run failed: the dry run of overdue_preview@1.0.0 timed out after 100ms", p.Unavailable)
}

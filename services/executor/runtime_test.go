package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/blobs"
	"github.com/toolwire/toolwire/pkg/jetstream/provision"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/pkg/jetstream/ratebucket"
	"github.com/toolwire/toolwire/pkg/jetstream/registry"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
	"github.com/toolwire/toolwire/services/executor/tools/testtools"
)

// call publishes one approved call and returns its envelope.
func (w *watcher) call(t testing.TB, js jetstream.JetStream, schemas *envelope.Schemas, req events.CallRequest) envelope.ToolEnvelope {
	t.Helper()
	publishApproved(t, publish.NewPublisher(js), req)
	return w.envelopeOf(t, schemas, req)
}

// executorOf returns the replica that started the call.
func (w *watcher) executorOf(t testing.TB, req events.CallRequest) string {
	t.Helper()
	subj, err := events.CallSubject(req.RunID, req.CallID, "started")
	require.NoError(t, err)
	var started events.CallStarted
	require.NoError(t, events.DecodeData(w.wait(t, subj), &started))
	return started.Executor
}

// TestRateLimitSharedByReplicas: three replicas take tokens from one bucket
// per tenant and tool in KV, so a burst of 5 lets exactly 5 of 20 calls of one
// tenant through, whichever replicas run them; another tenant has its own
// bucket. The refused calls fail with RATE_LIMIT and retry_after_s.
func TestRateLimitSharedByReplicas(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	var runs atomic.Int32
	limited := newTestTool("limited", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		runs.Add(1)
		select { // long enough for the work to spread over the replicas
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return okOutput(ctx, in)
	})
	// One call a day: no token comes back during the test.
	limited.def.RateLimit = &envelope.RateLimit{PerS: envelope.MinRateLimitPerS, Burst: 5}
	replicas := map[string]*Service{}
	for _, id := range []string{"rl-a", "rl-b", "rl-c"} {
		// Started at once: each call's started event names its replica.
		replicas[id] = startExecutor(t, env, Config{ID: id, Concurrency: 2, StartedAfter: -1}, WithTools(limited))
	}

	const runID = "run-ratelimit"
	w := watchRun(t, env.JS, runID)
	acme := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws", UserID: "u1"}
	globex := envelope.Tenant{OrgID: "globex", WorkspaceID: "ws", UserID: "u1"}
	var reqs []events.CallRequest
	for i := range 23 {
		req := callRequest(t, runID, i+1, "limited", "1.0.0", fmt.Sprintf(`{"n":%d}`, i))
		req.Tenant = acme
		if i >= 20 {
			req.Tenant = globex
		}
		reqs = append(reqs, req)
	}
	publishAllApproved(t, env.JS, reqs)

	ok, refused := map[string]int{}, 0
	executors := map[string]int{}
	for i, req := range reqs {
		got := w.envelopeOf(t, schemas, req)
		executors[w.executorOf(t, req)]++
		if got.Error == nil {
			ok[req.Tenant.OrgID]++
			continue
		}
		require.Less(t, i, 20, "globex has its own bucket")
		require.Equal(t, envelope.CodeRateLimit, got.Error.Code)
		require.Contains(t, got.Error.Message, "rate limit of tool limited reached for this tenant")
		require.Greater(t, got.Error.RetryAfterS, 3600.0, "a token comes back in about a day")
		refused++
	}
	t.Logf("calls per replica: %v", executors)
	require.Equal(t, map[string]int{"acme": 5, "globex": 3}, ok, "exactly the burst, across all replicas")
	require.Equal(t, 15, refused)
	require.Equal(t, int32(8), runs.Load(), "refused calls never run the tool")
	require.GreaterOrEqual(t, len(executors), 2, "the calls were spread over replicas")

	var limitedTotal float64
	for _, s := range replicas {
		limitedTotal += testutil.ToFloat64(s.metrics.rateLimited.WithLabelValues("limited@1.0.0"))
	}
	require.Equal(t, 15.0, limitedTotal)

	kv, err := env.JS.KeyValue(t.Context(), provision.BucketRate)
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), ratebucket.Key(acme.ID(), "limited"))
	require.NoError(t, err)
	var st ratebucket.State
	require.NoError(t, json.Unmarshal(e.Value(), &st))
	require.Less(t, st.Tokens, 1.0)
}

// TestRateLimiterRefills: the bucket refills at per_s, never beyond burst, and
// the wait it reports is the time until the next token.
func TestRateLimiterRefills(t *testing.T) {
	env := eventstest.Start(t)
	kv, err := env.JS.KeyValue(t.Context(), provision.BucketRate)
	require.NoError(t, err)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &rateLimiter{kv: kv, now: func() time.Time { return now }}
	lim := &envelope.RateLimit{PerS: 2, Burst: 2} // a token every 500ms

	steps := []struct {
		advance time.Duration
		wait    time.Duration // 0: allowed
	}{
		{0, 0}, {0, 0}, // the full burst
		{0, 500 * time.Millisecond},
		{200 * time.Millisecond, 300 * time.Millisecond},
		{300 * time.Millisecond, 0},
		{0, 500 * time.Millisecond},
		{time.Hour, 0}, {0, 0}, // refilled to burst, not beyond
		{0, 500 * time.Millisecond},
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		wait, err := l.take(t.Context(), "acme/ws/u", "tool", lim)
		require.NoError(t, err)
		require.InDelta(t, st.wait.Seconds(), wait.Seconds(), 0.002, "step %d", i)
	}
	// Another tenant and another tool have buckets of their own.
	wait, err := l.take(t.Context(), "other/ws/u", "tool", lim)
	require.NoError(t, err)
	require.Zero(t, wait)
	wait, err = l.take(t.Context(), "acme/ws/u", "other_tool", lim)
	require.NoError(t, err)
	require.Zero(t, wait)
	require.Equal(t, 1.5, retryAfterSeconds(1499500*time.Microsecond))
}

// TestCircuitOpensAndCloses: consecutive PROVIDER_ERROR, NETWORK_ERROR and
// TIMEOUT outcomes open the tool's circuit; an open circuit answers
// PROVIDER_ERROR with retry_after_s at once without running the tool; after
// the open period one trial call that succeeds closes it. Other outcomes do
// not count as failures.
func TestCircuitOpensAndCloses(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	var mode atomic.Value
	mode.Store("ok")
	var runs atomic.Int32
	flaky := newTestTool("flaky", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		runs.Add(1)
		switch mode.Load().(string) {
		case "provider":
			return nil, envelope.NewToolError(envelope.CodeProviderError, "upstream said 503")
		case "network":
			return nil, envelope.NewToolError(envelope.CodeNetworkError, "connection refused")
		case "hang":
			<-ctx.Done()
			return nil, context.Cause(ctx)
		case "bad_input":
			return nil, envelope.NewToolError(envelope.CodeValidation, "no such city")
		}
		return okOutput(ctx, in)
	})
	flaky.def.TimeoutMS = 30
	s := startExecutor(t, env, Config{CircuitFailures: 3, CircuitOpen: 300 * time.Millisecond}, WithTools(flaky))
	const runID = "run-circuit"
	w := watchRun(t, env.JS, runID)
	seq := 0
	call := func(m string) envelope.ToolEnvelope {
		mode.Store(m)
		seq++
		return w.call(t, env.JS, schemas, callRequest(t, runID, seq, "flaky", "1.0.0", fmt.Sprintf(`{"seq":%d}`, seq)))
	}

	require.Equal(t, envelope.CodeProviderError, call("provider").Error.Code)
	require.Equal(t, envelope.CodeValidation, call("bad_input").Error.Code, "the tool answered: not a failure of its health")
	require.Nil(t, call("ok").Error, "a success resets the count")
	require.Equal(t, envelope.CodeProviderError, call("provider").Error.Code)
	require.Equal(t, envelope.CodeNetworkError, call("network").Error.Code)
	h := s.Health()
	require.Len(t, h, 1)
	require.Equal(t, ToolHealth{Tool: "flaky@1.0.0", State: CircuitClosed, ConsecutiveFailures: 2, LastFailure: envelope.CodeNetworkError, LastFailureAt: h[0].LastFailureAt}, h[0])
	require.Equal(t, envelope.CodeTimeout, call("hang").Error.Code)
	require.Equal(t, int32(6), runs.Load())

	// Open: the tool is not run, the answer is immediate.
	fast := call("ok")
	require.NotNil(t, fast.Error)
	require.Equal(t, envelope.CodeProviderError, fast.Error.Code)
	require.Contains(t, fast.Error.Message, "tool flaky@1.0.0 is unavailable: its circuit is open after 3 consecutive failures (last: TIMEOUT)")
	require.Greater(t, fast.Error.RetryAfterS, 0.0)
	require.LessOrEqual(t, fast.Error.RetryAfterS, 0.3)
	require.Equal(t, int32(6), runs.Load(), "an open circuit does not run the tool")
	h = s.Health()
	require.Equal(t, CircuitOpen, h[0].State)
	require.Equal(t, uint32(3), h[0].ConsecutiveFailures)
	require.False(t, h[0].OpenUntil.IsZero())
	// What the heartbeats tell the catalog: the open circuit.
	require.Equal(t, []registry.ToolHealth{{Tool: "flaky@1.0.0", State: CircuitOpen, ConsecutiveFailures: 3,
		OpenUntil: h[0].OpenUntil, LastFailure: string(envelope.CodeTimeout)}}, s.unwell())
	require.Equal(t, 2.0, testutil.ToFloat64(s.metrics.circuit.WithLabelValues("flaky@1.0.0")))
	require.Equal(t, 1.0, testutil.ToFloat64(s.metrics.circuitFast.WithLabelValues("flaky@1.0.0")))

	// After the open period, one successful trial closes it again.
	wait := time.NewTimer(time.Duration(fast.Error.RetryAfterS*float64(time.Second)) + 10*time.Millisecond)
	select {
	case <-wait.C:
	case <-t.Context().Done():
		t.Fatal("test ended")
	}
	require.Nil(t, call("ok").Error)
	require.Equal(t, int32(7), runs.Load())
	h = s.Health()
	require.Equal(t, CircuitClosed, h[0].State)
	require.Zero(t, h[0].ConsecutiveFailures)
	require.Empty(t, s.unwell(), "a closed circuit without failures is not named")
	require.Equal(t, 0.0, testutil.ToFloat64(s.metrics.circuit.WithLabelValues("flaky@1.0.0")))
}

// TestCachePolicies: tools with cache ttl or forever and side effects none or
// reads are served from the cache for the same tenant and input (any key
// order), with cached true and the call's own id, input and times; another
// tenant, another input or cache none run the tool; a ttl entry expires.
func TestCachePolicies(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	counts := map[string]*atomic.Int32{}
	mk := func(name string, se envelope.SideEffects, policy envelope.CachePolicy, ttlS int) testTool {
		n := &atomic.Int32{}
		counts[name] = n
		tt := newTestTool(name, func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			n.Add(1)
			return json.RawMessage(fmt.Sprintf(`{"ok":true,"run":%d}`, n.Load())), nil
		})
		tt.def.Metadata.SideEffects, tt.def.Metadata.Cache, tt.def.Metadata.CacheTTLS = se, policy, ttlS
		return tt
	}
	startExecutor(t, env, Config{}, WithTools(
		mk("pure_forever", envelope.SideEffectsNone, envelope.CacheForever, 0),
		mk("reads_ttl", envelope.SideEffectsReads, envelope.CacheTTL, 1),
		mk("uncached", envelope.SideEffectsReads, envelope.CacheNone, 0),
	))
	const runID = "run-cache"
	w := watchRun(t, env.JS, runID)
	acme := envelope.Tenant{OrgID: "acme", WorkspaceID: "ws", UserID: "u1"}
	globex := envelope.Tenant{OrgID: "globex", WorkspaceID: "ws", UserID: "u1"}
	seq := 0
	call := func(tool, input string, tenant envelope.Tenant) envelope.ToolEnvelope {
		seq++
		req := callRequest(t, runID, seq, tool, "1.0.0", input)
		req.Tenant = tenant
		got := w.call(t, env.JS, schemas, req)
		require.Nil(t, got.Error)
		require.Equal(t, req.CallID, got.CallID, "the call's own id")
		require.JSONEq(t, input, string(got.Input))
		return got
	}

	first := call("pure_forever", `{"a":1,"b":2}`, acme)
	require.False(t, first.Cached)
	hit := call("pure_forever", `{"b":2.0,"a":1}`, acme)
	require.True(t, hit.Cached)
	require.JSONEq(t, string(first.Output), string(hit.Output))
	require.True(t, hit.TStart.After(first.TEnd) || hit.TStart.Equal(first.TEnd), "a hit has its own times")
	require.False(t, hit.TEnd.Before(hit.TStart))
	require.Equal(t, int32(1), counts["pure_forever"].Load())
	require.False(t, call("pure_forever", `{"a":1,"b":2}`, globex).Cached, "another tenant never reads acme's cache")
	require.False(t, call("pure_forever", `{"a":1,"b":3}`, acme).Cached, "another input")
	require.Equal(t, int32(3), counts["pure_forever"].Load())

	require.False(t, call("uncached", `{}`, acme).Cached)
	require.False(t, call("uncached", `{}`, acme).Cached)
	require.Equal(t, int32(2), counts["uncached"].Load())

	require.False(t, call("reads_ttl", `{"q":"x"}`, acme).Cached)
	require.True(t, call("reads_ttl", `{"q":"x"}`, acme).Cached)
	// The entry carries its own TTL: after a second the key is gone.
	kv, err := env.JS.KeyValue(t.Context(), provision.BucketCache)
	require.NoError(t, err)
	key, err := envelope.CacheKey(acme.ID(), "reads_ttl", "1.0.0", []byte(`{"q":"x"}`))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := kv.Get(t.Context(), key)
		return err != nil
	}, 10*time.Second, 50*time.Millisecond, "the ttl entry expires")
	require.False(t, call("reads_ttl", `{"q":"x"}`, acme).Cached, "expired: the tool runs again")
	require.Equal(t, int32(2), counts["reads_ttl"].Load())
}

// sizedTool is a test tool that returns outputs[input.size].
func sizedTool(name string, outputs map[string]json.RawMessage) testTool {
	return newTestTool(name, func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		var p struct {
			Size string `json:"size"`
		}
		if err := json.Unmarshal(in, &p); err != nil {
			return nil, err
		}
		return outputs[p.Size], nil
	})
}

// TestTruncation: an output above max_output_bytes is stored whole as a blob;
// the envelope is truncated, carries the blob attachment and a preview that is
// valid JSON and cut on a character boundary. An output below the limit whose
// envelope would not fit in one NATS message (its input is large) is
// truncated too, and so is one under the limit in bytes that escaping in the
// event would take over it.
func TestTruncation(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	// big is under max_output_bytes (192 KiB) but its envelope, with an
	// input of 950 KiB, cannot fit in a 1 MiB message; escaped is 40 KiB of
	// '<', which the event encodes as 240 KiB; huge is over 5 MiB.
	big := json.RawMessage(`{"ok":true,"text":"` + strings.Repeat("x", 100<<10) + `"}`)
	escaped := json.RawMessage(`{"ok":true,"text":"` + strings.Repeat("<", 40<<10) + `"}`)
	huge := json.RawMessage(`{"ok":true,"text":"` + strings.Repeat("0123456789", 5<<20/10) + `"}`)
	outputs := map[string]json.RawMessage{"big": big, "escaped": escaped, "huge": huge, "small": json.RawMessage(`{"ok":true}`)}
	s := startExecutor(t, env, Config{MaxOutputBytes: MaxMaxOutputBytes, PreviewBytes: 101}, WithTools(sizedTool("sizer", outputs)))
	const runID = "run-truncate"
	w := watchRun(t, env.JS, runID)

	tests := []struct {
		size      string
		pad       int // bytes of padding in the input
		truncated bool
	}{
		{size: "small"},
		{size: "big", pad: 950 << 10, truncated: true}, // under 192 KiB, over a message with its input
		{size: "escaped", truncated: true},             // 40 KiB, 240 KiB escaped
		{size: "huge", truncated: true},                // 5 MiB
	}
	for i, tc := range tests {
		req := callRequest(t, runID, i+1, "sizer", "1.0.0", fmt.Sprintf(`{"size":%q,"pad":%q}`, tc.size, strings.Repeat("p", tc.pad)))
		got := w.call(t, env.JS, schemas, req)
		require.Nil(t, got.Error, "%s: %+v", tc.size, got.Error)
		require.Equal(t, string(req.Input), string(got.Input), "the input stays byte for byte")
		full := outputs[tc.size]
		if !tc.truncated {
			require.False(t, got.Truncated)
			require.JSONEq(t, string(full), string(got.Output))
			continue
		}
		require.True(t, got.Truncated, tc.size)
		require.Len(t, got.Attachments, 1)
		att := got.Attachments[0]
		require.Equal(t, envelope.Attachment{Kind: envelope.AttachmentBlob, URL: "/v1/blobs/" + runID + "." + req.CallID + ".output", ContentType: "application/json", Bytes: int64(len(full))}, att)
		var preview TruncatedOutput
		require.NoError(t, json.Unmarshal(got.Output, &preview), "the preview is valid JSON")
		require.True(t, preview.Truncated)
		require.Equal(t, len(full), preview.Bytes)
		require.True(t, strings.HasPrefix(string(full), preview.Preview))
		require.LessOrEqual(t, len(preview.Preview), 101)
		data, ct, err := blobs.Get(t.Context(), env.JS, strings.TrimPrefix(att.URL, blobs.URLPrefix))
		require.NoError(t, err)
		require.Equal(t, "application/json", ct)
		require.Equal(t, string(full), string(data), "the blob holds the whole output")
	}
	require.Equal(t, 3.0, testutil.ToFloat64(s.metrics.truncated.WithLabelValues("sizer@1.0.0")))
}

// TestEnvelopesStayBounded: outputs of 300 KiB and 2 MiB (a web page, a file)
// give envelopes, and completed events as stored with their headers, well
// under 256 KiB, at the default limits and at the largest settings (192 KiB
// inline, a preview as long), even when escaping in the event would blow a
// preview up six times; the whole output is in the blob.
func TestEnvelopesStayBounded(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	const bound = 256 << 10
	page := func(n int, fill string) json.RawMessage {
		return json.RawMessage(`{"ok":true,"html":"` + strings.Repeat(fill, (n-30)/len(fill)) + `"}`)
	}
	outputs := map[string]json.RawMessage{
		"300k":      page(300<<10, "<p>lorem ipsum</p>"),
		"2m":        page(2<<20, "0123456789"),
		"300k-tags": page(300<<10, "<"),
	}
	sizer := sizedTool("pager", outputs)
	st, err := env.JS.Stream(t.Context(), events.StreamCalls)
	require.NoError(t, err)

	for _, cfg := range []struct {
		name string
		cfg  Config
	}{
		{name: "defaults"},
		{name: "largest settings", cfg: Config{MaxOutputBytes: MaxMaxOutputBytes, PreviewBytes: MaxMaxOutputBytes}},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			c := cfg.cfg
			c.Queues = []string{"bounded-" + strings.ReplaceAll(cfg.name, " ", "-")}
			s := startExecutor(t, env, c, WithTools(sizer))
			runID := "run-bounded-" + strings.ReplaceAll(cfg.name, " ", "-")
			w := watchRun(t, env.JS, runID)
			for i, size := range []string{"300k", "2m", "300k-tags"} {
				req := callRequest(t, runID, i+1, "pager", "1.0.0", fmt.Sprintf(`{"size":%q}`, size))
				req.Queue = c.Queues[0]
				got := w.call(t, env.JS, schemas, req)
				require.Nil(t, got.Error, "%s: %+v", size, got.Error)
				require.True(t, got.Truncated, size)

				b, err := json.Marshal(got)
				require.NoError(t, err)
				require.Less(t, len(b), bound, "%s: the envelope", size)
				require.LessOrEqual(t, len(got.Output), s.Config().MaxOutputBytes, "%s: the output weighs at most max_output_bytes", size)
				m, err := st.GetLastMsgForSubject(t.Context(), completedSubject(t, req))
				require.NoError(t, err)
				stored := len(m.Subject) + len(m.Data)
				for k, vs := range m.Header {
					for _, v := range vs {
						stored += len(k) + len(v) + 4
					}
				}
				require.Less(t, stored, bound, "%s: the completed event with its headers", size)
				t.Logf("%s: output %d bytes, envelope %d bytes, event %d bytes", size, len(outputs[size]), len(b), stored)

				require.Len(t, got.Attachments, 1)
				data, _, err := blobs.Get(t.Context(), env.JS, strings.TrimPrefix(got.Attachments[0].URL, blobs.URLPrefix))
				require.NoError(t, err)
				require.Equal(t, string(outputs[size]), string(data), "%s: the blob holds the whole output", size)
				var preview TruncatedOutput
				require.NoError(t, json.Unmarshal(got.Output, &preview))
				require.True(t, strings.HasPrefix(string(outputs[size]), preview.Preview))
				require.NotEmpty(t, preview.Preview)
			}
		})
	}
}

// TestInputTooLargeForItsResult: a call whose input fits in its request but
// leaves no room in one message for its result envelope (which carries the
// input) is refused before the tool runs, with VALIDATION_ERROR naming the
// input's size and the limit, not blamed on the output.
func TestInputTooLargeForItsResult(t *testing.T) {
	env := eventstest.Start(t)
	var ran atomic.Int32
	startExecutor(t, env, Config{}, WithTools(newTestTool("echo_len", func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		ran.Add(1)
		return json.RawMessage(fmt.Sprintf(`{"ok":true,"len":%d}`, len(in))), nil
	})))
	w := watchRun(t, env.JS, "run-big-input")
	maxPayload := int(env.Conn.MaxPayload())
	input := `{"text":"` + strings.Repeat("x", maxPayload-messageHeadroom/2) + `"}`
	req := callRequest(t, "run-big-input", 1, "echo_len", "1.0.0", input)
	publishApproved(t, publish.NewPublisher(env.JS), req)
	ev := w.wait(t, completedSubject(t, req))
	var got envelope.ToolEnvelope
	require.NoError(t, events.DecodeData(ev, &got))
	require.NotNil(t, got.Error)
	require.Equal(t, envelope.CodeValidation, got.Error.Code, got.Error.Message)
	require.Contains(t, got.Error.Message, fmt.Sprintf("the input of tool echo_len@1.0.0 (%d bytes) is too large", len(input)))
	require.Contains(t, got.Error.Message, fmt.Sprintf("(%d bytes, %d of them kept for the headers)", maxPayload, messageHeadroom))
	require.Zero(t, ran.Load(), "the tool did not run")
}

// TestTruncationPreviewCutsOnCharacters: a tiny max_output_bytes truncates a
// small output, and the preview never splits a multi-byte character.
func TestTruncationPreviewCutsOnCharacters(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	out := json.RawMessage(`{"ok":true,"text":"` + strings.Repeat("é", 140) + `"}`)
	startExecutor(t, env, Config{MaxOutputBytes: 200, PreviewBytes: 100}, WithTools(newTestTool("accents", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return out, nil
	})))
	w := watchRun(t, env.JS, "run-accents")
	got := w.call(t, env.JS, schemas, callRequest(t, "run-accents", 1, "accents", "1.0.0", `{}`))
	require.True(t, got.Truncated)
	var preview TruncatedOutput
	require.NoError(t, json.Unmarshal(got.Output, &preview))
	// 19 bytes of prefix, then 2-byte characters: 100 bytes would split one.
	require.Equal(t, 99, len(preview.Preview))
	require.NotContains(t, preview.Preview, "\uFFFD")
	require.Equal(t, len(out), preview.Bytes)

	for _, tc := range []struct {
		in   string
		n    int
		want int
	}{
		{"abc", 2, 2}, {"abc", 9, 3}, {"é", 1, 0}, {"aé", 2, 1}, {"aé", 3, 3}, {"", 0, 0},
	} {
		require.Equal(t, tc.want, utf8Cut([]byte(tc.in), tc.n), "%q %d", tc.in, tc.n)
	}
}

// TestCachedTruncatedOutput: a truncated output is cached with its blob
// attachment; once the blob is gone the entry no longer counts as a hit.
func TestCachedTruncatedOutput(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	var runs atomic.Int32
	out := json.RawMessage(`{"ok":true,"text":"` + strings.Repeat("z", 500) + `"}`)
	tool := newTestTool("cached_big", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		runs.Add(1)
		return out, nil
	})
	tool.def.Metadata.Cache = envelope.CacheForever
	startExecutor(t, env, Config{MaxOutputBytes: 100, PreviewBytes: 50}, WithTools(tool))
	const runID = "run-cached-big"
	w := watchRun(t, env.JS, runID)

	first := w.call(t, env.JS, schemas, callRequest(t, runID, 1, "cached_big", "1.0.0", `{}`))
	require.True(t, first.Truncated)
	require.False(t, first.Cached)
	hit := w.call(t, env.JS, schemas, callRequest(t, runID, 2, "cached_big", "1.0.0", `{}`))
	require.True(t, hit.Cached)
	require.True(t, hit.Truncated)
	require.Equal(t, first.Attachments, hit.Attachments, "the hit points at the same blob")
	require.Equal(t, int32(1), runs.Load())

	obs, err := env.JS.ObjectStore(t.Context(), provision.ObjectBlobs)
	require.NoError(t, err)
	require.NoError(t, obs.Delete(t.Context(), strings.TrimPrefix(first.Attachments[0].URL, blobs.URLPrefix)))
	again := w.call(t, env.JS, schemas, callRequest(t, runID, 3, "cached_big", "1.0.0", `{}`))
	require.False(t, again.Cached, "an entry whose blob is gone is a miss")
	require.Equal(t, int32(2), runs.Load())
	data, _, err := blobs.Get(t.Context(), env.JS, strings.TrimPrefix(again.Attachments[0].URL, blobs.URLPrefix))
	require.NoError(t, err)
	require.Equal(t, string(out), string(data))
	fresh := w.call(t, env.JS, schemas, callRequest(t, runID, 4, "cached_big", "1.0.0", `{}`))
	require.True(t, fresh.Cached, "the entry was replaced with the new blob")
	require.Equal(t, again.Attachments, fresh.Attachments)
	require.Equal(t, int32(2), runs.Load())
}

// boundOf is never below what an envelope without an error weighs encoded,
// however its bytes escape: the fast path of fits trusts it.
func TestBoundOfIsAnUpperBound(t *testing.T) {
	worst := strings.Repeat("<\x01&>", 1000)
	str := func(s string) json.RawMessage {
		b, err := json.Marshal(s)
		require.NoError(t, err)
		return b
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 123456789, time.UTC)
	for name, env := range map[string]envelope.ToolEnvelope{
		"empty":   {},
		"plain":   {CallID: strings.Repeat("a", 64), Name: "echo", Version: "1.0.0", Input: json.RawMessage(`{"text":"hi"}`), Output: json.RawMessage(`{"text":"hi"}`), TStart: now, TEnd: now},
		"escapes": {CallID: strings.Repeat("a", 64), Name: "echo", Version: "1.0.0", Input: str(worst), Output: str(worst), TStart: now, TEnd: now, Cost: 0.125, Cached: true, Truncated: true},
		"unicode": {Name: strings.Repeat("é", 200), Version: strings.Repeat("\u2028", 50), Input: str(strings.Repeat("\u2029ü", 500)), TStart: now, TEnd: now},
		"attachments": {Name: "fetch", Version: "1.0.0", Input: json.RawMessage(`{}`), Attachments: []envelope.Attachment{
			{Kind: envelope.AttachmentBlob, URL: "toolwire-blob://" + strings.Repeat("<", 300), ContentType: "application/json", Bytes: 1 << 40},
			{Kind: envelope.AttachmentBlob, URL: strings.Repeat("&", 100), Bytes: 1},
		}},
	} {
		b, err := json.Marshal(&env)
		require.NoError(t, err)
		require.LessOrEqual(t, len(b), boundOf(&env), name)
	}
}

// TestEnvelopeCost: the completed envelope carries the tool's declared cost
// when the call is billable (the tool ran, or may have: success, a provider
// error, a timeout), and 0 when it never ran or its result came from the
// cache: cached, refused (blocked), invalid input (the executor's check or
// the tool's own), rate limited, missing secrets, unknown tool. A writes
// call's outcome record holds the cost it was published with.
func TestEnvelopeCost(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	reg := openRegistry(t, env.JS)
	writes := newTestTool("costly_write", okOutput)
	writes.def.Metadata.SideEffects, writes.def.Cost = envelope.SideEffectsWrites, 0.5
	startExecutor(t, env, Config{}, WithTools(authTool{name: "auth_cost"}, writes)) // no master key

	const cost = 0.25
	priced := func(def envelope.ToolDefinition, state registry.State, change func(*envelope.ToolDefinition)) {
		putEntry(t, reg, def, state, func(d *envelope.ToolDefinition) {
			d.Version, d.Cost = "2.0.0", cost
			if change != nil {
				change(d)
			}
		})
	}
	priced(builtinDef(t, "echo"), registry.StateActive, nil)
	priced(builtinDef(t, "calculator"), registry.StateActive, nil)
	priced(builtinDef(t, "json_query"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Metadata.Cache = envelope.CacheForever
	})
	priced(testtools.Failing().Definition(), registry.StateActive, nil)
	priced(testtools.Sleep().Definition(), registry.StateActive, func(d *envelope.ToolDefinition) { d.TimeoutMS = 20 })
	priced(builtinDef(t, "get_current_time"), registry.StateBlocked, nil)
	priced(authTool{name: "auth_cost"}.Definition(), registry.StateActive, nil)
	// One call a day, a burst of one: the second call is rate limited.
	putEntry(t, reg, builtinDef(t, "echo"), registry.StateActive, func(d *envelope.ToolDefinition) {
		d.Version, d.Cost = "2.1.0", cost
		d.RateLimit = &envelope.RateLimit{PerS: envelope.MinRateLimitPerS, Burst: 1}
	})

	const runID = "run-cost"
	w := watchRun(t, env.JS, runID)
	tests := []struct {
		name   string
		tool   string
		input  string
		code   envelope.ErrorCode
		cached bool
		want   float64
	}{
		{name: "success", tool: "echo@2.0.0", input: `{"text":"paid"}`, want: cost},
		{name: "provider error", tool: "failing@2.0.0", input: `{"message":"down"}`, code: envelope.CodeProviderError, want: cost},
		{name: "timeout", tool: "sleep@2.0.0", input: `{"ms":600000}`, code: envelope.CodeTimeout, want: cost},
		{name: "first call of a cacheable tool", tool: "json_query@2.0.0", input: `{"input":{"a":1},"query":".a"}`, want: cost},
		{name: "cached", tool: "json_query@2.0.0", input: `{"input":{"a":1},"query":".a"}`, cached: true},
		{name: "invalid input", tool: "calculator@2.0.0", input: `{"expr":"1"}`, code: envelope.CodeValidation},
		{name: "input the tool rejects", tool: "calculator@2.0.0", input: `{"expression":"1/0"}`, code: envelope.CodeValidation},
		{name: "refused: blocked", tool: "get_current_time@2.0.0", input: `{}`, code: envelope.CodePolicyDenied},
		{name: "unknown tool", tool: "nope@2.0.0", input: `{}`, code: envelope.CodeValidation},
		{name: "missing secrets", tool: "auth_cost@2.0.0", input: `{}`, code: envelope.CodeAuthRequired},
		{name: "within the rate limit", tool: "echo@2.1.0", input: `{"text":"first"}`, want: cost},
		{name: "rate limited", tool: "echo@2.1.0", input: `{"text":"second"}`, code: envelope.CodeRateLimit},
		{name: "writes", tool: "costly_write@1.0.0", input: `{}`, want: 0.5},
	}
	for i, tc := range tests {
		// One at a time: the cache hit and the rate limit depend on the
		// calls before them.
		ref, err := envelope.ParseToolRef(tc.tool)
		require.NoError(t, err)
		req := callRequest(t, runID, i+1, ref.Name, ref.Version, tc.input)
		got := w.call(t, env.JS, schemas, req)
		t.Run(tc.name, func(t *testing.T) {
			if tc.code == "" {
				require.Nil(t, got.Error, "%+v", got.Error)
			} else {
				require.NotNil(t, got.Error)
				require.Equal(t, tc.code, got.Error.Code, got.Error.Message)
			}
			require.Equal(t, tc.cached, got.Cached)
			require.Equal(t, tc.want, got.Cost)
			require.Equal(t, tc.want != 0, got.Billable())

			// The cost is in the event as the contract spells it.
			var raw map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(w.wait(t, completedSubject(t, req)).Data(), &raw))
			if tc.want == 0 {
				require.NotContains(t, raw, "cost")
			} else {
				require.JSONEq(t, fmt.Sprint(tc.want), string(raw["cost"]))
			}
			if ref.Name == "costly_write" {
				kv, err := env.JS.KeyValue(t.Context(), provision.BucketOutcomes)
				require.NoError(t, err)
				e, err := kv.Get(context.WithoutCancel(t.Context()), outcomeKey(req.RunID, req.CallID))
				require.NoError(t, err)
				var rec outcomeRecord
				require.NoError(t, json.Unmarshal(e.Value(), &rec))
				require.Equal(t, outcomeDone, rec.State)
				require.Equal(t, tc.want, rec.Envelope.Cost, "the record holds the cost published")
			}
		})
	}
}

// TestCircuitSharedAcrossReplicas: a circuit that opens is announced at
// once (a heartbeat without waiting for the period), and a call on a
// replica whose own circuit is closed fails fast, with retry_after_s,
// while another live executor says that its circuit is open; once that
// one reports it closed, the call runs.
func TestCircuitSharedAcrossReplicas(t *testing.T) {
	env := eventstest.Start(t)
	schemas := newEventSchemas(t)
	var fail atomic.Bool
	var runs atomic.Int32
	flaky := newTestTool("flaky", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		runs.Add(1)
		if fail.Load() {
			return nil, envelope.NewToolError(envelope.CodeProviderError, "upstream said 503")
		}
		return okOutput(ctx, in)
	})
	// A heartbeat period far longer than the test: only a kick beats.
	s := startExecutor(t, env, Config{CircuitFailures: 2, CircuitOpen: time.Minute, Heartbeat: 3 * time.Minute}, WithTools(flaky))
	const runID = "run-shared-circuit"
	w := watchRun(t, env.JS, runID)
	seq := 0
	call := func() envelope.ToolEnvelope {
		seq++
		return w.call(t, env.JS, schemas, callRequest(t, runID, seq, "flaky", "1.0.0", fmt.Sprintf(`{"seq":%d}`, seq)))
	}

	// Another executor reports the tool down: this replica fails fast.
	peer := func(state string, until time.Time) {
		require.NoError(t, registry.Beat(t.Context(), env.JS, registry.Worker{Queue: envelope.DefaultQueue, Instance: "peer-1", ID: "executor-peer",
			TTL: registry.MaxWorkerTTL, Health: []registry.ToolHealth{{Tool: "flaky@1.0.0", State: state, ConsecutiveFailures: 5,
				OpenUntil: until, LastFailure: string(envelope.CodeTimeout)}}}, time.Now()))
	}
	peer(CircuitOpen, time.Now().Add(30*time.Second))
	servicetest.PollUntil(t, 5*time.Second, "the replica sees the peer's circuit", func() bool {
		_, _, open := s.peers.OpenElsewhere("flaky@1.0.0", s.instance)
		return open
	})
	fast := call()
	require.NotNil(t, fast.Error)
	require.Equal(t, envelope.CodeProviderError, fast.Error.Code)
	require.Contains(t, fast.Error.Message, "tool flaky@1.0.0 is unavailable: executor executor-peer's circuit is open after 5 consecutive failures (last: TIMEOUT)")
	require.Greater(t, fast.Error.RetryAfterS, 20.0)
	require.Zero(t, runs.Load(), "the tool did not run")

	peer(CircuitClosed, time.Time{})
	servicetest.PollUntil(t, 5*time.Second, "the replica sees the peer's circuit closed", func() bool {
		_, _, open := s.peers.OpenElsewhere("flaky@1.0.0", s.instance)
		return !open
	})
	require.Nil(t, call().Error)

	// This replica's own circuit opens: its heartbeat says so at once.
	fail.Store(true)
	call()
	call()
	servicetest.PollUntil(t, 5*time.Second, "the opened circuit is announced before the next period", func() bool {
		ws, err := registry.ListWorkers(t.Context(), env.JS, time.Now())
		require.NoError(t, err)
		for _, wk := range ws {
			if wk.Instance == s.instance {
				for _, h := range wk.Health {
					if h.Tool == "flaky@1.0.0" && h.State == CircuitOpen {
						return true
					}
				}
			}
		}
		return false
	})
}

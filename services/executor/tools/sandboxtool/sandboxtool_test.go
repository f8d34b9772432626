package sandboxtool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/embedded/eventstest"
	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/executor/toolapi"
	"github.com/toolwire/toolwire/services/executor/tools/sandboxtool"
)

func sandboxDef(config string) *envelope.ToolDefinition {
	return &envelope.ToolDefinition{Name: "py", Version: "1.0.0", TimeoutMS: 30_000,
		Implementation: envelope.Implementation{Kind: envelope.ImplSandbox, Config: json.RawMessage(config)}}
}

// TestJobRoundTrip: a call becomes a sandbox job with the entry's code and
// the call's input, and the sandbox's answer becomes the call's output or
// error. The answer is published here as the sandbox service publishes it.
func TestJobRoundTrip(t *testing.T) {
	env := eventstest.Start(t)
	jobs := sandboxtool.NewJobs(env.JS, publish.NewPublisher(env.JS), "/toolwire/executor", sandboxtool.Options{})
	tl, err := jobs.Tool(sandboxDef(`{"language":"python","source":"print(1)"}`))
	require.NoError(t, err)

	// The stand-in for the sandbox service: the test reads each job and
	// publishes its answer as the sandbox service would.
	cons, err := env.JS.OrderedConsumer(t.Context(), events.StreamSandbox, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.Prefix + ".sandbox.*.*.requested"}})
	require.NoError(t, err)
	pub := publish.NewPublisher(env.JS)
	answer := func(output json.RawMessage, te *envelope.ToolError) events.SandboxJob {
		t.Helper()
		m, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		require.NoError(t, err)
		ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		require.NoError(t, err)
		var job events.SandboxJob
		require.NoError(t, events.DecodeData(ev, &job))
		res := events.SandboxResult{RunID: job.RunID, CallID: job.CallID, Output: output, Error: te, DurationMS: 1}
		out, err := events.NewSandboxResult("/toolwire/sandbox", res, job.TenantID, events.RunTrace{})
		require.NoError(t, err)
		require.NoError(t, pub.Publish(t.Context(), out))
		return job
	}

	type result struct {
		out json.RawMessage
		err error
	}
	run := func(callID, input string) chan result {
		done := make(chan result, 1)
		go func() {
			out, err := tl.Execute(t.Context(), json.RawMessage(input), toolapi.Context{TenantID: "acme", RunID: "run-sb", CallID: callID})
			done <- result{out, err}
		}()
		return done
	}

	done := run("c0ffee01", `21`)
	job := answer(json.RawMessage(`{"doubled":42}`), nil)
	require.Equal(t, "print(1)", job.Source)
	require.Equal(t, "py@1.0.0", job.Tool)
	require.Equal(t, "acme", job.TenantID)
	require.JSONEq(t, `21`, string(job.Input))
	require.Positive(t, job.TimeoutMS)
	r := <-done
	require.NoError(t, r.err)
	require.JSONEq(t, `{"doubled":42}`, string(r.out))

	done = run("c0ffee02", `"x"`)
	answer(nil, envelope.NewToolError(envelope.CodeSandboxError, "the program failed"))
	r = <-done
	var te *envelope.ToolError
	require.ErrorAs(t, r.err, &te)
	require.Equal(t, envelope.CodeSandboxError, te.Code)
	require.Equal(t, "the program failed", te.Message)
}

// TestToolRefusesABadConfig: an entry whose config the sandbox cannot run
// is refused before any job is sent.
func TestToolRefusesABadConfig(t *testing.T) {
	jobs := sandboxtool.NewJobs(nil, nil, "/toolwire/executor", sandboxtool.Options{})
	_, err := jobs.Tool(sandboxDef(`{"language":"cobol","source":"x"}`))
	require.ErrorContains(t, err, `language "cobol" is not supported`)
	_, err = jobs.Tool(sandboxDef(`{"language":"python","source":"x","extra":1}`))
	require.ErrorContains(t, err, "unknown field")
}

// TestNoTimeLeft: a call whose deadline leaves the sandbox no time is a
// TIMEOUT without a job.
func TestNoTimeLeft(t *testing.T) {
	jobs := sandboxtool.NewJobs(nil, nil, "/toolwire/executor", sandboxtool.Options{})
	tl, err := jobs.Tool(sandboxDef(`{"language":"python","source":"x"}`))
	require.NoError(t, err)
	ctx, cancel := context.WithDeadline(t.Context(), time.Now())
	defer cancel()
	_, err = tl.Execute(ctx, json.RawMessage(`1`), toolapi.Context{RunID: "run-sb", CallID: "c0ffee03"})
	var te *envelope.ToolError
	require.ErrorAs(t, err, &te)
	require.Equal(t, envelope.CodeTimeout, te.Code)
}

// TestWaitOutlastsTheJob: a job that runs to its timeout is answered only
// after the sandbox has stopped it, cleaned up and published its TIMEOUT.
// The job carries when the call stops waiting (its deadline: the call's),
// its timeout leaves the sandbox a margin before it, and the call waits that
// long: the sandbox's TIMEOUT, which names the limit hit, is the call's
// error, not an error of the wait.
func TestWaitOutlastsTheJob(t *testing.T) {
	env := eventstest.Start(t)
	jobs := sandboxtool.NewJobs(env.JS, publish.NewPublisher(env.JS), "/toolwire/executor", sandboxtool.Options{})
	def := sandboxDef(`{"language":"python","source":"while True: pass"}`)
	def.TimeoutMS = 5_000
	tl, err := jobs.Tool(def)
	require.NoError(t, err)
	cons, err := env.JS.OrderedConsumer(t.Context(), events.StreamSandbox, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.Prefix + ".sandbox.*.*.requested"}})
	require.NoError(t, err)

	// The executor bounds every call by its tool's timeout.
	ctx, cancel := context.WithTimeout(t.Context(), def.Timeout())
	defer cancel()
	callDeadline, _ := ctx.Deadline()
	type result struct {
		out json.RawMessage
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := tl.Execute(ctx, json.RawMessage(`1`), toolapi.Context{TenantID: "acme", RunID: "run-sb", CallID: "c0ffee04"})
		done <- result{out, err}
	}()

	m, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	require.NoError(t, err)
	received := time.Now()
	ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	require.NoError(t, err)
	var job events.SandboxJob
	require.NoError(t, events.DecodeData(ev, &job))
	require.True(t, job.Deadline.Equal(callDeadline), "the job's deadline %s is when the call stops waiting, %s", job.Deadline, callDeadline)
	require.LessOrEqual(t, job.TimeoutMS, 4_500, "the job's timeout leaves the sandbox a tenth of the call's time to answer")

	// The sandbox: the program runs to its timeout; then the answer.
	time.Sleep(time.Until(received.Add(job.Timeout())))
	te := envelope.NewToolError(envelope.CodeTimeout, "the program ran longer than its timeout of %s and was killed", job.Timeout()).
		WithDetails(map[string]any{"limit": "wall_time", "limit_value": job.TimeoutMS})
	res := events.SandboxResult{RunID: job.RunID, CallID: job.CallID, Error: te, DurationMS: int64(job.TimeoutMS)}
	out, err := events.NewSandboxResult("/toolwire/sandbox", res, job.TenantID, events.RunTrace{})
	require.NoError(t, err)
	require.NoError(t, publish.NewPublisher(env.JS).Publish(t.Context(), out))

	r := <-done
	var got *envelope.ToolError
	require.ErrorAs(t, r.err, &got, "the call must return the sandbox's answer, not %v", r.err)
	require.Equal(t, envelope.CodeTimeout, got.Code)
	require.Equal(t, te.Message, got.Message)
}

// TestJobTooLargeForOneMessage: a call whose code and input make a job larger
// than one message is refused before any job is sent, with VALIDATION_ERROR
// naming what did not fit: the sizes of the code and the input, the job's,
// and the limit.
func TestJobTooLargeForOneMessage(t *testing.T) {
	env := eventstest.Start(t)
	jobs := sandboxtool.NewJobs(env.JS, publish.NewPublisher(env.JS), "/toolwire/executor", sandboxtool.Options{})
	limit := env.Conn.MaxPayload()
	for _, c := range []struct {
		name, config string
		input        []byte
		code, in     int // the sizes the message names
	}{
		{"code tool", `{"language":"python","source":"import sys\nprint(len(sys.stdin.read()))"}`,
			[]byte(`"` + strings.Repeat("x", 1100<<10) + `"`), len("import sys\nprint(len(sys.stdin.read()))"), 1100<<10 + 2},
		{"python_exec", `{"language":"python","code_from_input":true}`,
			[]byte(`{"code":"print(1)","input":"` + strings.Repeat("y", 1100<<10) + `"}`), 8, 1100<<10 + 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			tl, err := jobs.Tool(sandboxDef(c.config))
			require.NoError(t, err)
			_, err = tl.Execute(t.Context(), c.input, toolapi.Context{TenantID: "acme", RunID: "run-sb", CallID: "c0ffee05"})
			var te *envelope.ToolError
			require.ErrorAs(t, err, &te)
			require.Equal(t, envelope.CodeValidation, te.Code, te.Message)
			require.Contains(t, te.Message, "the input of tool py@1.0.0 is too large for a sandbox job")
			require.Contains(t, te.Message, fmt.Sprintf("its code (%d bytes) and input (%d bytes) make a job larger than the %d bytes one message may carry",
				c.code, c.in, limit))
		})
	}
	s, err := env.JS.Stream(t.Context(), events.StreamSandbox)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "no job was sent")
}

// lossyPublisher publishes through pub, but loses the first drop jobs (it
// reports them sent, as a publish whose PubAck came from a leader that was
// gone a moment later) and, when fail is set, refuses every one with it.
type lossyPublisher struct {
	pub  *publish.Publisher
	mu   sync.Mutex
	drop int
	fail error
	sent int // publishes asked for
}

func (p *lossyPublisher) Publish(ctx context.Context, out events.Outgoing) error {
	p.mu.Lock()
	p.sent++
	drop := p.drop > 0
	if drop {
		p.drop--
	}
	p.mu.Unlock()
	switch {
	case p.fail != nil:
		return p.fail
	case drop:
		return nil
	}
	return p.pub.Publish(ctx, out)
}

func (p *lossyPublisher) publishes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent
}

// syncBuffer is a log sink the test reads while the tool writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestLostJob: a call does not wait blind for a job that was never stored.
// One whose publish was lost (reported sent, not stored: around a leader
// kill on a cluster) finds no job in the stream while it waits, sends it
// again with the same id, and completes; one whose publish fails for good
// ends SANDBOX_ERROR, logged with its run and call ids and counted. Before,
// a lost job left its call waiting for nothing until its timeout, and
// nothing said why.
func TestLostJob(t *testing.T) {
	refused := errors.New("publish refused: permissions violation")
	for _, c := range []struct {
		name      string
		drop      int
		fail      error
		publishes int // publishes asked for
		resends   float64
		failures  float64
		log       string // in the log, besides the call's ids
	}{
		{name: "lost once", drop: 1, publishes: 2, resends: 1, log: "the sandbox job is not stored; sending it again"},
		{name: "refused", fail: refused, publishes: 1, failures: 1, log: "the sandbox job could not be sent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := eventstest.Start(t)
			pub := &lossyPublisher{pub: publish.NewPublisher(env.JS), drop: c.drop, fail: c.fail}
			var logs syncBuffer
			failures := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "failures"}, []string{"tool"})
			resends := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "resends"}, []string{"tool"})
			jobs := sandboxtool.NewJobs(env.JS, pub, "/toolwire/executor", sandboxtool.Options{
				Log: slog.New(slog.NewTextHandler(&logs, nil)), PublishFailures: failures, Resends: resends,
				ConfirmAfter: 50 * time.Millisecond,
			})
			tl, err := jobs.Tool(sandboxDef(`{"language":"python","source":"print(1)"}`))
			require.NoError(t, err)

			// The stand-in for the sandbox service answers every job stored.
			cons, err := env.JS.OrderedConsumer(t.Context(), events.StreamSandbox, jetstream.OrderedConsumerConfig{
				FilterSubjects: []string{events.Prefix + ".sandbox.*.*.requested"}})
			require.NoError(t, err)
			cc, err := cons.Consume(func(m jetstream.Msg) {
				ev, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
				if err != nil {
					return
				}
				var job events.SandboxJob
				if events.DecodeData(ev, &job) != nil {
					return
				}
				res := events.SandboxResult{RunID: job.RunID, CallID: job.CallID, Output: json.RawMessage(`42`), DurationMS: 1}
				if out, err := events.NewSandboxResult("/toolwire/sandbox", res, job.TenantID, events.RunTrace{}); err == nil {
					_ = publish.NewPublisher(env.JS).Publish(t.Context(), out)
				}
			})
			require.NoError(t, err)
			defer cc.Stop()

			// The executor bounds every call by its tool's timeout (30s).
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			out, err := tl.Execute(ctx, json.RawMessage(`1`), toolapi.Context{TenantID: "acme", RunID: "run-lost", CallID: "c0ffee06"})
			if c.fail == nil {
				require.NoError(t, err, "the lost job must be sent again and answered while its call waits")
				require.JSONEq(t, `42`, string(out))
			} else {
				var te *envelope.ToolError
				require.ErrorAs(t, err, &te)
				require.Equal(t, envelope.CodeSandboxError, te.Code)
				require.Contains(t, te.Message, refused.Error())
			}
			require.Equal(t, c.publishes, pub.publishes())
			require.Equal(t, c.resends, testutil.ToFloat64(resends.WithLabelValues("py@1.0.0")))
			require.Equal(t, c.failures, testutil.ToFloat64(failures.WithLabelValues("py@1.0.0")))
			for _, want := range []string{c.log, "run_id=run-lost", "call_id=c0ffee06", "tool=py@1.0.0"} {
				require.Contains(t, logs.String(), want)
			}
		})
	}
}

// TestPreviewShowsTheCode: the dry run of a code tool is the code it would
// run (the definition's, or the call's own for a code-from-input tool), its
// input and its limits; no job is published (the Jobs have no JetStream).
func TestPreviewShowsTheCode(t *testing.T) {
	jobs := sandboxtool.NewJobs(nil, nil, "/toolwire/executor", sandboxtool.Options{})
	for _, tc := range []struct{ config, input, code, in string }{
		{`{"language":"python","source":"print(1)","limits":{"memory_bytes":67108864}}`, `{"n":2}`, "print(1)", `{"n":2}`},
		{`{"language":"python","code_from_input":true}`, `{"code":"import sys\nprint(sys.stdin.read())","input":[1]}`, "import sys\nprint(sys.stdin.read())", `[1]`},
	} {
		tl, err := jobs.Tool(sandboxDef(tc.config))
		require.NoError(t, err)
		out, err := tl.(toolapi.Previewer).Preview(t.Context(), json.RawMessage(tc.input), toolapi.Context{RunID: "run-sb", CallID: "c0ffee04"})
		require.NoError(t, err)
		var p struct {
			DryRun   bool            `json:"dry_run"`
			Language string          `json:"language"`
			Code     string          `json:"code"`
			Input    json.RawMessage `json:"input"`
			TimeoutS float64         `json:"timeout_s"`
		}
		require.NoError(t, json.Unmarshal(out, &p))
		require.True(t, p.DryRun)
		require.Equal(t, "python", p.Language)
		require.Equal(t, tc.code, p.Code)
		require.JSONEq(t, tc.in, string(p.Input))
		require.Positive(t, p.TimeoutS)
	}
}

// Package sandboxtool runs the registry entries of kind sandbox (python_exec
// and the operators' code tools) by sending each call to the sandbox service
// as a job and waiting for its result: the executor does not run code itself.
package sandboxtool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/jetstream/consume"
	"github.com/toolwire/toolwire/pkg/jetstream/publish"
	"github.com/toolwire/toolwire/services/executor/toolapi"
)

// For each call of a sandbox entry, the executor publishes a sandbox job
// (the code, the input, the limits) on toolwire.sandbox.<run>.<call>.requested
// and holds the call until the sandbox service answers on
// toolwire.sandbox.<run>.<call>.completed, bounded by the tool's timeout. The
// job's id is deterministic, so a redelivered call publishes no second job,
// and the wait reads the last result already stored as well as a new one.
// A call that has no answer after a short while (Options.ConfirmAfter) reads
// its job back from the stream, and sends it again, with the same id, when it
// is not there: a job lost around a leader change is run while its call still
// waits instead of ending it TIMEOUT. A job that is stored needs nothing more:
// the sandbox's consumer redelivers the job of a replica that died.

// Publisher publishes an event and waits for its PubAck
// (publish.Publisher).
type Publisher interface {
	Publish(ctx context.Context, out events.Outgoing) error
}

// DefaultConfirmAfter is how long a call waits for its answer before it
// looks for its job in the stream (Options.ConfirmAfter).
const DefaultConfirmAfter = 2 * time.Second

// maxConfirmEvery bounds the interval between two looks for a job not found
// stored: the interval doubles from ConfirmAfter up to it.
const maxConfirmEvery = 8 * time.Second

// lookupTimeout bounds one read of a job back from the stream.
const lookupTimeout = 2 * time.Second

// Options adjust a Jobs; zero fields take their defaults.
type Options struct {
	// Log hears of jobs sent again and of jobs that could not be sent, by
	// run and call id; default slog.Default().
	Log *slog.Logger
	// PublishFailures counts, by tool name@version, the jobs that could not
	// be sent: a publish that failed for good, or a job never found stored
	// by the end of its call. Nil: not counted.
	PublishFailures *prometheus.CounterVec
	// Resends counts, by tool name@version, the jobs sent again because
	// they were not found stored. Nil: not counted.
	Resends *prometheus.CounterVec
	// ConfirmAfter is how long a call waits for its answer before it reads
	// its job back from the stream; then again at doubling intervals (up to
	// 8s) until it is found. Default DefaultConfirmAfter.
	ConfirmAfter time.Duration
}

// Jobs sends sandbox jobs on one JetStream connection.
type Jobs struct {
	js     jetstream.JetStream
	pub    Publisher
	source string
	opts   Options

	mu     sync.Mutex
	stream jetstream.Stream // the sandbox stream, looked up once it is needed
}

// NewJobs returns the sender of jobs whose events have the CloudEvents source
// source (the executor's), published by pub.
func NewJobs(js jetstream.JetStream, pub Publisher, source string, opts Options) *Jobs {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.ConfirmAfter <= 0 {
		opts.ConfirmAfter = DefaultConfirmAfter
	}
	return &Jobs{js: js, pub: pub, source: source, opts: opts}
}

// count adds one to c's series of tool, when c is set.
func count(c *prometheus.CounterVec, tool string) {
	if c != nil {
		c.WithLabelValues(tool).Inc()
	}
}

// stored reports whether the sandbox stream holds a message on subject: a
// direct get, bounded by lookupTimeout. A follower may answer and lag its
// leader by a moment: a job taken for missing is sent again, and dropped as
// a duplicate by its id.
func (j *Jobs) stored(ctx context.Context, subject string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	j.mu.Lock()
	s := j.stream
	j.mu.Unlock()
	if s == nil {
		var err error
		if s, err = j.js.Stream(ctx, events.StreamSandbox); err != nil {
			return false, fmt.Errorf("stream %s: %w", events.StreamSandbox, err)
		}
		j.mu.Lock()
		j.stream = s
		j.mu.Unlock()
	}
	return publish.Stored(ctx, s, subject)
}

// Tool returns the Tool that runs a sandbox registry entry, or the error that
// explains why its implementation config cannot run.
func (j *Jobs) Tool(def *envelope.ToolDefinition) (toolapi.Tool, error) {
	cfg, err := events.ParseSandboxToolConfig(def)
	if err != nil {
		return nil, err
	}
	return &sandboxTool{jobs: j, def: *def, cfg: cfg}, nil
}

// sandboxTool runs the calls of one sandbox registry entry.
type sandboxTool struct {
	jobs *Jobs
	def  envelope.ToolDefinition
	cfg  events.SandboxToolConfig
}

func (t *sandboxTool) Definition() envelope.ToolDefinition { return t.def }

// answerMargin is the part of the call's time left that the job's timeout
// leaves to the sandbox service to stop the program and answer (its graceful
// stop, the kill and cleanup, the result's publication): a tenth, at least
// 200 ms, at most 3 s (its stop grace of 2 s and a second). The sandbox keeps
// the same margin before the job's deadline, the time the call stops waiting
// for its answer (services/sandbox answerMargin), so that a job that runs
// to its timeout is answered TIMEOUT with the limit it hit before the call's
// own timeout ends.
func answerMargin(left time.Duration) time.Duration {
	return min(max(left/10, 200*time.Millisecond), 3*time.Second)
}

// Preview is the code the call would run and the limits it would run
// under, not run: code runs only in the sandbox, so its dry run is what it
// is, shown to the operator.
func (t *sandboxTool) Preview(_ context.Context, input json.RawMessage, _ toolapi.Context) (json.RawMessage, error) {
	ref := t.def.Ref()
	p := struct {
		DryRun   bool            `json:"dry_run"`
		Language string          `json:"language"`
		Code     string          `json:"code"`
		Input    json.RawMessage `json:"input"`
		Runtime  string          `json:"runtime,omitempty"`
		Limits   any             `json:"limits"`
		TimeoutS float64         `json:"timeout_s"`
	}{DryRun: true, Language: t.cfg.Language, Code: t.cfg.Source, Input: input, Runtime: t.cfg.Runtime, Limits: t.cfg.Limits,
		TimeoutS: t.def.Timeout().Seconds()}
	if t.cfg.CodeFromInput {
		var in struct {
			Code  string          `json:"code"`
			Input json.RawMessage `json:"input"`
		}
		if err := json.Unmarshal(input, &in); err != nil || in.Code == "" {
			return nil, envelope.NewToolError(envelope.CodeValidation, "tool %s takes {\"code\": \"...\", \"input\": ...}", ref)
		}
		p.Code, p.Input = in.Code, in.Input
	}
	if len(bytes.TrimSpace(p.Input)) == 0 {
		p.Input = json.RawMessage("null")
	}
	return json.Marshal(p)
}

func (t *sandboxTool) Execute(ctx context.Context, input json.RawMessage, tc toolapi.Context) (json.RawMessage, error) {
	ref := t.def.Ref()
	job := events.SandboxJob{
		RunID: tc.RunID, CallID: tc.CallID, Tool: ref.String(), TenantID: tc.TenantID,
		Language: t.cfg.Language, Source: t.cfg.Source, Input: input,
		Stdout: events.SandboxStdoutJSON, Runtime: t.cfg.Runtime, Limits: t.cfg.Limits,
	}
	if t.cfg.CodeFromInput {
		var in struct {
			Code  string          `json:"code"`
			Input json.RawMessage `json:"input"`
		}
		if err := json.Unmarshal(input, &in); err != nil || in.Code == "" {
			return nil, envelope.NewToolError(envelope.CodeValidation, "tool %s takes {\"code\": \"...\", \"input\": ...}", ref)
		}
		job.Source, job.Input, job.Stdout = in.Code, in.Input, events.SandboxStdoutText
		if len(bytes.TrimSpace(job.Input)) == 0 {
			job.Input = json.RawMessage("null")
		}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(t.def.Timeout())
	}
	remaining := time.Until(deadline)
	timeout := remaining - answerMargin(remaining)
	if timeout < time.Millisecond {
		return nil, envelope.NewToolError(envelope.CodeTimeout, "tool %s had no time left to run", ref)
	}
	job.TimeoutMS = int(timeout.Milliseconds())
	// The deadline is when the wait below ends: the sandbox runs the job no
	// longer than that less its answer margin.
	job.Deadline = deadline
	out, err := events.NewSandboxJob(t.jobs.source, job, events.RunTrace{})
	if err != nil {
		return nil, envelope.NewToolError(envelope.CodeValidation, "tool %s: %v", ref, err)
	}
	subj, err := events.SandboxSubject(job.RunID, job.CallID, "completed")
	if err != nil {
		return nil, err
	}

	// DeliverLastPerSubject finds the result whether it is stored before the
	// consumer starts (a redelivered call whose job already ran, a quick job)
	// or after.
	var c jetstream.Consumer
	err = retryTransient(ctx, func() (err error) {
		c, err = t.jobs.js.OrderedConsumer(ctx, events.StreamSandbox, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{subj}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
			InactiveThreshold: 30 * time.Second,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox result consumer: %w", err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = t.jobs.js.DeleteConsumer(dctx, events.StreamSandbox, info.Name)
			cancel()
		}
	}()
	// The wait lasts until the answer comes or ctx ends, never less: a fetch
	// bounded by ctx (jetstream.FetchContext) would expire at nine tenths of
	// the time left, before the answer to a job that ran to its timeout.
	answers := make(chan jetstream.Msg, 1)
	cc, err := c.Consume(func(m jetstream.Msg) {
		select {
		case answers <- m:
		default: // one answer is all a job has
		}
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox result consumer: %w", err)
	}
	defer cc.Stop()
	// The job's id is its call's: a publish retried after a hiccup stores
	// one job.
	tool := ref.String()
	log := t.jobs.opts.Log.With("run_id", job.RunID, "call_id", job.CallID, "tool", tool)
	if err := retryTransient(ctx, func() error { return t.jobs.pub.Publish(ctx, out) }); err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			// Not the server's bare "maximum payload exceeded": what did
			// not fit, and that the caller can send less.
			return nil, envelope.NewToolError(envelope.CodeValidation,
				"the input of tool %s is too large for a sandbox job: its code (%d bytes) and input (%d bytes) make a job "+
					"larger than the %d bytes one message may carry", ref, len(job.Source), len(job.Input), t.jobs.js.Conn().MaxPayload())
		}
		count(t.jobs.opts.PublishFailures, tool)
		log.Error("the sandbox job could not be sent", "err", err)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sending the job to the sandbox: %w", context.Cause(ctx))
		}
		return nil, envelope.NewToolError(envelope.CodeSandboxError, "the job of tool %s could not be sent to the sandbox: %v", ref, err)
	}
	m, err := t.await(ctx, answers, out, log)
	if err != nil {
		return nil, err
	}
	e, err := events.Decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	if err != nil {
		return nil, fmt.Errorf("sandbox result: %w", err)
	}
	var res events.SandboxResult
	if err := events.DecodeData(e, &res); err != nil {
		return nil, fmt.Errorf("sandbox result: %w", err)
	}
	if err := res.Validate(); err != nil {
		return nil, fmt.Errorf("sandbox result: %w", err)
	}
	if res.Error != nil {
		return nil, res.Error
	}
	return res.Output, nil
}

// await waits for the job's answer until ctx ends. While none has come it
// reads the job back from the stream, after ConfirmAfter and then at doubling
// intervals, until it finds it; a job not found is sent again (out, the same
// event: a copy stored meanwhile makes it a duplicate). A call that ends
// while the last resend of its job failed is logged and counted as a job that
// could not be sent.
func (t *sandboxTool) await(ctx context.Context, answers <-chan jetstream.Msg, out events.Outgoing, log *slog.Logger) (jetstream.Msg, error) {
	tool := t.def.Ref().String()
	every := t.jobs.opts.ConfirmAfter
	check := time.NewTimer(every)
	defer check.Stop()
	unsent := false // the job was not found stored, and sending it again failed
	for {
		select {
		case m := <-answers:
			return m, nil
		case <-ctx.Done():
			if unsent {
				count(t.jobs.opts.PublishFailures, tool)
				log.Error("the sandbox job was not stored and could not be sent again; its call ends without an answer")
			}
			return nil, fmt.Errorf("waiting for the sandbox: %w", context.Cause(ctx))
		case <-check.C:
		}
		ok, err := t.jobs.stored(ctx, out.Subject)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				log.Warn("the sandbox job could not be looked up; looking again later", "err", err)
			}
		case ok:
			// The sandbox's consumer has it, and redelivers it if the
			// replica that runs it dies: no more looks.
			unsent = false
			continue
		default:
			count(t.jobs.opts.Resends, tool)
			log.Warn("the sandbox job is not stored; sending it again")
			err := t.jobs.pub.Publish(ctx, out)
			unsent = err != nil
			if err != nil && ctx.Err() == nil {
				log.Warn("the sandbox job could not be sent again; trying again later", "err", err)
			}
		}
		every = min(2*every, maxConfirmEvery)
		check.Reset(every)
	}
}

// retryTransient calls f again, with back-off, while it fails because NATS
// or JetStream did not answer (events.IsTransient), until ctx ends: a hiccup
// of the servers costs the call time, not its outcome. It returns f's last
// error, or ctx's cause when ctx ended meanwhile (which the executor reports
// as TIMEOUT when it is the tool's timeout).
func retryTransient(ctx context.Context, f func() error) error {
	backoff := 20 * time.Millisecond
	for {
		err := f()
		if err == nil || !consume.IsTransient(err) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (after: %w)", context.Cause(ctx), err)
		}
		backoff = min(2*backoff, time.Second)
	}
}

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
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// Jobs sends sandbox jobs on one JetStream connection.
type Jobs struct {
	js     jetstream.JetStream
	pub    *publish.Publisher
	source string
}

// NewJobs returns the sender of jobs whose events have the CloudEvents source
// source (the executor's).
func NewJobs(js jetstream.JetStream, pub *publish.Publisher, source string) *Jobs {
	return &Jobs{js: js, pub: pub, source: source}
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
	if err := retryTransient(ctx, func() error { return t.jobs.pub.Publish(ctx, out) }); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sending the job to the sandbox: %w", context.Cause(ctx))
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			// Not the server's bare "maximum payload exceeded": what did
			// not fit, and that the caller can send less.
			return nil, envelope.NewToolError(envelope.CodeValidation,
				"the input of tool %s is too large for a sandbox job: its code (%d bytes) and input (%d bytes) make a job "+
					"larger than the %d bytes one message may carry", ref, len(job.Source), len(job.Input), t.jobs.js.Conn().MaxPayload())
		}
		return nil, envelope.NewToolError(envelope.CodeSandboxError, "the job of tool %s could not be sent to the sandbox: %v", ref, err)
	}
	var m jetstream.Msg
	select {
	case m = <-answers:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the sandbox: %w", context.Cause(ctx))
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

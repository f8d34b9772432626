package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// The worker protocol (docs/tools.md, Workers). A worker runs its Go tools
// and nothing else: it holds no JetStream access. The executor consumes a
// worker queue's approved calls, runs them through its pipeline (registry,
// schemas, secrets, cache, rate limits, outcomes, scrubbing, events) and
// hands each call to the worker as a request on WorkerCallSubject; the
// worker answers with a WorkerResult. The worker registers its tools and
// announces itself with requests the executor answers, on
// WorkerRPCSubject. With identities on, each subject names the queue, and
// the server lets a worker's account reach only its own queues' subjects:
// the queue in a subject is who sent it.
const (
	// SubjectsWorkerRPC are the requests of every worker to the executors,
	// who answer them in the queue group QueueWorkerRPC.
	SubjectsWorkerRPC = Prefix + ".rpc.worker.*.*"
	// QueueWorkerRPC is the executors' queue group on SubjectsWorkerRPC.
	QueueWorkerRPC = "executor"
	// QueueWorkerCalls is the queue group of a queue's worker replicas.
	QueueWorkerCalls = "worker"
)

// The requests of WorkerRPCSubject.
const (
	WorkerRegister = "register" // data: WorkerRegistration
	WorkerBeat     = "beat"     // data: WorkerHeartbeat
	WorkerLeave    = "leave"    // data: WorkerHeartbeat (its instance)
)

// WorkerCallSubject is where the executor hands a queue's calls to its
// workers: toolwire.worker.<queue>.call.
func WorkerCallSubject(queue string) (string, error) { return workerSubject(queue, "call") }

// WorkerPreviewSubject is where the executor asks a queue's workers for a
// preview (toolapi's Previewer): toolwire.worker.<queue>.preview.
func WorkerPreviewSubject(queue string) (string, error) { return workerSubject(queue, "preview") }

// WorkerCancelSubject is where the executor tells every worker replica of
// a queue to stop a call it handed over, whose run was cancelled:
// toolwire.worker.<queue>.cancel (data: WorkerCancel). The replicas
// subscribe to it outside their queue group, since the executor does not
// know which one took the call; the server delivers it only to the queue's
// worker account, as the calls.
func WorkerCancelSubject(queue string) (string, error) { return workerSubject(queue, VerbWorkerCancel) }

// VerbWorkerCancel is the last token of WorkerCancelSubject.
const VerbWorkerCancel = "cancel"

// WorkerSubjects are the subjects a queue's workers answer on:
// toolwire.worker.<queue>.* .
func WorkerSubjects(queue string) (string, error) { return workerSubject(queue, "*") }

func workerSubject(queue, verb string) (string, error) {
	if err := envelope.ValidateQueue(queue); err != nil {
		return "", err
	}
	return Prefix + ".worker." + queue + "." + verb, nil
}

// WorkerRPCSubject is a worker's request to the executors about queue:
// toolwire.rpc.worker.<queue>.<verb>.
func WorkerRPCSubject(queue, verb string) (string, error) {
	if err := envelope.ValidateQueue(queue); err != nil {
		return "", err
	}
	switch verb {
	case WorkerRegister, WorkerBeat, WorkerLeave, "*", ">":
	default:
		return "", fmt.Errorf("worker request %q: want %s, %s or %s", verb, WorkerRegister, WorkerBeat, WorkerLeave)
	}
	return Prefix + ".rpc.worker." + queue + "." + verb, nil
}

// ErrWorkerSubject is wrapped when a subject is not a worker request's.
var ErrWorkerSubject = errors.New("not a worker request subject")

// ParseWorkerRPC returns the queue and the verb of a worker request's subject.
func ParseWorkerRPC(subject string) (queue, verb string, err error) {
	rest, ok := strings.CutPrefix(subject, Prefix+".rpc.worker.")
	queue, verb, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return "", "", fmt.Errorf("%w: %q", ErrWorkerSubject, subject)
	}
	if err := envelope.ValidateQueue(queue); err != nil {
		return "", "", fmt.Errorf("%w: %q: %w", ErrWorkerSubject, subject, err)
	}
	switch verb {
	case WorkerRegister, WorkerBeat, WorkerLeave:
		return queue, verb, nil
	}
	return "", "", fmt.Errorf("%w: %q: unknown request %q", ErrWorkerSubject, subject, verb)
}

// WorkerCall is one call the executor hands a worker: already approved,
// its input valid against the tool's input schema, its declared secrets
// resolved (the only secrets a worker ever sees).
type WorkerCall struct {
	Name      string            `json:"name"`
	Version   string            `json:"version"`
	Input     json.RawMessage   `json:"input"`
	TenantID  string            `json:"tenant_id"`
	RunID     string            `json:"run_id"`
	CallID    string            `json:"call_id"`
	Secrets   map[string]string `json:"secrets,omitempty"`
	TimeoutMS int64             `json:"timeout_ms"`
}

// Validate checks what a worker relies on.
func (c *WorkerCall) Validate() error {
	var errs []error
	if c.Name == "" || c.Version == "" {
		errs = append(errs, errors.New("worker call: name and version are required"))
	}
	if len(c.Input) == 0 || !json.Valid(c.Input) {
		errs = append(errs, errors.New("worker call: input must be JSON"))
	}
	if c.TimeoutMS <= 0 {
		errs = append(errs, errors.New("worker call: timeout_ms must be positive"))
	}
	errs = append(errs, ValidateRunID(c.RunID), ValidateCallID(c.CallID))
	return errors.Join(errs...)
}

// Timeout is the call's timeout.
func (c *WorkerCall) Timeout() time.Duration { return time.Duration(c.TimeoutMS) * time.Millisecond }

// WorkerCancel tells the workers of a queue to stop one call: the tool's
// context of the call run_id/call_id is cancelled, wherever it runs. The
// executor has answered the call already (a TIMEOUT envelope saying it was
// cut short, events.CancelledCallError); what the worker answers after it
// is not read.
type WorkerCancel struct {
	RunID  string `json:"run_id"`
	CallID string `json:"call_id"`
	// Reason is CancelRequest.Said: why the call was stopped.
	Reason string `json:"reason,omitempty"`
}

// Validate checks the ids and the reason's size.
func (c *WorkerCancel) Validate() error {
	var errs []error
	if len(c.Reason) > MaxCancelReason+MaxCancelBy+32 {
		errs = append(errs, fmt.Errorf("worker cancel: reason longer than %d bytes", MaxCancelReason+MaxCancelBy+32))
	}
	errs = append(errs, ValidateRunID(c.RunID), ValidateCallID(c.CallID))
	return errors.Join(errs...)
}

// WorkerResult is a worker's answer to a call or a preview: first, once a
// worker has taken the call, Accepted alone (who runs it: the executor
// watches that instance's heartbeat until the result comes); then the
// output, or the error the model sees.
type WorkerResult struct {
	Accepted *WorkerAccepted     `json:"accepted,omitempty"`
	Output   json.RawMessage     `json:"output,omitempty"`
	Error    *envelope.ToolError `json:"error,omitempty"`
}

// WorkerAccepted names the worker instance that took a call.
type WorkerAccepted struct {
	Instance string `json:"instance"`
	ID       string `json:"id"`
}

// MaxWorkerTimeout bounds the timeout of a worker's tool: the server keeps
// a call's way back to the executor for that long.
const MaxWorkerTimeout = time.Hour

// WorkerRegistration is a worker's tools on one queue.
type WorkerRegistration struct {
	Tools []envelope.ToolDefinition `json:"tools"`
}

// WorkerHeartbeat announces a worker instance on a queue; the executor
// keeps it in the workers bucket, which the Policy Guard reads.
type WorkerHeartbeat struct {
	Instance  string    `json:"instance"`
	ID        string    `json:"id"`
	Tools     []string  `json:"tools,omitempty"`
	StartedAt time.Time `json:"started_at"`
	TTLMS     int64     `json:"ttl_ms"`
}

// WorkerReply is the executors' answer to a worker request: empty when
// done, else the error and its code.
type WorkerReply struct {
	Error string          `json:"error,omitempty"`
	Code  WorkerReplyCode `json:"code,omitempty"`
}

// WorkerReplyCode says why a worker request was refused.
type WorkerReplyCode string

// The codes of a refused worker request.
const (
	// WorkerConflict: the registry holds a tool's version with another
	// definition; a registered version never changes.
	WorkerConflict WorkerReplyCode = "conflict"
	// WorkerForbidden: the request is about a queue, or a tool, the worker
	// may not have (a tool on another queue, the executor's own queue).
	WorkerForbidden WorkerReplyCode = "forbidden"
	// WorkerInvalid: the request is malformed.
	WorkerInvalid WorkerReplyCode = "invalid"
	// WorkerUnavailable: the executor could not do it now (the registry or
	// the workers bucket did not answer); retry.
	WorkerUnavailable WorkerReplyCode = "unavailable"
)

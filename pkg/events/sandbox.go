package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/envelope"
)

// Names of the JSON Schemas of the sandbox events' data.
const (
	SchemaSandboxJob    = "event_sandbox_job"
	SchemaSandboxResult = "event_sandbox_result"
)

// Sandbox languages, runtimes and stdout modes.
const (
	// SandboxPython runs the source with python3 inside the sandbox.
	SandboxPython = "python"

	// SandboxRuntimeGVisor is gVisor (runsc): the strongest isolation.
	SandboxRuntimeGVisor = "gvisor"
	// SandboxRuntimeBwrap is bubblewrap: namespaces, seccomp, rlimits, cgroups.
	SandboxRuntimeBwrap = "bwrap"
	// SandboxRuntimeInsecureDev runs the code without isolation; only with the
	// sandbox's explicit insecure development setting. A job never asks for it.
	SandboxRuntimeInsecureDev = "insecure-dev"

	// SandboxStdoutJSON: the program's stdout is its output, one JSON value.
	SandboxStdoutJSON = "json"
	// SandboxStdoutText: the output is {"stdout": ..., "stderr": ...}, for code
	// that prints text (python_exec).
	SandboxStdoutText = "text"
)

// SandboxMaxSourceBytes bounds the source of one job.
const SandboxMaxSourceBytes = 256 << 10

// SandboxLimits are the resource limits of one job. Zero fields take the
// sandbox service's defaults; a value above the service's maximum is lowered
// to it.
type SandboxLimits struct {
	// MemoryBytes bounds the address space (RLIMIT_AS) and, with cgroups, the
	// job's memory.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Processes bounds the processes and threads of the job (RLIMIT_NPROC and,
	// with cgroups, pids.max).
	Processes int `json:"processes,omitempty"`
	// CPUSeconds bounds the CPU time of each process (RLIMIT_CPU).
	CPUSeconds int `json:"cpu_seconds,omitempty"`
	// OpenFiles bounds the open file descriptors of each process (RLIMIT_NOFILE).
	OpenFiles int `json:"open_files,omitempty"`
	// FileSizeBytes bounds the size of one written file (RLIMIT_FSIZE).
	FileSizeBytes int64 `json:"file_size_bytes,omitempty"`
	// DiskBytes is the size of the job's tmpfs work directory.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// OutputBytes bounds the program's stdout.
	OutputBytes int64 `json:"output_bytes,omitempty"`
}

// Validate rejects negative limits.
func (l *SandboxLimits) Validate() error {
	if l == nil {
		return nil
	}
	if l.MemoryBytes < 0 || l.Processes < 0 || l.CPUSeconds < 0 || l.OpenFiles < 0 ||
		l.FileSizeBytes < 0 || l.DiskBytes < 0 || l.OutputBytes < 0 {
		return errors.New("sandbox limits must not be negative")
	}
	return nil
}

// SandboxToolConfig is the implementation config of a registry entry whose
// implementation kind is sandbox.
//
// A code tool carries its Source: the call's input goes to the program as
// JSON on stdin and the program prints its output as one JSON value on
// stdout. With CodeFromInput (python_exec) the call's input is
// {"code": ..., "input": ...}: the code is run with "input" as JSON on stdin,
// and the output is {"stdout": ..., "stderr": ...}.
type SandboxToolConfig struct {
	Language      string         `json:"language"`
	Source        string         `json:"source,omitempty"`
	CodeFromInput bool           `json:"code_from_input,omitempty"`
	Runtime       string         `json:"runtime,omitempty"`
	Limits        *SandboxLimits `json:"limits,omitempty"`
}

// Validate checks the config.
func (c *SandboxToolConfig) Validate() error {
	var problems []string
	if c.Language != SandboxPython {
		problems = append(problems, fmt.Sprintf("language %q is not supported (want %q)", c.Language, SandboxPython))
	}
	switch {
	case c.CodeFromInput && c.Source != "":
		problems = append(problems, "source and code_from_input exclude each other")
	case !c.CodeFromInput && strings.TrimSpace(c.Source) == "":
		problems = append(problems, "source is required (or code_from_input)")
	case len(c.Source) > SandboxMaxSourceBytes:
		problems = append(problems, fmt.Sprintf("source is %d bytes, more than %d", len(c.Source), SandboxMaxSourceBytes))
	}
	if err := validateSandboxRuntime(c.Runtime); err != nil {
		problems = append(problems, err.Error())
	}
	if err := c.Limits.Validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return fmt.Errorf("sandbox implementation config: %s", strings.Join(problems, "; "))
	}
	return nil
}

// ParseSandboxToolConfig decodes and checks the implementation config of a
// sandbox registry entry.
func ParseSandboxToolConfig(def *envelope.ToolDefinition) (SandboxToolConfig, error) {
	var c SandboxToolConfig
	if def.Implementation.Kind != envelope.ImplSandbox {
		return c, fmt.Errorf("tool %s: implementation kind %q is not sandbox", def.Ref(), def.Implementation.Kind)
	}
	dec := json.NewDecoder(bytes.NewReader(def.Implementation.Config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("tool %s: sandbox implementation config: %w", def.Ref(), err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("tool %s: %w", def.Ref(), err)
	}
	return c, nil
}

func validateSandboxRuntime(r string) error {
	switch r {
	case "", SandboxRuntimeGVisor, SandboxRuntimeBwrap:
		return nil
	}
	return fmt.Errorf("runtime %q is not one of %s, %s (or empty for the deployment's default)",
		r, SandboxRuntimeGVisor, SandboxRuntimeBwrap)
}

// SandboxJob asks the sandbox service to run code: the data of
// toolwire.sandbox.<run_id>.<call_id>.requested.
type SandboxJob struct {
	RunID    string `json:"run_id"`
	CallID   string `json:"call_id"`
	Tool     string `json:"tool"`      // name@version of the called tool
	TenantID string `json:"tenant_id"` // the tenant's id, as in the tenantid extension
	Language string `json:"language"`
	Source   string `json:"source"`
	// Input is given to the program as JSON on stdin.
	Input  json.RawMessage `json:"input"`
	Stdout string          `json:"stdout"` // SandboxStdoutJSON or SandboxStdoutText
	// Runtime asks for one runtime; "" takes the deployment's default.
	Runtime string `json:"runtime,omitempty"`
	// TimeoutMS bounds the run (TIMEOUT beyond it).
	TimeoutMS int `json:"timeout_ms"`
	// Deadline is when the caller stops waiting: a job not started by then is
	// answered TIMEOUT without running, and a run never outlasts it.
	Deadline time.Time      `json:"deadline"`
	Limits   *SandboxLimits `json:"limits,omitempty"`
}

// Timeout returns the job's timeout.
func (j *SandboxJob) Timeout() time.Duration { return time.Duration(j.TimeoutMS) * time.Millisecond }

// Validate checks the job.
func (j *SandboxJob) Validate() error {
	var problems []string
	if err := errors.Join(ValidateRunID(j.RunID), ValidateCallID(j.CallID)); err != nil {
		problems = append(problems, err.Error())
	}
	if _, err := envelope.ParseToolRef(j.Tool); err != nil {
		problems = append(problems, err.Error())
	}
	if strings.TrimSpace(j.TenantID) == "" {
		problems = append(problems, "tenant_id is required")
	}
	if j.Language != SandboxPython {
		problems = append(problems, fmt.Sprintf("language %q is not supported (want %q)", j.Language, SandboxPython))
	}
	if strings.TrimSpace(j.Source) == "" {
		problems = append(problems, "source is empty")
	}
	if len(j.Source) > SandboxMaxSourceBytes {
		problems = append(problems, fmt.Sprintf("source is %d bytes, more than %d", len(j.Source), SandboxMaxSourceBytes))
	}
	if len(j.Input) == 0 || !json.Valid(j.Input) {
		problems = append(problems, "input must be a JSON value")
	}
	if j.Stdout != SandboxStdoutJSON && j.Stdout != SandboxStdoutText {
		problems = append(problems, fmt.Sprintf("stdout %q is not %s or %s", j.Stdout, SandboxStdoutJSON, SandboxStdoutText))
	}
	if err := validateSandboxRuntime(j.Runtime); err != nil {
		problems = append(problems, err.Error())
	}
	if j.TimeoutMS <= 0 {
		problems = append(problems, "timeout_ms must be positive")
	}
	if j.Deadline.IsZero() {
		problems = append(problems, "deadline is required")
	}
	if err := j.Limits.Validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: sandbox job: %s", ErrInvalidEvent, strings.Join(problems, "; "))
	}
	return nil
}

// SandboxResult is the sandbox's answer: the data of
// toolwire.sandbox.<run_id>.<call_id>.completed. Exactly one of Output and
// Error is set; Error's code is SANDBOX_ERROR or TIMEOUT.
type SandboxResult struct {
	RunID  string              `json:"run_id"`
	CallID string              `json:"call_id"`
	Output json.RawMessage     `json:"output,omitempty"`
	Error  *envelope.ToolError `json:"error,omitempty"`
	// Runtime is the runtime that ran the code; "" when none did.
	Runtime  string `json:"runtime,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
	// Stderr is the program's stderr, at most its last few KiB: a diagnostic.
	Stderr          string `json:"stderr,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	DurationMS      int64  `json:"duration_ms"`
	Worker          string `json:"worker,omitempty"`
}

// Validate checks the result.
func (r *SandboxResult) Validate() error {
	var problems []string
	if err := errors.Join(ValidateRunID(r.RunID), ValidateCallID(r.CallID)); err != nil {
		problems = append(problems, err.Error())
	}
	hasOutput := len(r.Output) > 0 && string(r.Output) != "null"
	switch {
	case r.Error == nil && !hasOutput:
		problems = append(problems, "neither output nor error")
	case r.Error != nil && hasOutput:
		problems = append(problems, "both output and error")
	case r.Error != nil && r.Error.Code != envelope.CodeSandboxError && r.Error.Code != envelope.CodeTimeout:
		problems = append(problems, fmt.Sprintf("error code %q is not %s or %s", r.Error.Code, envelope.CodeSandboxError, envelope.CodeTimeout))
	case hasOutput && !json.Valid(r.Output):
		problems = append(problems, "output is not JSON")
	}
	if r.DurationMS < 0 {
		problems = append(problems, "duration_ms must not be negative")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: sandbox result: %s", ErrInvalidEvent, strings.Join(problems, "; "))
	}
	return nil
}

// NewSandboxJob builds a sandbox job event. Its id is
// "<run_id>/<call_id>/sandbox/requested": a call's job published twice is one
// job.
func NewSandboxJob(source string, j SandboxJob, trace RunTrace) (Outgoing, error) {
	if err := j.Validate(); err != nil {
		return Outgoing{}, err
	}
	return buildCall(TypeSandboxRequested, "sandbox", "requested",
		Attrs{Source: source, RunID: j.RunID, CallID: j.CallID, TenantID: j.TenantID, Trace: trace}, j)
}

// NewSandboxResult builds a sandbox result event. Its id is
// "<run_id>/<call_id>/sandbox/completed": a job has one result.
func NewSandboxResult(source string, r SandboxResult, tenantID string, trace RunTrace) (Outgoing, error) {
	if err := r.Validate(); err != nil {
		return Outgoing{}, err
	}
	return buildCall(TypeSandboxCompleted, "sandbox", "completed",
		Attrs{Source: source, RunID: r.RunID, CallID: r.CallID, TenantID: tenantID, Trace: trace}, r)
}

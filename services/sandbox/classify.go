package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// ErrorDetails are the details of a SANDBOX_ERROR or TIMEOUT the sandbox
// reports: which limit was hit, and what the program left behind.
type ErrorDetails struct {
	// Limit names the limit hit (memory, processes, cpu_time, wall_time,
	// open_files, disk, output); "" when the program failed by itself.
	Limit string `json:"limit,omitempty"`
	// LimitValue is the limit's value: bytes for memory, disk and output,
	// a count for processes and open files, seconds for cpu_time, milliseconds
	// for wall_time.
	LimitValue int64  `json:"limit_value,omitempty"`
	Runtime    string `json:"runtime,omitempty"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	Signal     string `json:"signal,omitempty"`
	// Stderr is the end of the program's stderr.
	Stderr string `json:"stderr,omitempty"`
	// Stdout is the start of the program's stdout, when it was not the JSON
	// a code tool must print.
	Stdout string `json:"stdout,omitempty"`
}

// outcome is what a finished job yields: its output or its error.
type outcome struct {
	output json.RawMessage
	err    *envelope.ToolError
}

// classify turns what happened to the job's process into the job's outcome.
//
// A limit the job was stopped at is reported as such: stdout past its cap
// (SANDBOX_ERROR, output), the timeout (TIMEOUT, wall_time). A program that
// failed is reported with the limit that made it fail, when one did: the
// cgroup's memory or pids limit, RLIMIT_CPU's SIGXCPU (TIMEOUT, cpu_time), or
// what the interpreter says in its last line (MemoryError under RLIMIT_AS,
// EAGAIN from fork under RLIMIT_NPROC, ENOSPC on the tmpfs, EFBIG under
// RLIMIT_FSIZE, EMFILE under RLIMIT_NOFILE). A program that exited 0 has
// succeeded, whatever it ran into and coped with.
func classify(mode, rt string, l Limits, timeout time.Duration, pr *procResult) outcome {
	d := ErrorDetails{Runtime: rt, Stderr: lastBytes(pr.Stderr, 2048)}
	fail := func(code envelope.ErrorCode, limit string, value int64, format string, args ...any) outcome {
		d.Limit, d.LimitValue = limit, value
		return outcome{err: envelope.NewToolError(code, format, args...).WithDetails(d)}
	}
	if pr.ExitCode >= 0 && !pr.TimedOut && !pr.OutputExceeded {
		code := pr.ExitCode
		d.ExitCode = &code
	}
	if pr.Signal != 0 {
		d.Signal = signalName(pr.Signal)
	}

	switch {
	case pr.OutputExceeded:
		return fail(envelope.CodeSandboxError, LimitOutput, l.OutputBytes,
			"output limit hit: the program wrote more than %d bytes to stdout", l.OutputBytes)
	case pr.TimedOut:
		return fail(envelope.CodeTimeout, LimitWallTime, timeout.Milliseconds(),
			"the program ran longer than its timeout of %s and was killed", timeout)
	}
	if pr.ExitCode == 0 && pr.Signal == 0 {
		return success(mode, d, pr)
	}

	switch {
	case pr.MemoryEvent:
		return fail(envelope.CodeSandboxError, LimitMemory, l.MemoryBytes,
			"memory limit hit: the job used more than its %d MiB and was killed", l.MemoryBytes>>20)
	case pr.PidsEvent:
		return fail(envelope.CodeSandboxError, LimitProcesses, int64(l.Processes),
			"process limit hit: the program tried to run more than %d processes or threads", l.Processes)
	case pr.Signal == syscall.SIGXCPU:
		return fail(envelope.CodeTimeout, LimitCPUTime, int64(l.CPUSeconds),
			"the program used more than its %d s of CPU time and was killed", l.CPUSeconds)
	}
	if limit := pythonLimit(pr.Stderr); limit != "" {
		switch limit {
		case LimitMemory:
			return fail(envelope.CodeSandboxError, LimitMemory, l.MemoryBytes,
				"memory limit hit: the program could not get more than its %d MiB", l.MemoryBytes>>20)
		case LimitProcesses:
			return fail(envelope.CodeSandboxError, LimitProcesses, int64(l.Processes),
				"process limit hit: the program could not start more than %d processes or threads", l.Processes)
		case LimitDisk:
			return fail(envelope.CodeSandboxError, LimitDisk, l.DiskBytes,
				"disk limit hit: the work directory holds at most %d MiB and a file at most %d MiB",
				l.DiskBytes>>20, l.FileSizeBytes>>20)
		case LimitOpenFiles:
			return fail(envelope.CodeSandboxError, LimitOpenFiles, int64(l.OpenFiles),
				"open files limit hit: the program may hold at most %d files open", l.OpenFiles)
		}
	}
	switch pr.Signal {
	case 0:
	case syscall.SIGSYS:
		// The bwrap filter's answer to a syscall through a foreign ABI.
		return fail(envelope.CodeSandboxError, "", 0,
			"the program was killed by SIGSYS: it made a system call through an ABI the sandbox refuses "+
				"(only the machine's native one is served: no i386 or x32 syscalls)")
	default:
		return fail(envelope.CodeSandboxError, "", 0, "the program was killed by %s", signalName(pr.Signal))
	}
	return fail(envelope.CodeSandboxError, "", 0, "the program exited with status %d%s", pr.ExitCode, lastLineHint(pr.Stderr))
}

// success builds the output of a program that exited 0.
func success(mode string, d ErrorDetails, pr *procResult) outcome {
	if mode == events.SandboxStdoutText {
		b, err := json.Marshal(map[string]string{
			"stdout": strings.ToValidUTF8(string(pr.Stdout), "\uFFFD"),
			"stderr": strings.ToValidUTF8(string(pr.Stderr), "\uFFFD"),
		})
		if err != nil {
			return outcome{err: envelope.NewToolError(envelope.CodeSandboxError, "encode the output: %v", err)}
		}
		return outcome{output: b}
	}
	out := bytes.TrimSpace(pr.Stdout)
	if len(out) == 0 {
		return outcome{err: envelope.NewToolError(envelope.CodeSandboxError,
			"the program printed nothing: a code tool prints its output as one JSON value on stdout").WithDetails(d)}
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil || dec.More() {
		d.Stdout = firstBytes(out, 512)
		return outcome{err: envelope.NewToolError(envelope.CodeSandboxError,
			"the program's stdout is not one JSON value: a code tool prints its output as JSON on stdout").WithDetails(d)}
	}
	return outcome{output: v}
}

// pythonLimit reads the limit an uncaught Python exception names in the last
// lines of stderr ("MemoryError", "BlockingIOError: [Errno 11] ...", ...), or
// "". Several processes may have failed at once and interleaved their
// tracebacks, so the last few exception lines are read, newest first.
func pythonLimit(stderr []byte) string {
	lines := strings.Split(strings.TrimRight(string(stderr), " \t\r\n"), "\n")
	for i := len(lines) - 1; i >= 0 && i >= len(lines)-20; i-- {
		if l := exceptionLimit(strings.TrimSpace(lines[i])); l != "" {
			return l
		}
	}
	return ""
}

// exceptionLimit maps one traceback's exception line to the limit it shows.
func exceptionLimit(line string) string {
	switch {
	case line == "MemoryError" || strings.HasPrefix(line, "MemoryError:") ||
		strings.HasSuffix(line, "Error: [Errno 12] Cannot allocate memory"):
		return LimitMemory
	case strings.HasPrefix(line, "BlockingIOError: [Errno 11] Resource temporarily unavailable") ||
		strings.HasPrefix(line, "RuntimeError: can't start new thread"):
		return LimitProcesses
	case strings.HasPrefix(line, "OSError: [Errno 28] No space left on device") ||
		strings.HasPrefix(line, "OSError: [Errno 27] File too large"):
		return LimitDisk
	case strings.HasPrefix(line, "OSError: [Errno 24] Too many open files"):
		return LimitOpenFiles
	}
	return ""
}

func lastLine(b []byte) string {
	b = bytes.TrimRight(b, " \t\r\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return strings.TrimSpace(string(b))
}

func lastLineHint(stderr []byte) string {
	if l := lastLine(stderr); l != "" {
		return ": " + firstBytes([]byte(l), 300)
	}
	return ""
}

// lastBytes returns the end of b, at most n bytes, cut at a rune boundary.
func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// firstBytes returns the start of b, at most n bytes.
func firstBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGXCPU:
		return "SIGXCPU"
	case syscall.SIGXFSZ:
		return "SIGXFSZ"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGSYS:
		return "SIGSYS"
	}
	return fmt.Sprintf("signal %d", int(s))
}

package sandbox

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service/servicetest"
)

func TestConfigFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

	c, err := ConfigFromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, RuntimeAuto, c.Runtime)
	require.False(t, c.InsecureDev)
	require.Equal(t, DefaultConcurrency, c.Concurrency)
	require.Equal(t, DefaultLimits(), c.Limits)
	require.Equal(t, DefaultPython, c.Python)
	require.Equal(t, DefaultAckWait, c.AckWait)

	c, err = ConfigFromEnv(env(map[string]string{
		EnvRuntime: "bwrap", EnvInsecureDev: "1", EnvConcurrency: "8", EnvMemoryMB: "512", EnvProcesses: "10",
		EnvCPUSeconds: "5", EnvOpenFiles: "32", EnvFileSizeMB: "2", EnvDiskMB: "64", EnvOutputKB: "256", EnvStderrKB: "4",
		EnvPlatform: "systrap", EnvUIDBase: "500000", EnvCgroups: "off", EnvAckWait: "2s",
	}))
	require.NoError(t, err)
	require.Equal(t, RuntimeBwrap, c.Runtime)
	require.True(t, c.InsecureDev)
	require.Equal(t, 8, c.Concurrency)
	require.Equal(t, Limits{MemoryBytes: 512 << 20, Processes: 10, CPUSeconds: 5, OpenFiles: 32, FileSizeBytes: 2 << 20,
		DiskBytes: 64 << 20, OutputBytes: 256 << 10, StderrBytes: 4 << 10}, c.Limits)
	require.Equal(t, "systrap", c.Platform)
	require.Equal(t, 500000, c.UIDBase)
	require.Equal(t, "off", c.Cgroups)
	require.Equal(t, 2*time.Second, c.AckWait)

	for _, bad := range []struct {
		env map[string]string
		msg string
	}{
		{map[string]string{EnvRuntime: "docker"}, EnvRuntime + `="docker": want one of auto, gvisor, bwrap`},
		{map[string]string{EnvInsecureDev: "maybe"}, EnvInsecureDev + `="maybe": want 1 or 0`},
		{map[string]string{EnvConcurrency: "0"}, EnvConcurrency + `="0": want a whole number from 1 to 256`},
		{map[string]string{EnvMemoryMB: "8"}, EnvMemoryMB + `="8"`},
		{map[string]string{EnvProcesses: "lots"}, EnvProcesses + `="lots"`},
		{map[string]string{EnvPython: "python3"}, EnvPython + `="python3": want an absolute path inside the sandbox`},
		{map[string]string{EnvPlatform: "firecracker"}, EnvPlatform + `="firecracker": want one of ptrace, systrap, kvm`},
		{map[string]string{EnvStateDir: "state"}, EnvStateDir + `="state": want an absolute path`},
		{map[string]string{EnvCgroups: "v1"}, EnvCgroups + `="v1": want one of auto, off`},
		{map[string]string{EnvUIDBase: "10"}, EnvUIDBase + `="10"`},
		{map[string]string{EnvAckWait: "5"}, EnvAckWait + `="5": want a duration from 1s to 10m0s`},
		{map[string]string{EnvAckWait: "500ms"}, EnvAckWait + `="500ms": want a duration from 1s to 10m0s`},
		{map[string]string{EnvAckWait: "1h"}, EnvAckWait + `="1h": want a duration from 1s to 10m0s`},
		{map[string]string{EnvAckWait: "-5s"}, EnvAckWait + `="-5s"`},
	} {
		_, err := ConfigFromEnv(env(bad.env))
		require.ErrorContains(t, err, bad.msg)
	}
	// Every bad value at once.
	_, err = ConfigFromEnv(env(map[string]string{EnvConcurrency: "x", EnvDiskMB: "-1"}))
	require.ErrorContains(t, err, EnvConcurrency)
	require.ErrorContains(t, err, EnvDiskMB)
	require.Len(t, EnvVars(), 20)
}

// TestConfigValidate: a Config built in code (stack.Options, tests) is
// checked by New as the environment's is by ConfigFromEnv.
func TestConfigValidate(t *testing.T) {
	require.NoError(t, Config{}.Validate())
	for _, bad := range []struct {
		cfg Config
		msg string
	}{
		{Config{Runtime: "docker"}, `runtime "docker": want one of auto, gvisor, bwrap`},
		{Config{Python: "python3"}, `python "python3": want an absolute path inside the sandbox`},
		{Config{Platform: "firecracker"}, `runsc platform "firecracker": want one of ptrace, systrap, kvm`},
		{Config{StateDir: "state"}, `state dir "state": want an absolute path`},
		{Config{Cgroups: "v1"}, `cgroups "v1": want one of auto, off`},
		{Config{UIDBase: 10}, `uid base 10: want 1000 to 2147483392`},
		{Config{Concurrency: 1000}, `concurrency 1000: want 1 to 256`},
		{Config{Limits: Limits{MemoryBytes: 1 << 20}}, `memory limit 1048576 bytes: want at least 16 MiB`},
		{Config{AckWait: 100 * time.Millisecond}, `ack wait 100ms: want 1s to 10m0s`},
		{Config{AckWait: -time.Second}, `ack wait -1s: want 1s to 10m0s`},
		{Config{AckWait: time.Hour}, `ack wait 1h0m0s: want 1s to 10m0s`},
	} {
		require.ErrorContains(t, bad.cfg.Validate(), bad.msg)
	}
}

// TestEnvVars: every variable EnvVars documents is read by ConfigFromEnv,
// and its example is accepted and changes the configuration.
func TestEnvVars(t *testing.T) {
	servicetest.VarsTakeEffect(t, EnvVars(), ConfigFromEnv)
}

func TestLimitsForJob(t *testing.T) {
	d := DefaultLimits()
	require.Equal(t, d, d.forJob(nil))
	got := d.forJob(&events.SandboxLimits{MemoryBytes: 64 << 20, Processes: 1 << 20, CPUSeconds: 2, DiskBytes: 1, OutputBytes: 100, FileSizeBytes: 10})
	require.Equal(t, int64(64<<20), got.MemoryBytes, "lowered")
	require.Equal(t, d.Processes, got.Processes, "never raised")
	require.Equal(t, 2, got.CPUSeconds)
	require.Equal(t, int64(1<<20), got.DiskBytes, "not below the floor")
	require.Equal(t, int64(minFileSize), got.FileSizeBytes, "not below the floor")
	require.Equal(t, int64(100), got.OutputBytes)
	require.NoError(t, got.validate())
	require.Error(t, Limits{}.validate())
}

// TestClassify covers how a finished process becomes a result, including the
// cases the escape suite cannot make happen on demand.
func TestClassify(t *testing.T) {
	l := DefaultLimits()
	cases := []struct {
		name  string
		mode  string
		pr    procResult
		code  envelope.ErrorCode // "" for success
		limit string
		msg   string
		out   string
	}{
		{name: "ok", pr: procResult{Stdout: []byte(`{"a":1}` + "\n")}, out: `{"a":1}`},
		{name: "ok despite a pids event", pr: procResult{Stdout: []byte(`1`), PidsEvent: true}, out: `1`},
		{name: "output beats everything", pr: procResult{OutputExceeded: true, TimedOut: true, MemoryEvent: true, ExitCode: -1, Signal: syscall.SIGKILL},
			code: envelope.CodeSandboxError, limit: LimitOutput, msg: "output limit hit"},
		{name: "timeout", pr: procResult{TimedOut: true, ExitCode: -1, Signal: syscall.SIGKILL},
			code: envelope.CodeTimeout, limit: LimitWallTime, msg: "longer than its timeout of 3s"},
		{name: "oom kill", pr: procResult{MemoryEvent: true, ExitCode: -1, Signal: syscall.SIGKILL},
			code: envelope.CodeSandboxError, limit: LimitMemory, msg: "memory limit hit"},
		{name: "pids", pr: procResult{PidsEvent: true, ExitCode: 1},
			code: envelope.CodeSandboxError, limit: LimitProcesses, msg: "process limit hit"},
		{name: "sigxcpu", pr: procResult{ExitCode: -1, Signal: syscall.SIGXCPU},
			code: envelope.CodeTimeout, limit: LimitCPUTime, msg: "CPU time"},
		{name: "sigsys", pr: procResult{ExitCode: -1, Signal: syscall.SIGSYS},
			code: envelope.CodeSandboxError, msg: "through an ABI the sandbox refuses"},
		{name: "interleaved tracebacks", pr: procResult{ExitCode: 1, Stderr: []byte(
			"Traceback (most recent call last):\nTraceback (most recent call last):\n  File \"/job/main.py\", line 3, in <module>\n" +
				"BlockingIOError: [Errno 11] Resource temporarily unavailable\n  File \"/job/main.py\", line 3, in <module>\n")},
			code: envelope.CodeSandboxError, limit: LimitProcesses},
		{name: "MemoryError", pr: procResult{ExitCode: 1, Stderr: []byte("Traceback...\nMemoryError\n")},
			code: envelope.CodeSandboxError, limit: LimitMemory},
		{name: "ENOSPC", pr: procResult{ExitCode: 1, Stderr: []byte("OSError: [Errno 28] No space left on device\n")},
			code: envelope.CodeSandboxError, limit: LimitDisk},
		{name: "EMFILE", pr: procResult{ExitCode: 1, Stderr: []byte("OSError: [Errno 24] Too many open files: 'x'\n")},
			code: envelope.CodeSandboxError, limit: LimitOpenFiles},
		{name: "a message that only mentions a limit", pr: procResult{ExitCode: 1, Stderr: []byte("ValueError: expected MemoryError\n")},
			code: envelope.CodeSandboxError, msg: "exited with status 1: ValueError: expected MemoryError"},
		{name: "exit 0 with a MemoryError printed", pr: procResult{Stdout: []byte(`2`), Stderr: []byte("MemoryError\n")}, out: `2`},
		{name: "text mode keeps invalid UTF-8 readable", mode: events.SandboxStdoutText, pr: procResult{Stdout: []byte("a\xffb")},
			out: `{"stdout":"a\ufffdb","stderr":""}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mode := c.mode
			if mode == "" {
				mode = events.SandboxStdoutJSON
			}
			o := classify(mode, RuntimeBwrap, l, 3*time.Second, &c.pr)
			if c.code == "" {
				require.Nil(t, o.err)
				require.JSONEq(t, c.out, string(o.output))
				return
			}
			require.NotNil(t, o.err)
			require.Equal(t, c.code, o.err.Code)
			require.Contains(t, o.err.Message, c.msg)
			d, ok := o.err.Details.(ErrorDetails)
			require.True(t, ok)
			require.Equal(t, c.limit, d.Limit)
			require.Equal(t, RuntimeBwrap, d.Runtime)
		})
	}
}

func TestPythonExecDefinition(t *testing.T) {
	def := PythonExecDefinition()
	require.NoError(t, def.Validate())
	cfg, err := events.ParseSandboxToolConfig(&def)
	require.NoError(t, err)
	require.True(t, cfg.CodeFromInput)
	require.Equal(t, envelope.SideEffectsNone, def.Metadata.SideEffects)
	require.Equal(t, envelope.CategoryCode, def.Metadata.Category)

	in, err := envelope.CompileToolSchema("mem://python_exec/input", def.InputSchema)
	require.NoError(t, err)
	require.NoError(t, envelope.ValidateAgainst("in", in, []byte(`{"code":"print(1)","input":{"a":[1]}}`)))
	require.Error(t, envelope.ValidateAgainst("in", in, []byte(`{"input":1}`)))
	require.Error(t, envelope.ValidateAgainst("in", in, []byte(`{"code":"x","shell":true}`)))
	out, err := envelope.CompileToolSchema("mem://python_exec/output", def.OutputSchema)
	require.NoError(t, err)
	require.NoError(t, envelope.ValidateAgainst("out", out, []byte(`{"stdout":"1\n","stderr":""}`)))
}

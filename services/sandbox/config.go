package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolwire/toolwire/pkg/events"
	"github.com/toolwire/toolwire/pkg/service"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvRuntime     = "TOOLWIRE_SANDBOX_RUNTIME"      // auto (default), gvisor or bwrap
	EnvInsecureDev = "TOOLWIRE_SANDBOX_INSECURE_DEV" // 1: run code WITHOUT isolation when no runtime works
	EnvConcurrency = "TOOLWIRE_SANDBOX_CONCURRENCY"  // jobs at once per replica
	EnvID          = "TOOLWIRE_SANDBOX_ID"           // replica id in results; default hostname-pid
	EnvPython      = "TOOLWIRE_SANDBOX_PYTHON"       // python3 inside the sandbox
	EnvBwrap       = "TOOLWIRE_SANDBOX_BWRAP"        // bwrap binary; default found in the system's bin directories
	EnvRunsc       = "TOOLWIRE_SANDBOX_RUNSC"        // runsc binary; default found in the system's bin directories
	EnvPlatform    = "TOOLWIRE_SANDBOX_RUNSC_PLATFORM"
	EnvStateDir    = "TOOLWIRE_SANDBOX_STATE_DIR" // bundles and runsc state
	EnvUIDBase     = "TOOLWIRE_SANDBOX_UID_BASE"  // first host uid of the job slots (as root)
	EnvCgroups     = "TOOLWIRE_SANDBOX_CGROUPS"   // auto (default) or off
	EnvMemoryMB    = "TOOLWIRE_SANDBOX_MEMORY_MB"
	EnvProcesses   = "TOOLWIRE_SANDBOX_PROCESSES"
	EnvCPUSeconds  = "TOOLWIRE_SANDBOX_CPU_SECONDS"
	EnvOpenFiles   = "TOOLWIRE_SANDBOX_OPEN_FILES"
	EnvFileSizeMB  = "TOOLWIRE_SANDBOX_FILE_SIZE_MB"
	EnvDiskMB      = "TOOLWIRE_SANDBOX_DISK_MB"
	EnvOutputKB    = "TOOLWIRE_SANDBOX_OUTPUT_KB"
	EnvStderrKB    = "TOOLWIRE_SANDBOX_STDERR_KB"
	EnvAckWait     = "TOOLWIRE_SANDBOX_ACK_WAIT" // how soon a job of a replica that died goes to another
)

// Runtime choices of Config.Runtime.
const (
	RuntimeAuto   = "auto" // gvisor where it works, else bwrap
	RuntimeGVisor = events.SandboxRuntimeGVisor
	RuntimeBwrap  = events.SandboxRuntimeBwrap
)

// Defaults of Config.
const (
	DefaultSource      = "/toolwire/sandbox"
	DefaultConcurrency = 4
	DefaultPython      = "/usr/bin/python3"
	DefaultPlatform    = "ptrace"
	// DefaultUIDBase is far above login users and the usual subordinate-id
	// ranges (100000-165535 for the first user).
	DefaultUIDBase = 3_000_000
	maxConcurrency = 256
	minUIDBase     = 1000
	maxUIDBase     = 1<<31 - maxConcurrency
	maxIDLen       = 128
	// DefaultAckWait is the job consumer's ack wait: how long a job stays
	// with a replica that stopped extending it (one that died in the
	// middle of it) before another replica gets it. A replica alive
	// extends the jobs it runs every third of it (pkg/jetstream/consume,
	// keepAliveLoop), so a long job is not redelivered in normal running;
	// a short one gives a job caught in a crash a fresh attempt while its
	// call still waits (a tool's timeout is 30 s by default).
	DefaultAckWait = 5 * time.Second
	minAckWait     = time.Second
	maxAckWait     = 10 * time.Minute
)

// The values Config.Runtime, Config.Platform and Config.Cgroups accept.
var (
	runtimes    = []string{RuntimeAuto, RuntimeGVisor, RuntimeBwrap}
	platforms   = []string{"ptrace", "systrap", "kvm"}
	cgroupModes = []string{"auto", "off"}
)

// What a path setting wants.
const (
	wantAbsolute = "want an absolute path"
	wantPython   = "want an absolute path inside the sandbox"
)

// DefaultLimits are the limits of a job when the deployment sets none.
func DefaultLimits() Limits {
	return Limits{
		MemoryBytes:   256 << 20,
		Processes:     64,
		CPUSeconds:    60,
		OpenFiles:     64,
		FileSizeBytes: 16 << 20,
		DiskBytes:     32 << 20,
		OutputBytes:   1 << 20,
		StderrBytes:   8 << 10,
	}
}

// Config configures the sandbox service.
type Config struct {
	// Runtime is the deployment's runtime: auto, gvisor or bwrap. A tool may
	// ask for another runtime that works here.
	Runtime string
	// InsecureDev runs code without any isolation when no runtime works. For
	// development machines only: the code can read and change everything the
	// service can.
	InsecureDev bool
	Concurrency int
	Source      string // CloudEvents source of the results
	ID          string // replica id in results
	Python      string // python3 path inside the sandbox (the host's /usr is mounted read-only)
	Bwrap       string // "" looks for bwrap in /usr/bin, /usr/sbin, /usr/local/bin and /bin (never PATH)
	Runsc       string // "" looks for runsc there too
	Platform    string // runsc --platform: ptrace (default), systrap or kvm
	StateDir    string // runsc bundles and state; default <tmp>/toolwire-sandbox
	// UIDBase is the host uid of the first job slot: slot i runs as
	// UIDBase+i, so that a job's processes are counted (RLIMIT_NPROC) and
	// found (the sweep at its end) apart from every other job's. Used only
	// when the service runs as root.
	UIDBase int
	// Cgroups: "auto" uses a cgroup per job where it can (v2, else v1),
	// "off" never does (rlimits only).
	Cgroups string
	// Limits are the deployment's limits: every job's default, and the most
	// a tool can ask for.
	Limits Limits
	// AckWait is the job consumer's ack wait (DefaultAckWait), shared by
	// every replica: the last one started sets it. From 1s to 10m.
	AckWait time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Runtime = cmp.Or(c.Runtime, RuntimeAuto)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.Source = cmp.Or(c.Source, DefaultSource)
	if c.ID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "sandbox"
		}
		c.ID = host + "-" + strconv.Itoa(os.Getpid())
	}
	c.Python = cmp.Or(c.Python, DefaultPython)
	c.Platform = cmp.Or(c.Platform, DefaultPlatform)
	c.StateDir = cmp.Or(c.StateDir, filepath.Join(os.TempDir(), "toolwire-sandbox"))
	c.UIDBase = cmp.Or(c.UIDBase, DefaultUIDBase)
	c.Cgroups = cmp.Or(c.Cgroups, "auto")
	c.Limits = c.Limits.orDefaults(DefaultLimits())
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	return c
}

// Validate checks the configuration; zero fields mean their defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if !slices.Contains(runtimes, c.Runtime) {
		errs = append(errs, fmt.Errorf("runtime %q: want one of %s", c.Runtime, strings.Join(runtimes, ", ")))
	}
	if c.Concurrency < 1 || c.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d: want 1 to %d", c.Concurrency, maxConcurrency))
	}
	if !filepath.IsAbs(c.Python) {
		errs = append(errs, fmt.Errorf("python %q: %s", c.Python, wantPython))
	}
	if !slices.Contains(platforms, c.Platform) {
		errs = append(errs, fmt.Errorf("runsc platform %q: want one of %s", c.Platform, strings.Join(platforms, ", ")))
	}
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state dir %q: %s", c.StateDir, wantAbsolute))
	}
	if c.UIDBase < minUIDBase || c.UIDBase > maxUIDBase {
		errs = append(errs, fmt.Errorf("uid base %d: want %d to %d", c.UIDBase, minUIDBase, maxUIDBase))
	}
	if !slices.Contains(cgroupModes, c.Cgroups) {
		errs = append(errs, fmt.Errorf("cgroups %q: want one of %s", c.Cgroups, strings.Join(cgroupModes, ", ")))
	}
	if c.AckWait < minAckWait || c.AckWait > maxAckWait {
		errs = append(errs, fmt.Errorf("ack wait %s: want %s to %s", c.AckWait, minAckWait, maxAckWait))
	}
	if err := c.Limits.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment; unset
// variables take their defaults. Every bad value is reported at once, by the
// variable's name.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	e := service.NewEnv(getenv)
	e.Enum(EnvRuntime, runtimes, &c.Runtime)
	e.Bool(EnvInsecureDev, &c.InsecureDev)
	e.Int(EnvConcurrency, 1, maxConcurrency, &c.Concurrency)
	e.Text(EnvID, maxIDLen, &c.ID)
	absolute(e, EnvPython, wantPython, &c.Python)
	// A runtime's binary is checked where it is used: one that is not
	// there leaves that runtime out, with the reason, not the service.
	e.String(EnvBwrap, &c.Bwrap)
	e.String(EnvRunsc, &c.Runsc)
	e.Enum(EnvPlatform, platforms, &c.Platform)
	absolute(e, EnvStateDir, wantAbsolute, &c.StateDir)
	e.Int(EnvUIDBase, minUIDBase, maxUIDBase, &c.UIDBase)
	e.Enum(EnvCgroups, cgroupModes, &c.Cgroups)
	e.Duration(EnvAckWait, minAckWait, maxAckWait, &c.AckWait)
	l := &c.Limits
	e.Scaled(EnvMemoryMB, 16, 1<<20, 1<<20, &l.MemoryBytes)
	e.Int(EnvProcesses, 4, 1<<16, &l.Processes)
	e.Int(EnvCPUSeconds, 1, 86400, &l.CPUSeconds)
	e.Int(EnvOpenFiles, 16, 1<<20, &l.OpenFiles)
	e.Scaled(EnvFileSizeMB, 1, 1<<20, 1<<20, &l.FileSizeBytes)
	e.Scaled(EnvDiskMB, 1, 1<<20, 1<<20, &l.DiskBytes)
	e.Scaled(EnvOutputKB, 1, 1<<20, 1<<10, &l.OutputBytes)
	e.Int(EnvStderrKB, 1, 1<<10, &l.StderrBytes)
	l.StderrBytes <<= 10 // counted in KiB; an int, where Scaled sets an int64
	return c.WithDefaults(), e.Err()
}

// absolute sets dst to the variable's value, an absolute path.
func absolute(e *service.Env, name, want string, dst *string) {
	if v, ok := e.Lookup(name); ok && !filepath.IsAbs(v) {
		e.Fail(name, v, want)
		return
	}
	e.String(name, dst)
}

// EnvVars documents the variables ConfigFromEnv reads, besides the common
// ones of every service (service.CommonEnvVars).
func EnvVars() []service.Var {
	return []service.Var{
		{Name: EnvRuntime, Help: "runtime of the jobs that name none: auto (gvisor where it works, else bwrap), gvisor or bwrap", Example: "bwrap"},
		{Name: EnvInsecureDev, Help: "1: with no runtime working, run code WITHOUT ISOLATION (development machines only; default 0)", Example: "1"},
		{Name: EnvConcurrency, Help: "jobs at once per replica, one job uid each (default 4)", Example: "8"},
		{Name: EnvID, Help: "the replica's id in results (default <hostname>-<pid>)", Example: "sandbox-1"},
		{Name: EnvPython, Help: "python3's path inside the sandbox (default /usr/bin/python3)", Example: "/usr/local/bin/python3"},
		{Name: EnvBwrap, Help: "the bwrap binary (default: found in /usr/bin, /usr/sbin, /usr/local/bin, /bin)", Example: "/opt/bwrap/bin/bwrap"},
		{Name: EnvRunsc, Help: "the runsc binary (default: found in /usr/bin, /usr/sbin, /usr/local/bin, /bin)", Example: "/opt/gvisor/bin/runsc"},
		{Name: EnvPlatform, Help: "runsc --platform: ptrace (default), systrap or kvm", Example: "systrap"},
		{Name: EnvStateDir, Help: "runsc's state and the jobs' bundles (default $TMPDIR/toolwire-sandbox)", Example: "/var/lib/toolwire-sandbox"},
		{Name: EnvUIDBase, Help: "the first host uid of the job slots, when the service runs as root (default 3000000)", Example: "4000000"},
		{Name: EnvCgroups, Help: "auto (default): a cgroup per job where the host allows; off: rlimits only", Example: "off"},
		{Name: EnvMemoryMB, Help: "memory of a job in MiB: every job's default and maximum (default 256)", Example: "512"},
		{Name: EnvProcesses, Help: "processes and threads of a job (default 64)", Example: "128"},
		{Name: EnvCPUSeconds, Help: "CPU seconds of each process of a job (default 60)", Example: "30"},
		{Name: EnvOpenFiles, Help: "open files of a job (default 64)", Example: "256"},
		{Name: EnvFileSizeMB, Help: "largest file a job writes, in MiB (default 16)", Example: "8"},
		{Name: EnvDiskMB, Help: "size of a job's work directory in MiB (default 32)", Example: "64"},
		{Name: EnvOutputKB, Help: "stdout of a job in KiB; more kills it (default 1024)", Example: "256"},
		{Name: EnvStderrKB, Help: "the end of stderr kept as a diagnostic, in KiB (default 8)", Example: "16"},
		{Name: EnvAckWait, Help: "how long a job stays with a replica that died in the middle of it before another runs it again, while its call still waits; live replicas extend the jobs they run (1s to 10m, default 5s)", Example: "3s"},
	}
}

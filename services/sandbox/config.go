package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/toolwire/toolwire/pkg/events"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvRuntime     = "TOOLWIRE_SANDBOX_RUNTIME"      // auto (default), gvisor or bwrap
	EnvInsecureDev = "TOOLWIRE_SANDBOX_INSECURE_DEV" // 1: run code WITHOUT isolation when no runtime works
	EnvConcurrency = "TOOLWIRE_SANDBOX_CONCURRENCY"  // jobs at once per replica
	EnvID          = "TOOLWIRE_SANDBOX_ID"           // replica id in results; default hostname-pid
	EnvPython      = "TOOLWIRE_SANDBOX_PYTHON"       // python3 inside the sandbox
	EnvBwrap       = "TOOLWIRE_SANDBOX_BWRAP"        // bwrap binary; default from PATH
	EnvRunsc       = "TOOLWIRE_SANDBOX_RUNSC"        // runsc binary; default from PATH
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
	Bwrap       string // "" looks bwrap up in PATH
	Runsc       string // "" looks runsc up in PATH
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
}

// EnvVars lists the environment variables ConfigFromEnv reads.
func EnvVars() []string {
	return []string{EnvRuntime, EnvInsecureDev, EnvConcurrency, EnvID, EnvPython, EnvBwrap, EnvRunsc,
		EnvPlatform, EnvStateDir, EnvUIDBase, EnvCgroups, EnvMemoryMB, EnvProcesses, EnvCPUSeconds,
		EnvOpenFiles, EnvFileSizeMB, EnvDiskMB, EnvOutputKB, EnvStderrKB}
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

func (c Config) withDefaults() Config {
	if c.Runtime == "" {
		c.Runtime = RuntimeAuto
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Source == "" {
		c.Source = DefaultSource
	}
	if c.ID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "sandbox"
		}
		c.ID = host + "-" + strconv.Itoa(os.Getpid())
	}
	if c.Python == "" {
		c.Python = DefaultPython
	}
	if c.Platform == "" {
		c.Platform = DefaultPlatform
	}
	if c.StateDir == "" {
		c.StateDir = filepath.Join(os.TempDir(), "toolwire-sandbox")
	}
	if c.UIDBase == 0 {
		c.UIDBase = DefaultUIDBase
	}
	if c.Cgroups == "" {
		c.Cgroups = "auto"
	}
	c.Limits = c.Limits.orDefaults(DefaultLimits())
	return c
}

// Validate checks the configuration; zero fields mean their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	switch c.Runtime {
	case RuntimeAuto, RuntimeGVisor, RuntimeBwrap:
	default:
		errs = append(errs, fmt.Errorf("runtime %q: want auto, gvisor or bwrap", c.Runtime))
	}
	if c.Concurrency < 1 || c.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d: want 1 to %d", c.Concurrency, maxConcurrency))
	}
	if !filepath.IsAbs(c.Python) {
		errs = append(errs, fmt.Errorf("python %q: want an absolute path inside the sandbox", c.Python))
	}
	switch c.Platform {
	case "ptrace", "systrap", "kvm":
	default:
		errs = append(errs, fmt.Errorf("runsc platform %q: want ptrace, systrap or kvm", c.Platform))
	}
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state dir %q: want an absolute path", c.StateDir))
	}
	if c.UIDBase < 1000 || c.UIDBase > 1<<31-maxConcurrency {
		errs = append(errs, fmt.Errorf("uid base %d: want 1000 to %d", c.UIDBase, 1<<31-maxConcurrency))
	}
	if c.Cgroups != "auto" && c.Cgroups != "off" {
		errs = append(errs, fmt.Errorf("cgroups %q: want auto or off", c.Cgroups))
	}
	if err := c.Limits.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the environment, with defaults,
// and reports every bad value at once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Runtime:  strings.TrimSpace(getenv(EnvRuntime)),
		ID:       getenv(EnvID),
		Python:   getenv(EnvPython),
		Bwrap:    getenv(EnvBwrap),
		Runsc:    getenv(EnvRunsc),
		Platform: getenv(EnvPlatform),
		StateDir: getenv(EnvStateDir),
		Cgroups:  getenv(EnvCgroups),
	}
	var errs []error
	num := func(name string, lo, hi int64, unit int64, set func(int64)) {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Errorf("%s=%q: want a whole number from %d to %d", name, v, lo, hi))
			return
		}
		set(n * unit)
	}
	switch v := strings.ToLower(strings.TrimSpace(getenv(EnvInsecureDev))); v {
	case "", "0", "false", "no":
	case "1", "true", "yes":
		c.InsecureDev = true
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want 1 or 0", EnvInsecureDev, v))
	}
	num(EnvConcurrency, 1, maxConcurrency, 1, func(n int64) { c.Concurrency = int(n) })
	num(EnvUIDBase, 1000, 1<<31-maxConcurrency, 1, func(n int64) { c.UIDBase = int(n) })
	num(EnvMemoryMB, 16, 1<<20, 1<<20, func(n int64) { c.Limits.MemoryBytes = n })
	num(EnvProcesses, 4, 1<<16, 1, func(n int64) { c.Limits.Processes = int(n) })
	num(EnvCPUSeconds, 1, 86400, 1, func(n int64) { c.Limits.CPUSeconds = int(n) })
	num(EnvOpenFiles, 16, 1<<20, 1, func(n int64) { c.Limits.OpenFiles = int(n) })
	num(EnvFileSizeMB, 1, 1<<20, 1<<20, func(n int64) { c.Limits.FileSizeBytes = n })
	num(EnvDiskMB, 1, 1<<20, 1<<20, func(n int64) { c.Limits.DiskBytes = n })
	num(EnvOutputKB, 1, 1<<20, 1<<10, func(n int64) { c.Limits.OutputBytes = n })
	num(EnvStderrKB, 1, 1<<10, 1<<10, func(n int64) { c.Limits.StderrBytes = int(n) })
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	c = c.withDefaults()
	return c, c.Validate()
}

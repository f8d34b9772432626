package sandbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// bwrapRuntime runs a job with bubblewrap: every namespace unshared (user,
// pid, network, ipc, uts, mount, cgroup), no network at all (only a loopback
// of its own), a new session, death with its parent, read-only system
// directories and nothing else of the host, an empty tmpfs work directory, an
// allow-listed environment, a seccomp filter, rlimits on its first process,
// a job uid of its own and, where the host allows, a cgroup of its own.
type bwrapRuntime struct {
	bin     string
	seccomp []byte
	layout  []systemEntry
	files   []string
}

func newBwrap(cfg Config) (*bwrapRuntime, error) {
	bin, err := lookPath(cfg.Bwrap, "bwrap")
	if err != nil {
		return nil, fmt.Errorf("bubblewrap (Debian package bubblewrap) is not installed: %w", err)
	}
	prog, err := seccompProgram()
	if err != nil {
		return nil, err
	}
	return &bwrapRuntime{bin: bin, seccomp: prog, layout: systemLayout(), files: systemFiles()}, nil
}

func (b *bwrapRuntime) Name() string { return RuntimeBwrap }

// Fds of the bwrap process: 3 is the gate's (closed before bwrap starts).
const (
	bwrapSeccompFD = 4
	bwrapSourceFD  = 5
)

func (b *bwrapRuntime) args(x *execution) []string {
	a := []string{
		"--unshare-all", "--unshare-user", "--disable-userns",
		"--die-with-parent", "--new-session",
		"--hostname", "sandbox",
		"--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxUID),
	}
	for _, e := range b.layout {
		if e.Symlink != "" {
			a = append(a, "--symlink", e.Symlink, e.Path)
		} else {
			a = append(a, "--ro-bind", e.Path, e.Path)
		}
	}
	// /usr/local holds what the operator installed, not what python3 needs.
	a = append(a, "--tmpfs", "/usr/local", "--remount-ro", "/usr/local")
	for _, f := range b.files {
		a = append(a, "--ro-bind", f, f)
	}
	a = append(a,
		"--proc", "/proc",
		// Device nodes stay usable on a read-only /dev; files cannot be made.
		"--dev", "/dev", "--remount-ro", "/dev",
		"--perms", "0700", "--size", strconv.FormatInt(x.Limits.DiskBytes, 10), "--tmpfs", workDir,
		"--symlink", workDir, "/tmp",
		"--perms", "0444", "--ro-bind-data", strconv.Itoa(bwrapSourceFD), mainFile,
		"--remount-ro", "/",
		"--chdir", workDir,
		"--clearenv",
	)
	for _, kv := range sandboxEnv(workDir) {
		k, v, _ := strings.Cut(kv, "=")
		a = append(a, "--setenv", k, v)
	}
	a = append(a, "--seccomp", strconv.Itoa(bwrapSeccompFD), "--")
	return append(a, pythonArgv(x.Python, mainFile)...)
}

func (b *bwrapRuntime) Run(ctx context.Context, x *execution) (procResult, error) {
	sec, err := memfd("toolwire-seccomp", b.seccomp)
	if err != nil {
		return procResult{}, err
	}
	defer sec.Close()
	src, err := memfd("toolwire-source", []byte(x.Source))
	if err != nil {
		return procResult{}, err
	}
	defer src.Close()

	spec := procSpec{
		Path: b.bin, Args: b.args(x), Env: runtimeEnv(), Dir: "/", Stdin: x.Stdin,
		ExtraFiles: []*os.File{sec, src},
		Timeout:    x.Timeout,
		TimedOut:   &x.timedOut,
		SignalExit: true,
	}
	// memory.max over everything the job holds: its processes and its tmpfs
	// pages.
	if err := x.confine(&spec, x.Limits.DiskBytes); err != nil {
		return procResult{}, err
	}
	res, err := runProcess(ctx, spec)
	if err == nil && x.SlotUID >= 0 {
		// The job's uid must own nothing now.
		if left := processesOf(x.SlotUID); len(left) > 0 {
			res.Leftovers = fmt.Errorf("processes %v of the job's uid %d survive", left, x.SlotUID)
		}
	}
	return res, err
}

// confine gives a job's process what holds it on the host: its slot's uid
// (whose processes a kill reaps, however they hide), the rlimits, the output
// limits and, where the host has them, a cgroup whose memory.max is the job's
// memory plus extraMemory (what else it holds: a tmpfs) and 32 MiB for the
// runtime. pids.max is below RLIMIT_NPROC, so that the cgroup records the
// refusal.
func (x *execution) confine(spec *procSpec, extraMemory int64) error {
	spec.UID, spec.GID = x.SlotUID, x.SlotUID
	spec.Rlimits = hostRlimits(x.Limits, x.SlotUID >= 0)
	spec.OutputLimit, spec.StderrLimit = x.Limits.OutputBytes, x.Limits.StderrBytes
	if x.SlotUID >= 0 {
		uid := x.SlotUID
		spec.Kill = func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_ = killUID(ctx, uid)
		}
	}
	if x.Cgroups == nil {
		return nil
	}
	cg, err := x.Cgroups.create(cgroupName(x.ID), cgroupLimits{
		MemoryBytes: x.Limits.MemoryBytes + extraMemory + 32<<20, Pids: x.Limits.Processes, CPUs: 1,
	})
	if err != nil {
		return err
	}
	spec.Cgroup = cg
	return nil
}

// hostRlimits are the rlimits set on the runtime's first process and
// inherited by the job. RLIMIT_NPROC counts the processes of a uid, so it is
// set only when the job has a uid of its own (with a few more for bwrap's own
// processes).
func hostRlimits(l Limits, ownUID bool) []rlimit {
	out := []rlimit{
		{unix.RLIMIT_AS, uint64(l.MemoryBytes)}, //nolint:gosec // validated positive
		// SIGXCPU at the soft limit (reported as such), SIGKILL a second later.
		{unix.RLIMIT_CPU, uint64(l.CPUSeconds)},      //nolint:gosec // validated positive
		{unix.RLIMIT_NOFILE, uint64(l.OpenFiles)},    //nolint:gosec // validated positive
		{unix.RLIMIT_FSIZE, uint64(l.FileSizeBytes)}, //nolint:gosec // validated positive
		{unix.RLIMIT_CORE, 0},
	}
	if ownUID {
		out = append(out, rlimit{unix.RLIMIT_NPROC, uint64(l.Processes + 4)}) //nolint:gosec // validated positive
	}
	return out
}

// cgroupName names a job's cgroup: "<service pid>-<job id>", so that a later
// service process can tell the cgroups of a dead one.
func cgroupName(id string) string { return strconv.Itoa(os.Getpid()) + "-" + id }

// memfd returns an anonymous in-memory file holding data, at offset 0.
func memfd(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("memfd %s: %w", name, err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("memfd %s: %w", name, err)
	}
	return f, nil
}

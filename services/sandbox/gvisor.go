package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// gvisorRuntime runs a job in gVisor: runsc starts an OCI bundle whose
// program runs on gVisor's own kernel (the Sentry), not the host's; the host
// kernel sees only the Sentry's small, seccomp-filtered syscall surface. The
// bundle shows read-only system directories and nothing else of the host, an
// empty tmpfs work directory and the program; --network=none leaves it a
// loopback of its own. Limits: rlimits inside gVisor (address space,
// processes, open files, file size), the tmpfs size, and the job's cgroup
// around all of runsc's host processes (memory and pids), where the host
// allows one.
type gvisorRuntime struct {
	bin      string
	platform string
	root     string // runsc --root: container state
	rootfs   string // the shared, read-only root file system template
	bundles  string
	layout   []systemEntry
	files    []string
	rootless bool
}

// gvisorOverhead is host memory the Sentry and the gofer need beside the
// program's own.
const gvisorOverhead = 256 << 20

func newGVisor(cfg Config) (*gvisorRuntime, error) {
	bin, err := lookPath(cfg.Runsc, "runsc")
	if err != nil {
		return nil, fmt.Errorf("gVisor runsc (Debian package runsc) is not installed: %w", err)
	}
	base := filepath.Join(cfg.StateDir, "gvisor")
	g := &gvisorRuntime{
		bin: bin, platform: cfg.Platform,
		root:    filepath.Join(base, "state"),
		rootfs:  filepath.Join(base, "rootfs"),
		bundles: filepath.Join(base, "bundles"),
		layout:  systemLayout(), files: systemFiles(),
		rootless: os.Geteuid() != 0,
	}
	for _, d := range []string{g.root, g.bundles} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor state: %w", err)
		}
	}
	if err := g.makeRootfs(); err != nil {
		return nil, err
	}
	return g, nil
}

// makeRootfs builds the root file system template: mount points and the
// symlinks of a merged-/usr system. It is
// built aside and renamed into place, so that service processes sharing the
// state directory never see half of one.
func (g *gvisorRuntime) makeRootfs() error {
	if fi, err := os.Stat(g.rootfs); err == nil && fi.IsDir() {
		return nil
	}
	tmp, err := os.MkdirTemp(filepath.Dir(g.rootfs), "rootfs-")
	if err != nil {
		return fmt.Errorf("gvisor rootfs: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil { //nolint:gosec // a root fs must be world-readable
		return fmt.Errorf("gvisor rootfs: %w", err)
	}
	dirs := []string{"proc", "dev", "sys", "work", "tmp", "job", "etc"}
	for _, e := range g.layout {
		if e.Symlink == "" {
			dirs = append(dirs, e.Path)
		}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil { //nolint:gosec // mount points
			return fmt.Errorf("gvisor rootfs: %w", err)
		}
	}
	for _, e := range g.layout {
		if e.Symlink != "" {
			if err := os.Symlink(e.Symlink, filepath.Join(tmp, e.Path)); err != nil {
				return fmt.Errorf("gvisor rootfs: %w", err)
			}
		}
	}
	for _, f := range g.files {
		p := filepath.Join(tmp, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil { //nolint:gosec // mount points
			return fmt.Errorf("gvisor rootfs: %w", err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil { //nolint:gosec // an empty mount point
			return fmt.Errorf("gvisor rootfs: %w", err)
		}
	}
	if err := os.Rename(tmp, g.rootfs); err != nil {
		// Another process was quicker: its template is as good.
		if fi, serr := os.Stat(g.rootfs); serr == nil && fi.IsDir() {
			return nil
		}
		return fmt.Errorf("gvisor rootfs: %w", err)
	}
	return nil
}

func (g *gvisorRuntime) Name() string { return RuntimeGVisor }

// spec is the OCI runtime spec of one job.
func (g *gvisorRuntime) spec(x *execution, bundle string) *specs.Spec {
	l := x.Limits
	rl := func(typ string, v uint64) specs.POSIXRlimit { return specs.POSIXRlimit{Type: typ, Hard: v, Soft: v} }
	ro := []string{"rbind", "ro", "nosuid", "nodev"}
	mounts := []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}}
	for _, e := range g.layout {
		if e.Symlink == "" {
			mounts = append(mounts, specs.Mount{Destination: e.Path, Type: "bind", Source: e.Path, Options: ro})
		}
	}
	mounts = append(mounts, specs.Mount{Destination: "/usr/local", Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "nosuid", "nodev", "size=4k"}})
	for _, f := range g.files {
		mounts = append(mounts, specs.Mount{Destination: f, Type: "bind", Source: f, Options: ro})
	}
	mounts = append(mounts,
		specs.Mount{Destination: workDir, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(l.DiskBytes, 10)}},
		// gVisor would mount a /tmp of its own, without a size: give it one.
		specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(l.DiskBytes, 10)}},
		specs.Mount{Destination: jobDir, Type: "bind", Source: filepath.Join(bundle, "job"), Options: ro},
	)
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: sandboxUID, GID: sandboxUID},
			Args: pythonArgv(x.Python, mainFile), Env: sandboxEnv(workDir), Cwd: workDir,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{},
			},
			Rlimits: []specs.POSIXRlimit{
				rl("RLIMIT_AS", uint64(l.MemoryBytes)),                                           //nolint:gosec // validated positive
				rl("RLIMIT_NPROC", uint64(l.Processes)),                                          //nolint:gosec // validated positive
				{Type: "RLIMIT_CPU", Soft: uint64(l.CPUSeconds), Hard: uint64(l.CPUSeconds) + 1}, //nolint:gosec // validated positive
				rl("RLIMIT_NOFILE", uint64(l.OpenFiles)),                                         //nolint:gosec // validated positive
				rl("RLIMIT_FSIZE", uint64(l.FileSizeBytes)),                                      //nolint:gosec // validated positive
				rl("RLIMIT_CORE", 0),
			},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: g.rootfs, Readonly: true},
		Hostname: "sandbox",
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			Seccomp: gvisorSeccomp(),
		},
	}
}

// gvisorSeccomp is the filter gVisor's kernel applies to the job (runsc
// --oci-seccomp): sockets of every family but AF_UNIX fail with
// EAFNOSUPPORT, as under bwrap. gVisor itself refuses most families, but
// with --network=none it still serves AF_INET and AF_INET6 on the sandbox's
// loopback and AF_NETLINK's route and uevent protocols. Everything else
// (keyrings, io_uring, foreign ABIs, ...) gVisor's kernel does not serve, or
// serves inside the sandbox only.
func gvisorSeccomp() *specs.LinuxSeccomp {
	errno := uint(socketFamilyErrno)
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Syscalls: []specs.LinuxSyscall{{
			Names:    []string{"socket", "socketpair"},
			Action:   specs.ActErrno,
			ErrnoRet: &errno,
			Args:     []specs.LinuxSeccompArg{{Index: 0, Value: allowedSocketFamily, Op: specs.OpNotEqual}},
		}},
	}
}

// flags are runsc's global flags. --oci-seccomp makes gVisor's kernel apply
// the OCI bundle's seccomp filter (runsc ignores it otherwise).
func (g *gvisorRuntime) flags(ownCgroup bool) []string {
	f := []string{"--root", g.root, "--network=none", "--platform=" + g.platform, "--oci-seccomp"}
	if ownCgroup {
		// The supervisor has put runsc into the job's cgroup already.
		f = append(f, "--ignore-cgroups")
	}
	if g.rootless {
		f = append(f, "--rootless")
	}
	return f
}

func (g *gvisorRuntime) Run(ctx context.Context, x *execution) (procResult, error) {
	bundle := filepath.Join(g.bundles, x.ID)
	if err := os.MkdirAll(filepath.Join(bundle, "job"), 0o755); err != nil { //nolint:gosec // read by the gofer
		return procResult{}, fmt.Errorf("gvisor bundle: %w", err)
	}
	defer os.RemoveAll(bundle)
	if err := os.WriteFile(filepath.Join(bundle, "job", "main.py"), []byte(x.Source), 0o644); err != nil { //nolint:gosec // read by the program
		return procResult{}, fmt.Errorf("gvisor bundle: %w", err)
	}
	b, err := json.Marshal(g.spec(x, bundle))
	if err != nil {
		return procResult{}, fmt.Errorf("gvisor bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return procResult{}, fmt.Errorf("gvisor bundle: %w", err)
	}

	var cg *jobCgroup
	if x.Cgroups != nil {
		cg, err = x.Cgroups.create(cgroupName(x.ID), cgroupLimits{
			MemoryBytes: x.Limits.MemoryBytes + x.Limits.DiskBytes + gvisorOverhead,
			// The Sentry's threads and the platform's stubs are host tasks.
			Pids: 4*x.Limits.Processes + 256,
			CPUs: 1,
		})
		if err != nil {
			return procResult{}, err
		}
	}
	flags := g.flags(cg != nil)
	args := append(append([]string{}, flags...), "run", "--bundle", bundle, x.ID)
	res, err := runProcess(ctx, procSpec{
		Path: g.bin, Args: args, Env: runtimeEnv(), Dir: bundle, Stdin: x.Stdin,
		UID: -1, GID: -1,
		Cgroup:      cg,
		Timeout:     x.Timeout,
		TimedOut:    &x.timedOut,
		OutputLimit: x.Limits.OutputBytes, StderrLimit: x.Limits.StderrBytes,
		SignalExit: true,
		Stop:       func(ctx context.Context) { g.kill(ctx, flags, x.ID) },
		Kill:       func(ctx context.Context) { g.delete(ctx, flags, x.ID) },
	})
	if err == nil {
		// The check outlives ctx (a shutdown that comes as the job ends still
		// deletes a leftover container); gone bounds itself.
		if cerr := g.gone(context.WithoutCancel(ctx), flags, x.ID); cerr != nil {
			res.Leftovers = errors.Join(res.Leftovers, cerr)
		}
	}
	return res, err
}

// kill kills every process of the container: the sandbox then ends, and
// runsc run reaps it and removes its state.
func (g *gvisorRuntime) kill(ctx context.Context, flags []string, id string) {
	g.runsc(ctx, flags, "kill", "--all", id, "KILL")
}

// runsc runs a runsc command, bounded by 10 seconds, and ignores its outcome:
// what counts is checked afterwards.
func (g *gvisorRuntime) runsc(ctx context.Context, flags []string, args ...string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, append(append([]string{}, flags...), args...)...) //nolint:gosec // our own binary and arguments
	cmd.Env = runtimeEnv()
	_ = cmd.Run()
}

// delete force-deletes the container: it kills the sandbox if it still runs
// and removes runsc's state of it.
func (g *gvisorRuntime) delete(ctx context.Context, flags []string, id string) {
	g.runsc(ctx, flags, "delete", "--force", id)
}

// gone checks that runsc lists the container no more; if it does, it is
// deleted (again) and reported.
func (g *gvisorRuntime) gone(ctx context.Context, flags []string, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	args := append(append([]string{}, flags...), "list", "--format=json")
	cmd := exec.CommandContext(ctx, g.bin, args...) //nolint:gosec // our own binary and arguments
	cmd.Env = runtimeEnv()
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("runsc list: %w", err)
	}
	var list []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return fmt.Errorf("runsc list: %w", err)
	}
	for _, c := range list {
		if c.ID == id {
			g.delete(ctx, flags, id)
			return fmt.Errorf("runsc still lists container %s (%s)", id, c.Status)
		}
	}
	return nil
}

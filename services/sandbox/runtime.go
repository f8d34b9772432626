package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Paths inside every sandbox.
const (
	workDir    = "/work"        // the job's empty tmpfs: cwd, HOME, TMPDIR
	jobDir     = "/job"         // read-only: the program
	mainFile   = "/job/main.py" // the program's source
	sandboxUID = 1000           // the program's uid and gid inside the sandbox
)

// execution is one job as a runtime sees it.
type execution struct {
	ID      string // unique per job; names cgroups, bundles and containers
	Python  string // python3's path inside the sandbox
	Source  string
	Stdin   []byte
	Limits  Limits
	Timeout time.Duration
	// Slot is the job's slot; with SlotUID >= 0 the runtime runs as that
	// host uid, which no other job uses while this one runs.
	Slot    int
	SlotUID int
	Cgroups *cgroups // nil: rlimits only
	// timedOut is set when the job's timeout has fired (the supervisor
	// stops it): from then on its outcome is TIMEOUT, whatever its stop
	// costs.
	timedOut atomic.Bool
}

// runtime runs a job in one kind of isolation.
type runtime interface {
	// Name is the runtime's name in results (gvisor, bwrap, insecure-dev).
	Name() string
	// Run runs the job and returns what happened to its process.
	Run(ctx context.Context, x *execution) (procResult, error)
}

// sandboxEnv is the whole environment of the program: an allow-list, nothing
// of the service's own. work is its work directory.
func sandboxEnv(work string) []string {
	return []string{
		"PATH=/usr/bin:/bin",
		"HOME=" + work,
		"TMPDIR=" + work,
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"PYTHONDONTWRITEBYTECODE=1",
		"PYTHONUNBUFFERED=1",
	}
}

// runtimeEnv is the environment of the runtime process itself (bwrap,
// runsc): also an allow-list, so that the runtime cannot hand the service's
// environment on (bwrap's own /proc/1/environ is visible inside its sandbox).
func runtimeEnv() []string {
	return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
}

// pythonArgv runs the program: -I isolates it from PYTHON* variables, the
// user's site directory and the script's directory on sys.path; -B writes no
// bytecode.
func pythonArgv(python, main string) []string {
	return []string{python, "-I", "-B", main}
}

// systemEntry is one top-level host path the sandbox shows: a directory bound
// read-only, or a symlink recreated (merged-/usr systems link /bin, /lib and
// /lib64 into /usr).
type systemEntry struct {
	Path    string // e.g. /lib64
	Symlink string // the link's target, or "" for a directory to bind
}

// systemLayout lists the system directories python3 needs, as this host has
// them: /usr, and /bin, /sbin, /lib, /lib32, /lib64, /libx32 where they exist.
func systemLayout() []systemEntry {
	out := []systemEntry{{Path: "/usr"}}
	for _, p := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if t, err := os.Readlink(p); err == nil {
				out = append(out, systemEntry{Path: p, Symlink: t})
			}
			continue
		}
		if fi.IsDir() {
			out = append(out, systemEntry{Path: p})
		}
	}
	return out
}

// systemFiles are the files of /etc the dynamic loader and python3 read, bound
// read-only where the host has them. Nothing else of /etc is visible.
func systemFiles() []string {
	var out []string
	for _, p := range []string{"/etc/ld.so.cache", "/etc/localtime"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			out = append(out, p)
		}
	}
	return out
}

// lookPath resolves a runtime's binary: the configured path, or name in the
// system's bin directories (PATH is not searched).
func lookPath(configured, name string) (string, error) {
	if configured != "" {
		if !filepath.IsAbs(configured) {
			return "", &os.PathError{Op: "use", Path: configured, Err: os.ErrInvalid}
		}
		if _, err := os.Stat(configured); err != nil {
			return "", err
		}
		return configured, nil
	}
	for _, dir := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &os.PathError{Op: "find", Path: name, Err: os.ErrNotExist}
}

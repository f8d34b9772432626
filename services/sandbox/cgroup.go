package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupLimits are what a job's cgroup enforces on the host.
type cgroupLimits struct {
	MemoryBytes int64
	Pids        int
	CPUs        float64 // 0: no CPU quota
}

// cgroups makes one cgroup per job under a parent cgroup of its own, in the
// unified hierarchy (v2) when it has the memory and pids controllers, else in
// the v1 hierarchies (memory, pids, and cpu and freezer where mounted).
type cgroups struct {
	v2 bool
	// parents maps a controller ("" for v2) to the parent cgroup's directory.
	parents map[string]string
	// keys lists the keys of parents in a fixed order (v1: freezer first).
	keys []string
}

// v1 controllers used, and whether each is required.
var v1Controllers = []struct {
	name     string
	required bool
}{{"freezer", false}, {"memory", true}, {"pids", true}, {"cpu", false}}

// detectCgroups finds the cgroup hierarchies under mountRoot (normally
// /sys/fs/cgroup) and creates (or reuses) the parent cgroup parentName in each.
// It removes the cgroups of jobs whose service process is gone.
func detectCgroups(ctx context.Context, mountRoot, parentName string) (*cgroups, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("cgroups: the service does not run as root, so it cannot create job cgroups")
	}
	var cg *cgroups
	var v2err error
	for _, dir := range []string{mountRoot, filepath.Join(mountRoot, "unified")} {
		cg, v2err = detectV2(dir, parentName)
		if cg != nil {
			break
		}
	}
	if cg == nil {
		var v1err error
		cg, v1err = detectV1(mountRoot, parentName)
		if cg == nil {
			return nil, fmt.Errorf("cgroups: no usable hierarchy (v2: %w; v1: %w)", v2err, v1err)
		}
	}
	cg.sweep(ctx)
	return cg, nil
}

func detectV2(dir, parentName string) (*cgroups, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("%s is not a cgroup2 mount", dir)
	}
	have := map[string]bool{}
	for _, c := range strings.Fields(string(b)) {
		have[c] = true
	}
	if !have["memory"] || !have["pids"] {
		return nil, fmt.Errorf("%s has controllers %q, without memory and pids", dir, strings.TrimSpace(string(b)))
	}
	enable := "+memory +pids"
	if have["cpu"] {
		enable += " +cpu"
	}
	// The hierarchy's root may hold processes and still delegate; a parent
	// cgroup of ours holds none, so its children get the controllers too.
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
		return nil, fmt.Errorf("enable %s in %s: %w", enable, dir, err)
	}
	parent := filepath.Join(dir, parentName)
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) { //nolint:gosec // a cgroupfs directory: its files' modes are the kernel's
		return nil, fmt.Errorf("create cgroup %s: %w", parent, err)
	}
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
		return nil, fmt.Errorf("enable %s in %s: %w", enable, parent, err)
	}
	return &cgroups{v2: true, parents: map[string]string{"": parent}, keys: []string{""}}, nil
}

func detectV1(mountRoot, parentName string) (*cgroups, error) {
	cg := &cgroups{parents: map[string]string{}}
	for _, c := range v1Controllers {
		dir := filepath.Join(mountRoot, c.name)
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
			if c.required {
				return nil, fmt.Errorf("no v1 %s hierarchy at %s", c.name, dir)
			}
			continue
		}
		parent := filepath.Join(dir, parentName)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) { //nolint:gosec // a cgroupfs directory
			if c.required {
				return nil, fmt.Errorf("create cgroup %s: %w", parent, err)
			}
			continue
		}
		cg.parents[c.name] = parent
		cg.keys = append(cg.keys, c.name)
	}
	return cg, nil
}

// describe says which hierarchy and controllers are in use.
func (c *cgroups) describe() string {
	if c.v2 {
		return "cgroup v2 at " + c.parents[""]
	}
	return "cgroup v1 (" + strings.Join(c.keys, ", ") + ") under " + c.parents["memory"]
}

// sweep removes job cgroups left by a service process that is gone: it kills
// what still runs in them first. Job cgroups are named "<service pid>-<job>".
func (c *cgroups) sweep(ctx context.Context) {
	entries, err := os.ReadDir(c.parents[c.keys[0]])
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		j := c.job(e.Name())
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = j.remove(rctx)
		cancel()
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// jobCgroup is one job's cgroup, in every hierarchy in use.
type jobCgroup struct {
	c    *cgroups
	dirs map[string]string // controller ("" for v2) -> directory
}

func (c *cgroups) job(name string) *jobCgroup {
	j := &jobCgroup{c: c, dirs: map[string]string{}}
	for k, p := range c.parents {
		j.dirs[k] = filepath.Join(p, name)
	}
	return j
}

// create makes the job's cgroup with its limits.
func (c *cgroups) create(name string, l cgroupLimits) (*jobCgroup, error) {
	j := c.job(name)
	for _, k := range c.keys {
		if err := os.Mkdir(j.dirs[k], 0o755); err != nil { //nolint:gosec // a cgroupfs directory
			_ = j.rmdirs()
			return nil, fmt.Errorf("create cgroup %s: %w", j.dirs[k], err)
		}
	}
	mem := strconv.FormatInt(l.MemoryBytes, 10)
	pids := strconv.Itoa(l.Pids)
	var writes []cgroupWrite
	if c.v2 {
		d := j.dirs[""]
		writes = append(writes,
			cgroupWrite{d, "memory.max", mem, true},
			cgroupWrite{d, "memory.swap.max", "0", false},
			cgroupWrite{d, "pids.max", pids, true})
		if l.CPUs > 0 {
			writes = append(writes, cgroupWrite{d, "cpu.max", fmt.Sprintf("%d 100000", int64(l.CPUs*100000)), false})
		}
	} else {
		writes = append(writes,
			cgroupWrite{j.dirs["memory"], "memory.limit_in_bytes", mem, true},
			// No swap: memsw must not be below the memory limit, and exists
			// only with swap accounting.
			cgroupWrite{j.dirs["memory"], "memory.memsw.limit_in_bytes", mem, false},
			cgroupWrite{j.dirs["pids"], "pids.max", pids, true})
		if d, ok := j.dirs["cpu"]; ok && l.CPUs > 0 {
			writes = append(writes,
				cgroupWrite{d, "cpu.cfs_period_us", "100000", false},
				cgroupWrite{d, "cpu.cfs_quota_us", strconv.FormatInt(int64(l.CPUs*100000), 10), false})
		}
	}
	for _, w := range writes {
		if err := os.WriteFile(filepath.Join(w.dir, w.file), []byte(w.value), 0); err != nil && w.required {
			_ = j.rmdirs()
			return nil, fmt.Errorf("cgroup %s: write %s: %w", w.dir, w.file, err)
		}
	}
	return j, nil
}

type cgroupWrite struct {
	dir, file, value string
	required         bool
}

// add moves a process into the job's cgroup (in every hierarchy). Processes it
// starts later are born there.
func (j *jobCgroup) add(pid int) error {
	for _, k := range j.c.keys {
		if err := os.WriteFile(filepath.Join(j.dirs[k], "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move process %d into cgroup %s: %w", pid, j.dirs[k], err)
		}
	}
	return nil
}

// limitEvents reports whether the kernel acted on the job's memory limit (an
// OOM kill) or refused a fork at its pids limit.
func (j *jobCgroup) limitEvents() (memory, pids bool) {
	if j.c.v2 {
		d := j.dirs[""]
		return readCounter(filepath.Join(d, "memory.events"), "oom_kill") > 0,
			readCounter(filepath.Join(d, "pids.events"), "max") > 0
	}
	return readCounter(filepath.Join(j.dirs["memory"], "memory.oom_control"), "oom_kill") > 0,
		readCounter(filepath.Join(j.dirs["pids"], "pids.events"), "max") > 0
}

// readCounter reads the value of key in a flat-keyed cgroup file ("key N"
// lines); 0 when absent.
func readCounter(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// procs lists the processes in the job's cgroup.
func (j *jobCgroup) procs() ([]int, error) {
	d := j.dirs[""]
	if !j.c.v2 {
		d = j.dirs["pids"]
	}
	b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// kill sends SIGKILL to every process of the job: cgroup.kill on v2; on v1
// the job is frozen first (when the freezer is mounted), so that nothing forks
// between the listing and the killing.
func (j *jobCgroup) kill() {
	if j.c.v2 {
		if os.WriteFile(filepath.Join(j.dirs[""], "cgroup.kill"), []byte("1"), 0) == nil {
			return
		}
	}
	fz, frozen := j.dirs["freezer"]
	if frozen {
		frozen = os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("FROZEN"), 0) == nil
	}
	pids, _ := j.procs()
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	if frozen {
		// Killed processes die when thawed.
		_ = os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("THAWED"), 0)
	}
}

// empty kills the job's processes until none is left, bounded by ctx.
func (j *jobCgroup) empty(ctx context.Context) error {
	wait := time.Millisecond
	for {
		pids, err := j.procs()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		j.kill()
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup still holds processes %v: %w", pids, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}

// remove kills what is left in the job's cgroup and removes it.
func (j *jobCgroup) remove(ctx context.Context) error {
	err := j.empty(ctx)
	wait := time.Millisecond
	for {
		rerr := j.rmdirs()
		if rerr == nil {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, rerr)
		case <-time.After(wait):
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}

// rmdirs removes the job's directories; it is retried while the kernel still
// counts exiting processes.
func (j *jobCgroup) rmdirs() error {
	var errs []error
	for _, d := range j.dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

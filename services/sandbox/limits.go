package sandbox

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/toolwire/toolwire/pkg/events"
)

// Names of the limits, as a SANDBOX_ERROR or TIMEOUT reports them in
// details.limit.
const (
	LimitMemory    = "memory"
	LimitProcesses = "processes"
	LimitCPUTime   = "cpu_time"
	LimitWallTime  = "wall_time"
	LimitOpenFiles = "open_files"
	LimitDisk      = "disk"
	LimitOutput    = "output"
)

// minFileSize is the least RLIMIT_FSIZE: bubblewrap writes the program's
// source (at most events.SandboxMaxSourceBytes) under it.
const minFileSize = 1 << 20

// Limits are the resource limits of one job.
type Limits struct {
	MemoryBytes   int64 // RLIMIT_AS, and memory.max with cgroups
	Processes     int   // RLIMIT_NPROC (per job uid), and pids.max with cgroups
	CPUSeconds    int   // RLIMIT_CPU of each process
	OpenFiles     int   // RLIMIT_NOFILE
	FileSizeBytes int64 // RLIMIT_FSIZE
	DiskBytes     int64 // size of the tmpfs work directory
	OutputBytes   int64 // stdout beyond this kills the job
	StderrBytes   int   // the end of stderr kept as a diagnostic
}

func (l Limits) orDefaults(d Limits) Limits {
	l.MemoryBytes = cmp.Or(l.MemoryBytes, d.MemoryBytes)
	l.Processes = cmp.Or(l.Processes, d.Processes)
	l.CPUSeconds = cmp.Or(l.CPUSeconds, d.CPUSeconds)
	l.OpenFiles = cmp.Or(l.OpenFiles, d.OpenFiles)
	l.FileSizeBytes = cmp.Or(l.FileSizeBytes, d.FileSizeBytes)
	l.DiskBytes = cmp.Or(l.DiskBytes, d.DiskBytes)
	l.OutputBytes = cmp.Or(l.OutputBytes, d.OutputBytes)
	l.StderrBytes = cmp.Or(l.StderrBytes, d.StderrBytes)
	return l
}

func (l Limits) validate() error {
	var errs []error
	if l.MemoryBytes < 16<<20 {
		errs = append(errs, fmt.Errorf("memory limit %d bytes: want at least 16 MiB (python3 needs about 10)", l.MemoryBytes))
	}
	if l.Processes < 4 {
		errs = append(errs, fmt.Errorf("process limit %d: want at least 4 (the runtime's own processes count)", l.Processes))
	}
	if l.CPUSeconds < 1 {
		errs = append(errs, fmt.Errorf("cpu limit %d s: want at least 1", l.CPUSeconds))
	}
	if l.OpenFiles < 16 {
		errs = append(errs, fmt.Errorf("open files limit %d: want at least 16", l.OpenFiles))
	}
	if l.FileSizeBytes < minFileSize || l.DiskBytes < 1<<20 || l.OutputBytes < 1 || l.StderrBytes < 1 {
		errs = append(errs, errors.New("output and stderr limits must be positive, the file size and the disk at least 1 MiB"))
	}
	return errors.Join(errs...)
}

// forJob returns the limits of a job that asks for req: each asked value
// replaces the deployment's when it is lower; the deployment's limits are the
// most any job gets.
func (l Limits) forJob(req *events.SandboxLimits) Limits {
	if req == nil {
		return l
	}
	lower64 := func(cur *int64, asked int64, floor int64) {
		if asked > 0 && asked < *cur {
			*cur = max(asked, floor)
		}
	}
	lower := func(cur *int, asked int, floor int) {
		if asked > 0 && asked < *cur {
			*cur = max(asked, floor)
		}
	}
	lower64(&l.MemoryBytes, req.MemoryBytes, 16<<20)
	lower(&l.Processes, req.Processes, 4)
	lower(&l.CPUSeconds, req.CPUSeconds, 1)
	lower(&l.OpenFiles, req.OpenFiles, 16)
	lower64(&l.FileSizeBytes, req.FileSizeBytes, minFileSize)
	lower64(&l.DiskBytes, req.DiskBytes, 1<<20)
	lower64(&l.OutputBytes, req.OutputBytes, 1)
	return l
}

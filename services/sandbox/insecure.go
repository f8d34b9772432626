package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// insecureRuntime runs python3 directly on the host, with no isolation at
// all: only a temporary work directory, an allow-listed environment, the
// rlimits, the job's uid and cgroup where the host allows them, the timeout
// and the output cap. The code can read and change whatever its uid can, and
// reach the network. It exists for development machines where neither gVisor
// nor bubblewrap works, and only runs when the operator turned on
// TOOLWIRE_SANDBOX_INSECURE_DEV.
type insecureRuntime struct {
	dir string
}

// newInsecure makes the parent of the jobs' work directories: in the
// system's temporary directory, which every job uid can traverse (the state
// directory's parents need not be).
func newInsecure() (*insecureRuntime, error) {
	dir := filepath.Join(os.TempDir(), "toolwire-sandbox-insecure-dev")
	if err := os.MkdirAll(dir, 0o711); err != nil { //nolint:gosec // job dirs inside are 0700, owned by their uid
		return nil, fmt.Errorf("insecure-dev state: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil { //nolint:gosec // as above
		return nil, fmt.Errorf("insecure-dev state: %w", err)
	}
	return &insecureRuntime{dir: dir}, nil
}

func (r *insecureRuntime) Name() string { return RuntimeInsecureDev }

func (r *insecureRuntime) Run(ctx context.Context, x *execution) (procResult, error) {
	work := filepath.Join(r.dir, x.ID)
	if err := os.Mkdir(work, 0o700); err != nil {
		return procResult{}, fmt.Errorf("insecure-dev work dir: %w", err)
	}
	defer os.RemoveAll(work)
	main := filepath.Join(work, "main.py")
	if err := os.WriteFile(main, []byte(x.Source), 0o600); err != nil {
		return procResult{}, fmt.Errorf("insecure-dev source: %w", err)
	}
	if x.SlotUID >= 0 {
		if err := os.Chown(work, x.SlotUID, x.SlotUID); err != nil {
			return procResult{}, fmt.Errorf("insecure-dev work dir: %w", err)
		}
		if err := os.Chown(main, x.SlotUID, x.SlotUID); err != nil {
			return procResult{}, fmt.Errorf("insecure-dev source: %w", err)
		}
	}
	spec := procSpec{
		Path: x.Python, Args: pythonArgv(x.Python, main)[1:], Env: sandboxEnv(work), Dir: work, Stdin: x.Stdin,
		Timeout:  x.Timeout,
		TimedOut: &x.timedOut,
	}
	if err := x.confine(&spec, 0); err != nil {
		return procResult{}, err
	}
	return runProcess(ctx, spec)
}

package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gofrs/flock"
)

// ErrDataDirInUse is wrapped by the error of a Start whose DataDir another
// process (or another Stack) holds.
var ErrDataDirInUse = errors.New("data dir in use")

// DataDirInUseError says which process holds a data dir.
type DataDirInUseError struct {
	Dir string
	PID int // 0 when the holder did not say
}

func (e *DataDirInUseError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "process " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("data dir %s is in use by %s (another `toolwire dev` or `make run`?): stop it, or give this one its own --data-dir", e.Dir, who)
}

// Unwrap makes errors.Is(err, ErrDataDirInUse) hold.
func (e *DataDirInUseError) Unwrap() error { return ErrDataDirInUse }

// lockFile is the file in a data dir that its user holds locked. It holds
// the user's pid, for the error of the next one.
const lockFile = "lock"

// lockDataDir takes the data dir for this process, creating it, until the
// returned release is called. Two stacks on one JetStream store and one
// SQLite file would corrupt each other's state; the lock is an flock, which
// the kernel drops when the process dies, however it dies, so a killed dev
// leaves nothing to clean up.
func lockDataDir(dir string) (release func() error, err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, lockFile)
	l := flock.New(path, flock.SetFlag(os.O_CREATE|os.O_RDWR), flock.SetPermissions(0o600))
	ok, err := l.TryLock()
	if err != nil {
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	if !ok {
		pid := 0
		if b, err := os.ReadFile(path); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return nil, &DataDirInUseError{Dir: dir, PID: pid}
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		_ = l.Unlock()
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	return l.Unlock, nil
}

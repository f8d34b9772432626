package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// uidSearch bounds how far above the base uid a service looks for free uids.
const uidSearch = 1 << 16

// uidLockDir is where service processes of one host claim job uids: the
// kernel counts processes (RLIMIT_NPROC) and the end-of-job sweep kills them
// by uid, so no two jobs anywhere on the host may share one.
func uidLockDir() string { return filepath.Join(os.TempDir(), "toolwire-sandbox-uids") }

// uidClaim is a set of host uids this process holds for its job slots, each
// by an exclusive lock on a file named after it; the kernel releases the locks
// when the process ends, however it ends.
type uidClaim struct {
	uids  []int
	locks []*os.File
}

// claimUIDs claims n free uids from base upward.
func claimUIDs(base, n int) (*uidClaim, error) {
	dir := uidLockDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("job uids: %w", err)
	}
	c := &uidClaim{}
	for uid := base; uid < base+uidSearch && len(c.uids) < n; uid++ {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(uid)+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			c.release()
			return nil, fmt.Errorf("job uids: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			_ = f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue // another service process's
			}
			c.release()
			return nil, fmt.Errorf("job uids: lock %d: %w", uid, err)
		}
		c.uids = append(c.uids, uid)
		c.locks = append(c.locks, f)
	}
	if len(c.uids) < n {
		c.release()
		return nil, fmt.Errorf("job uids: found %d free uids from %d, want %d", len(c.uids), base, n)
	}
	return c, nil
}

// release gives the uids back.
func (c *uidClaim) release() {
	for _, f := range c.locks {
		_ = f.Close()
	}
	c.locks, c.uids = nil, nil
}

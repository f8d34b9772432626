package sandbox

import (
	"encoding/binary"
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls fail with EPERM inside the bwrap sandbox: the kernel's
// attack surface that untrusted Python has no business with (namespaces and
// mounts, kernel modules and kexec, BPF, keyrings, perf, ptrace and
// cross-process memory access, io_uring, userfaultfd, clocks, swap, reboot,
// handle-based opens that escape mount namespaces).
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "chroot", "clock_adjtime", "clock_settime", "delete_module",
	"fanotify_init", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "init_module",
	"io_uring_enter", "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kcmp",
	"kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "migrate_pages", "mount",
	"mount_setattr", "move_mount", "move_pages", "name_to_handle_at", "open_by_handle_at",
	"open_tree", "perf_event_open", "pidfd_getfd", "pivot_root", "process_madvise",
	"process_vm_readv", "process_vm_writev", "ptrace", "quotactl", "reboot", "request_key",
	"setdomainname", "sethostname", "setns", "settimeofday", "swapoff", "swapon", "syslog",
	"umount2", "unshare", "uselib", "userfaultfd", "ustat", "vhangup", "_sysctl", "sysfs",
}

// namespaceCloneFlags are the clone(2) flags that create namespaces.
const namespaceCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWTIME

// seccompPolicy is the filter of the bwrap runtime: allow by default, deny
// the syscalls above, clone with namespace flags, and clone3 (ENOSYS, whose
// flags sit in memory a filter cannot read: libc falls back to clone, whose
// flags it can).
func seccompPolicy() seccomp.Policy {
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
			{Action: seccomp.ActionErrno, Names: deniedSyscalls}, // EPERM
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{{
				Name: "clone",
				Conditions: seccomp.ArgumentConditions{{
					Argument: 0, Operation: seccomp.BitsSet, Value: namespaceCloneFlags,
				}},
			}}},
		},
	}
}

// seccompProgram assembles the filter for the machine's architecture into the
// raw form bwrap --seccomp reads: an array of struct sock_filter.
func seccompProgram() ([]byte, error) {
	p := seccompPolicy()
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, nil
}

package sandbox

import (
	"encoding/binary"
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
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

// allowedSocketFamily is the one socket family a job may create, on every
// runtime: AF_UNIX, for what the standard library does within the job's own
// processes (socketpair for asyncio and multiprocessing). A job has no
// network (its network namespace holds only a loopback) and no setting gives
// it one, so AF_INET and AF_INET6 are refused with the rest; AF_VSOCK would
// reach a VM's host whatever the namespace, and AF_NETLINK, AF_PACKET,
// AF_ALG, AF_KEY, AF_RDS, AF_TIPC, AF_XDP, ... are kernel surface only.
const allowedSocketFamily = unix.AF_UNIX

// socketFamilyErrno is what socket(2) and socketpair(2) of another family
// fail with: EAFNOSUPPORT, what a kernel built without the family answers, so
// that programs that probe for a family (Python's IPv6 checks, libc's
// resolver) take it as absent rather than as a fault.
const socketFamilyErrno = unix.EAFNOSUPPORT

// x32SyscallBit marks the syscall numbers of the x32 ABI, which shares the
// x86_64 audit arch (__X32_SYSCALL_BIT).
const x32SyscallBit = 0x40000000

// seccompPolicy is the filter of the bwrap runtime for the native ABI: allow
// by default, deny the syscalls above, clone with namespace flags, clone3
// (ENOSYS, whose flags sit in memory a filter cannot read: libc falls back to
// clone, whose flags it can), and sockets of every family but AF_UNIX.
// Socket families are compared on the whole 64-bit register, so that a
// family with upper bits set (which the kernel truncates to an int) is
// refused too.
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
			{Action: seccomp.ActionErrno | seccomp.Action(socketFamilyErrno), NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "socket", Conditions: seccomp.ArgumentConditions{{
					Argument: 0, Operation: seccomp.NotEqual, Value: allowedSocketFamily,
				}}},
				{Name: "socketpair", Conditions: seccomp.ArgumentConditions{{
					Argument: 0, Operation: seccomp.NotEqual, Value: allowedSocketFamily,
				}}},
			}},
		},
	}
}

// abiGuard is the start of the filter: it kills the process at the first
// syscall made through any ABI but the machine's native one, so that the
// policy, written for the native syscall numbers, is never bypassed. Other
// ABIs show in seccomp_data.arch: i386 on x86_64 (int $0x80, sysenter, and
// syscall from a 32-bit code segment), arm32 on arm64. x32 shares x86_64's arch
// value and marks its syscall numbers with __X32_SYSCALL_BIT instead. The
// go-seccomp-bpf policy after it lets a foreign arch through to its default
// action (allow), and x32 to ENOSYS: python3 needs neither, and a program
// that tries them is an attack, so both are killed here.
func abiGuard(native *arch.Info) []bpf.Instruction {
	kill := bpf.RetConstant{Val: uint32(seccomp.ActionKillProcess)}
	out := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(native.ID), SkipTrue: 1},
		kill,
	}
	if native.ID == arch.X86_64.ID {
		out = append(out,
			bpf.LoadAbsolute{Off: 0, Size: 4}, // seccomp_data.nr
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: x32SyscallBit, SkipFalse: 1},
			kill,
		)
	}
	return out
}

// seccompFilter is the whole filter for the machine's architecture: the ABI
// guard, then the policy.
func seccompFilter() ([]bpf.Instruction, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	p := seccompPolicy()
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	return append(abiGuard(native), insts...), nil
}

// seccompProgram assembles the filter into the raw form bwrap --seccomp
// reads: an array of struct sock_filter.
func seccompProgram() ([]byte, error) {
	insts, err := seccompFilter()
	if err != nil {
		return nil, err
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

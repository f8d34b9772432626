package sandbox

import (
	"encoding/binary"
	"fmt"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// filterVM runs the bwrap filter in x/net/bpf's interpreter on a
// seccomp_data the test makes up: every arch, syscall number and argument,
// not only those this host's kernel and CPU can issue.
type filterVM struct {
	vm     *bpf.VM
	native *arch.Info
}

func newFilterVM(t *testing.T) filterVM {
	t.Helper()
	insts, err := seccompFilter()
	require.NoError(t, err)
	vm, err := bpf.NewVM(insts)
	require.NoError(t, err)
	native, err := arch.GetInfo("")
	require.NoError(t, err)
	return filterVM{vm: vm, native: native}
}

// run returns the filter's action for a syscall.
func (f filterVM) run(t *testing.T, auditArch uint32, nr uint32, args ...uint64) uint32 {
	t.Helper()
	// struct seccomp_data {int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];}
	// as the kernel lays it out; the interpreter loads words big-endian, so
	// each 32-bit word is handed to it so.
	data := make([]byte, 64)
	binary.NativeEndian.PutUint32(data[0:], nr)
	binary.NativeEndian.PutUint32(data[4:], auditArch)
	for i, a := range args {
		binary.NativeEndian.PutUint64(data[16+8*i:], a)
	}
	for w := 0; w < len(data); w += 4 {
		binary.BigEndian.PutUint32(data[w:], binary.NativeEndian.Uint32(data[w:]))
	}
	out, err := f.vm.Run(data)
	require.NoError(t, err)
	return uint32(out) //nolint:gosec // the interpreter returns the 32-bit action as an int
}

func (f filterVM) nr(t *testing.T, name string) uint32 {
	t.Helper()
	n, ok := f.native.SyscallNames[name]
	require.True(t, ok, name)
	return uint32(n) //nolint:gosec // a syscall number
}

const (
	actAllow       = uint32(seccomp.ActionAllow)
	actKillProcess = uint32(seccomp.ActionKillProcess)
	actEPERM       = uint32(seccomp.ActionErrno) | uint32(unix.EPERM)
	actNoFamily    = uint32(seccomp.ActionErrno) | uint32(socketFamilyErrno)
)

// TestSeccompKillsForeignABIs: a syscall through any arch but the native one
// kills the process, whatever its number, and so does every x32 number on
// x86_64; the native ABI is filtered by the policy.
func TestSeccompKillsForeignABIs(t *testing.T) {
	f := newFilterVM(t)
	arches := []uint32{
		unix.AUDIT_ARCH_AARCH64, unix.AUDIT_ARCH_ALPHA, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_ARMEB,
		unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_IA64, unix.AUDIT_ARCH_LOONGARCH64, unix.AUDIT_ARCH_MIPS,
		unix.AUDIT_ARCH_MIPS64, unix.AUDIT_ARCH_MIPS64N32, unix.AUDIT_ARCH_MIPSEL, unix.AUDIT_ARCH_MIPSEL64,
		unix.AUDIT_ARCH_PARISC, unix.AUDIT_ARCH_PPC, unix.AUDIT_ARCH_PPC64, unix.AUDIT_ARCH_PPC64LE,
		unix.AUDIT_ARCH_RISCV32, unix.AUDIT_ARCH_RISCV64, unix.AUDIT_ARCH_S390, unix.AUDIT_ARCH_S390X,
		unix.AUDIT_ARCH_SPARC, unix.AUDIT_ARCH_SPARC64, unix.AUDIT_ARCH_X86_64, 0, 0xffffffff,
	}
	getpid := f.nr(t, "getpid")
	for _, a := range arches {
		if a == uint32(f.native.ID) {
			require.Equal(t, actAllow, f.run(t, a, getpid), "native getpid")
			continue
		}
		for nr := uint32(0); nr < 1024; nr++ {
			require.Equal(t, actKillProcess, f.run(t, a, nr), "arch %#x, syscall %d", a, nr)
		}
		for _, nr := range []uint32{x32SyscallBit, 0x7fffffff, 0xffffffff} {
			require.Equal(t, actKillProcess, f.run(t, a, nr), "arch %#x, syscall %#x", a, nr)
		}
	}
	if f.native.ID == arch.X86_64.ID {
		for n := uint32(0); n < 1024; n++ {
			require.Equal(t, actKillProcess, f.run(t, uint32(f.native.ID), x32SyscallBit|n), "x32 syscall %d", n)
		}
		require.Equal(t, actKillProcess, f.run(t, uint32(f.native.ID), 0xffffffff), "syscall -1")
	}
}

// TestSeccompPolicy: on the native ABI, the denied syscalls fail with EPERM,
// clone with namespace flags too, and the rest is allowed.
func TestSeccompPolicy(t *testing.T) {
	f := newFilterVM(t)
	native := uint32(f.native.ID)
	for _, name := range deniedSyscalls {
		if _, ok := f.native.SyscallNames[name]; !ok {
			continue // not on this arch (e.g. _sysctl, uselib on arm64)
		}
		require.Equal(t, actEPERM, f.run(t, native, f.nr(t, name)), name)
	}
	for _, name := range []string{"read", "write", "mmap", "getpid", "wait4", "execve"} {
		require.Equal(t, actAllow, f.run(t, native, f.nr(t, name)), name)
	}
	clone := f.nr(t, "clone")
	require.Equal(t, actAllow, f.run(t, native, clone, uint64(unix.SIGCHLD)))
	require.Equal(t, actEPERM, f.run(t, native, clone, uint64(unix.CLONE_NEWUSER|unix.SIGCHLD)))
	require.Equal(t, uint32(seccomp.ActionErrno)|uint32(unix.ENOSYS), f.run(t, native, f.nr(t, "clone3")))
}

// TestSeccompSocketFamilies: socket(2) and socketpair(2) are allowed for
// AF_UNIX alone, of every type and protocol; every other family, up to any
// 32-bit value and with upper bits set (the kernel reads an int), fails with
// EAFNOSUPPORT.
func TestSeccompSocketFamilies(t *testing.T) {
	f := newFilterVM(t)
	native := uint32(f.native.ID)
	families := []uint64{1<<31 - 1, 1 << 31, 1<<32 - 1, 1<<32 | unix.AF_UNIX, 1<<32 | unix.AF_VSOCK, 1<<63 | unix.AF_INET}
	for fam := uint64(0); fam <= 1024; fam++ {
		families = append(families, fam)
	}
	for _, name := range []string{"socket", "socketpair"} {
		nr := f.nr(t, name)
		for _, fam := range families {
			for _, typ := range []uint64{unix.SOCK_STREAM, unix.SOCK_DGRAM, unix.SOCK_RAW, unix.SOCK_SEQPACKET | unix.SOCK_CLOEXEC} {
				want := actNoFamily
				if fam == allowedSocketFamily {
					want = actAllow
				}
				require.Equal(t, want, f.run(t, native, nr, fam, typ, 0), fmt.Sprintf("%s(%#x, %d)", name, fam, typ))
			}
		}
	}
}

package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The escape cases of the syscall surface: syscalls through the ABIs a job
// has no business with, and sockets of the families it has no business with.
// Their programs are in testdata; the tables here say what each attempts and
// what must come of it.

// abiAttempt is one syscall through one entry of the kernel
// (testdata/abi_attempts.py): entry "native", "int80" or "sysenter" (i386) or
// "x32"; args as the program takes them ("pipe", "data+N", strings).
type abiAttempt struct {
	name  string
	entry string
	nr    int
	args  []any
	// control attempts go through the native ABI and must work: they show
	// that the program's machine code runs in the sandbox, so that a refusal
	// of the others is the sandbox's doing.
	control bool
}

// Syscall arguments of the attempts.
const (
	keyctlJoinSessionKeyring = 1          // KEYCTL_JOIN_SESSION_KEYRING
	keySpecProcessKeyring    = 0xfffffffe // KEY_SPEC_PROCESS_KEYRING (-2) as an unsigned 32-bit argument
	uffdFlags                = unix.O_CLOEXEC | 1
	abiMarkerLen             = len("SYSCALL-RAN")
)

// foreignABIs name the entries the attempts go through.
var foreignABIs = map[string]string{"int80": "i386 int $0x80", "sysenter": "i386 sysenter", "x32": "x32"}

// abiAttempts are the attempts through one entry: the keyring, userfaultfd,
// io_uring, socket and namespace syscalls the native filter denies, and
// harmless ones (getpid, a write to the parent's pipe) that show whether the
// ABI itself is refused; and before them the native controls. Syscall
// numbers: arch/x86/entry/syscalls/syscall_32.tbl and syscall_64.tbl (x32
// takes the 64-bit numbers, its own compat calls from 512 on).
func abiAttempts(entry string) []abiAttempt {
	write := []any{"pipe", "data+2048", abiMarkerLen, 0, 0} // the marker, to the parent
	a := []abiAttempt{
		{name: "x86_64 getpid", entry: "native", nr: unix.SYS_GETPID, args: []any{0, 0, 0, 0, 0}, control: true},
		{name: "x86_64 write", entry: "native", nr: unix.SYS_WRITE, args: write, control: true},
	}
	for _, c := range []struct {
		name string
		nr   map[string]int // entry -> number; "sysenter" takes three arguments at most
		args []any
	}{
		{"getpid", map[string]int{"int80": 20, "sysenter": 20, "x32": 39}, []any{0, 0, 0, 0, 0}},
		{"write", map[string]int{"int80": 4, "sysenter": 4, "x32": 1}, write},
		{"keyctl", map[string]int{"int80": 288, "sysenter": 288, "x32": 250}, []any{keyctlJoinSessionKeyring, "toolwire-escape", 0, 0, 0}},
		{"add_key", map[string]int{"int80": 286, "x32": 248}, []any{"user", "toolwire-escape", "secret", 6, keySpecProcessKeyring}},
		{"userfaultfd", map[string]int{"int80": 374, "sysenter": 374, "x32": 323}, []any{uffdFlags, 0, 0, 0, 0}},
		{"io_uring_setup", map[string]int{"int80": 425, "sysenter": 425, "x32": 425}, []any{4, "data+512", 0, 0, 0}},
		{"socket(AF_VSOCK)", map[string]int{"int80": 359, "sysenter": 359, "x32": 41}, []any{unix.AF_VSOCK, unix.SOCK_STREAM, 0, 0, 0}},
		{"unshare(CLONE_NEWUSER)", map[string]int{"int80": 310, "sysenter": 310, "x32": 272}, []any{unix.CLONE_NEWUSER, 0, 0, 0, 0}},
	} {
		if nr, ok := c.nr[entry]; ok {
			a = append(a, abiAttempt{name: foreignABIs[entry] + " " + c.name, entry: entry, nr: nr, args: c.args})
		}
	}
	return a
}

// foreignABICases are the escape cases of the foreign ABIs: one job for all
// the attempts through int $0x80, one for x32, and one job for each attempt
// through sysenter (in gVisor with the ptrace platform, a second sysenter in
// one sandbox makes the Sentry panic: the sandbox dies, contained, and the
// attempts after it would say nothing). After each, the host's kernel must
// hold no key of a job uid.
func foreignABICases(t *testing.T, e *Engine) []escapeCase {
	if goruntime.GOARCH != "amd64" {
		// The foreign ABI of an arm64 host is arm32: its attempts are still
		// to be written. The filter's guard is checked for every arch by
		// TestSeccompKillsForeignABIs.
		t.Fatalf("the foreign-ABI attempts are x86_64 machine code; this host is %s", goruntime.GOARCH)
	}
	program := readTestdata(t, "abi_attempts.py")
	noKeys := func(t *testing.T) {
		for _, uid := range e.UIDs() {
			require.Zero(t, keysOf(t, uid), "the host's kernel holds keys of job uid %d", uid)
		}
	}
	mk := func(name string, attempts []abiAttempt) escapeCase {
		return escapeCase{
			name: name, source: program, input: abiInput(t, attempts),
			check: checkABIAttempts(attempts), after: noKeys,
		}
	}
	cases := []escapeCase{
		mk("syscalls through i386 int $0x80", abiAttempts("int80")),
		mk("syscalls through x32", abiAttempts("x32")),
	}
	all := abiAttempts("sysenter")
	for _, a := range all {
		if !a.control {
			cases = append(cases, mk("syscall through "+a.name, append(all[:2:2], a)))
		}
	}
	return cases
}

// readTestdata returns a file of testdata.
func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return string(b)
}

// abiInput is the program's input for the attempts.
func abiInput(t testing.TB, attempts []abiAttempt) string {
	t.Helper()
	var list [][]any
	for _, a := range attempts {
		list = append(list, append([]any{a.name, a.entry, a.nr}, a.args...))
	}
	b, err := json.Marshal(map[string]any{"attempts": list})
	require.NoError(t, err)
	return string(b)
}

// abiOutcome is what one attempt came to.
type abiOutcome struct {
	Ran    bool `json:"ran"`    // the parent read the marker the attempt writes
	Ret    *int `json:"ret"`    // what the syscall returned, when the code got back
	Signal int  `json:"signal"` // the signal that ended the attempt's process
	Exit   *int `json:"exit"`
}

// checkABIAttempts asserts, attempt by attempt, that nothing through a
// foreign ABI did anything: no marker written, no value but an error
// returned. Under bwrap the seccomp filter kills the process at such a
// syscall (SIGSYS). gVisor's kernel serves none of these ABIs: with the
// ptrace platform, int $0x80 runs the native syscall of that number inside
// gVisor (an error with the attempts' registers), x32 numbers are ENOSYS and
// sysenter ends the process with SIGSEGV.
func checkABIAttempts(attempts []abiAttempt) func(t *testing.T, rt string, out map[string]any) {
	return func(t *testing.T, rt string, out map[string]any) {
		b, err := json.Marshal(out)
		require.NoError(t, err)
		var got map[string]abiOutcome
		require.NoError(t, json.Unmarshal(b, &got))
		require.Len(t, got, len(attempts))
		for _, a := range attempts {
			t.Run(a.name, func(t *testing.T) {
				o, ok := got[a.name]
				require.True(t, ok, "%s: no outcome", rt)
				desc := fmt.Sprintf("%s: ran %t, returned %v, signal %d, exit %v", rt, o.Ran, deref(o.Ret), o.Signal, deref(o.Exit))
				if a.control {
					require.NotNil(t, o.Ret, desc)
					require.GreaterOrEqual(t, *o.Ret, 0, desc)
					require.Equal(t, a.nr == unix.SYS_WRITE, o.Ran, desc)
					return
				}
				require.False(t, o.Ran, "%s: the syscall ran", desc)
				require.True(t, o.Ret == nil || *o.Ret < 0, "%s: the syscall succeeded", desc)
				if rt != RuntimeBwrap {
					return
				}
				if a.entry == "sysenter" && sysenterFaults(t) {
					// This CPU has no sysenter in 64-bit mode: the
					// instruction faults before any kernel entry.
					require.Equal(t, int(syscall.SIGILL), o.Signal, "%s: sysenter must fault on this CPU", desc)
					return
				}
				require.Equal(t, int(syscall.SIGSYS), o.Signal, "%s: the filter must kill a foreign ABI's syscall", desc)
			})
		}
	}
}

// sysenterFaults reports whether this host's CPU raises #UD (SIGILL) for
// sysenter in 64-bit mode, as AMD's and Hygon's do (their CPUs have it in
// legacy mode only; Intel's enter the kernel's compat entry, whose syscalls
// the filter kills).
func sysenterFaults(t testing.TB) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/cpuinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "vendor_id" {
			v = strings.TrimSpace(v)
			return v == "AuthenticAMD" || v == "HygonGenuine"
		}
	}
	t.Fatal("/proc/cpuinfo names no vendor_id")
	return false
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// keysOf returns the keys the kernel counts for uid (/proc/key-users: "uid:
// usage nkeys/nikeys ..."), 0 when it keeps no record of the uid.
func keysOf(t testing.TB, uid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/key-users")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != strconv.Itoa(uid)+":" {
			continue
		}
		n, err := strconv.Atoi(strings.SplitN(f[2], "/", 2)[0])
		require.NoError(t, err, line)
		return n
	}
	return 0
}

// socketFamilies names every address family Linux numbers, 0 to AF_MAX
// (include/linux/socket.h).
var socketFamilies = []string{
	"AF_UNSPEC", "AF_UNIX", "AF_INET", "AF_AX25", "AF_IPX", "AF_APPLETALK", "AF_NETROM", "AF_BRIDGE",
	"AF_ATMPVC", "AF_X25", "AF_INET6", "AF_ROSE", "AF_DECnet", "AF_NETBEUI", "AF_SECURITY", "AF_KEY",
	"AF_NETLINK", "AF_PACKET", "AF_ASH", "AF_ECONET", "AF_ATMSVC", "AF_RDS", "AF_SNA", "AF_IRDA",
	"AF_PPPOX", "AF_WANPIPE", "AF_LLC", "AF_IB", "AF_MPLS", "AF_CAN", "AF_TIPC", "AF_BLUETOOTH",
	"AF_IUCV", "AF_RXRPC", "AF_ISDN", "AF_PHONET", "AF_IEEE802154", "AF_CAIF", "AF_ALG", "AF_NFC",
	"AF_VSOCK", "AF_KCM", "AF_QIPCRTR", "AF_SMC", "AF_XDP", "AF_MCTP", "AF_MAX",
}

// allowedFamilies are the socket families a job may create: AF_UNIX, for
// what the standard library does within one process tree (socketpair for
// asyncio and multiprocessing). The jobs have no network (bwrap's and
// gVisor's network namespaces hold only a loopback) and no policy that gives
// them one, so AF_INET and AF_INET6 are refused too.
var allowedFamilies = map[int]bool{unix.AF_UNIX: true}

// probedFamilies are the families the test tries: every number to AF_MAX,
// some past it, and numbers whose upper 32 bits are set (the kernel reads an
// int: 1<<32|AF_VSOCK is AF_VSOCK to it).
func probedFamilies() []int {
	var out []int
	for f := 0; f <= unix.AF_MAX; f++ {
		out = append(out, f)
	}
	return append(out, 47, 63, 64, 255, 256, 1<<16, 1<<31-1, 1<<32|unix.AF_VSOCK, 1<<32|unix.AF_INET, 1<<32|unix.AF_NETLINK)
}

func familyName(f int) string {
	if f >= 0 && f < len(socketFamilies) {
		return fmt.Sprintf("%s(%d)", socketFamilies[f], f)
	}
	if lo := f & 0xffffffff; f != lo && lo < len(socketFamilies) {
		return fmt.Sprintf("%s(1<<32|%d)", socketFamilies[lo], lo)
	}
	return fmt.Sprintf("AF_%d", f)
}

func socketFamiliesInput(t testing.TB) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"families": probedFamilies()})
	require.NoError(t, err)
	return string(b)
}

// checkSocketFamilies asserts, family by family, that a job creates sockets
// of the allowed families and of no other: every other attempt fails with
// EAFNOSUPPORT or EPERM.
func checkSocketFamilies(t *testing.T, rt string, out map[string]any) {
	require.Len(t, out, len(probedFamilies()))
	for _, f := range probedFamilies() {
		t.Run(familyName(f), func(t *testing.T) {
			raw, ok := out[strconv.Itoa(f)].(map[string]any)
			require.True(t, ok, "%s: no outcome", rt)
			if allowedFamilies[f] {
				for _, k := range []string{"socket stream", "socket dgram", "socket seqpacket", "socketpair"} {
					require.Equal(t, "ok", raw[k], "%s: %s must work: %v", rt, k, raw)
				}
				return
			}
			for k, v := range raw {
				require.Contains(t, []any{"EAFNOSUPPORT", "EPERM"}, v, "%s: %s: %v", rt, k, raw)
			}
		})
	}
}

package sandbox

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/toolwire/toolwire/pkg/envelope"
	"github.com/toolwire/toolwire/pkg/events"
)

// escapeCase is one attempt of untrusted code to break out, exhaust the host
// or leave something behind. It is contained when the result is the wanted
// error (code and limit) or the output check passes.
type escapeCase struct {
	name    string
	source  string
	input   string // JSON given on stdin; "" for null
	timeout time.Duration
	limits  *events.SandboxLimits
	// The wanted error: code, and the limits any of which may be reported
	// (a runtime may stop the code at another of its walls).
	code    envelope.ErrorCode
	limits2 map[string][]string // runtime -> accepted limits; "" key for both
	// check inspects the output of a case that must succeed.
	check func(t *testing.T, rt string, out map[string]any)
	// after runs on the host once the job is over.
	after func(t *testing.T)
}

// canaryEnv is a variable of the service's own environment that no job may see.
const canaryEnv = "TOOLWIRE_SANDBOX_TEST_CANARY"

// TestEscapeSuite runs every escape case against both runtimes. After each
// case the host must be clean (no process of a job uid, no job cgroup, no
// runsc container or process, nothing written outside the sandbox) and the
// next job, in the same runtime, must see a fresh sandbox.
func TestEscapeSuite(t *testing.T) {
	canary := "canary-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Setenv(canaryEnv, canary) // the service's environment, from here on
	e := newTestEngine(t, Config{})

	hostDir := t.TempDir()
	canaryFile := filepath.Join(hostDir, "secret.txt")
	require.NoError(t, os.WriteFile(canaryFile, []byte(canary), 0o644)) //nolint:gosec // world-readable on purpose: only isolation may hide it
	// A host service on loopback that no job may reach.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	hostPort := ln.Addr().(*net.TCPAddr).Port
	socketProgram := readTestdata(t, "socket_families.py")
	cfgJSON, err := json.Marshal(map[string]any{"port": hostPort, "path": canaryFile, "dir": hostDir})
	require.NoError(t, err)

	failedNoWrite := func(t *testing.T, rt string, out map[string]any) {
		for target, v := range out {
			if target == "/tmp/ok" {
				// bwrap: /tmp is the work directory; gVisor: a tmpfs of its own.
				want := map[string]string{RuntimeBwrap: "/work/ok", RuntimeGVisor: "/tmp/ok"}[rt]
				require.Equal(t, want, v)
				continue
			}
			s, _ := v.(string)
			require.NotEqual(t, "WRITTEN", s, "%s: wrote %s", rt, target)
			require.True(t, strings.Contains(s, "Error"), "%s: %s: %s", rt, target, s)
		}
	}

	cases := []escapeCase{
		{
			name:   "fork bomb",
			source: "import os\nwhile True:\n    os.fork()\n",
			code:   envelope.CodeSandboxError, limits2: map[string][]string{"": {LimitProcesses}},
		},
		{
			name:   "memory bomb",
			source: "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n",
			code:   envelope.CodeSandboxError, limits2: map[string][]string{"": {LimitMemory}},
		},
		{
			name: "memory bomb across processes",
			source: `import os, sys, time
pids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        x = []
        try:
            while True:
                x.append(b"x" * (8 << 20))
        except MemoryError:
            time.sleep(60)
        os._exit(0)
    pids.append(pid)
for _ in pids:
    _, st = os.wait()
    if os.WIFSIGNALED(st):
        sys.exit("worker killed by signal %d" % os.WTERMSIG(st))
`,
			timeout: 20 * time.Second,
			code:    envelope.CodeSandboxError, limits2: map[string][]string{"": {LimitMemory}},
		},
		{
			name:    "infinite loop",
			source:  "while True:\n    pass\n",
			timeout: 2 * time.Second,
			code:    envelope.CodeTimeout, limits2: map[string][]string{"": {LimitWallTime}},
		},
		{
			name:    "sleep",
			source:  "import time\ntime.sleep(600)\n",
			timeout: 2 * time.Second,
			code:    envelope.CodeTimeout, limits2: map[string][]string{"": {LimitWallTime}},
		},
		{
			// Children in sessions of their own that ignore SIGTERM (and
			// SIGHUP, SIGINT), one spinning and one sleeping, and a parent
			// that waits for them.
			name: "children that ignore SIGTERM",
			source: `import os, signal, time
for spin in (True, False):
    if os.fork() == 0:
        os.setsid()
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        while True:
            if not spin:
                time.sleep(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.wait()
os.wait()
`,
			timeout: 2 * time.Second,
			code:    envelope.CodeTimeout, limits2: map[string][]string{"": {LimitWallTime}},
		},
		{
			// gVisor does not enforce RLIMIT_CPU: its wall-clock timeout does.
			name:    "cpu time",
			source:  "while True:\n    pass\n",
			timeout: 8 * time.Second,
			limits:  &events.SandboxLimits{CPUSeconds: 1},
			code:    envelope.CodeTimeout,
			limits2: map[string][]string{RuntimeBwrap: {LimitCPUTime}, RuntimeGVisor: {LimitWallTime}},
		},
		{
			name:   "disk fill",
			source: "i = 0\nwhile True:\n    with open('/work/fill%d' % i, 'wb') as f:\n        f.write(b'x' * (1 << 20))\n    i += 1\n",
			code:   envelope.CodeSandboxError, limits2: map[string][]string{"": {LimitDisk}},
		},
		{
			name:   "one huge file",
			source: "with open('/tmp/big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n",
			code:   envelope.CodeSandboxError, limits2: map[string][]string{"": {LimitDisk}},
		},
		{
			name:   "output flood",
			source: "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
			code:   envelope.CodeSandboxError, limits2: map[string][]string{"": {LimitOutput}},
		},
		{
			name: "network egress",
			source: `import json, socket, sys
cfg = json.load(sys.stdin)
res = {}
def tcp(host, port):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError as e:
        return "%s: %s" % (type(e).__name__, e)
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "CONNECTED"
    except OSError as e:
        return "%s: %s" % (type(e).__name__, e)
    finally:
        s.close()
for host, port in [("1.1.1.1", 443), ("1.1.1.1", 53), ("127.0.0.1", 4222), ("127.0.0.1", 5432),
                   ("127.0.0.1", cfg["port"]), ("169.254.169.254", 80)]:
    res["tcp %s:%d" % (host, port)] = tcp(host, port)
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("1.1.1.1", 53))
    res["udp 1.1.1.1:53"] = "SENT"
except OSError as e:
    res["udp 1.1.1.1:53"] = "%s: %s" % (type(e).__name__, e)
for name in ["example.com", "metadata.google.internal"]:
    try:
        socket.getaddrinfo(name, 443)
        res["dns " + name] = "RESOLVED"
    except OSError as e:
        res["dns " + name] = "%s: %s" % (type(e).__name__, e)
# The interfaces of the job's network namespace, from /proc: listing them
# through a netlink socket (socket.if_nameindex) is refused.
with open("/proc/net/dev") as f:
    res["interfaces"] = [l.split(":")[0].strip() for l in f.readlines()[2:]]
print(json.dumps(res))
`,
			input: string(cfgJSON),
			check: func(t *testing.T, rt string, out map[string]any) {
				require.Equal(t, []any{"lo"}, out["interfaces"], "%s: the only interface is the sandbox's own loopback", rt)
				delete(out, "interfaces")
				require.Len(t, out, 9)
				for k, v := range out {
					s, _ := v.(string)
					require.NotContains(t, []string{"CONNECTED", "SENT", "RESOLVED"}, s, "%s: %s", rt, k)
					require.Contains(t, s, "[Errno", "%s: %s: %s", rt, k, s)
				}
			},
			after: func(t *testing.T) {
				require.Zero(t, accepted.Load(), "a job reached the host's loopback")
			},
		},
		{
			name: "host secrets",
			source: `import glob, json, os, sys
cfg = json.load(sys.stdin)
found = {"environ": dict(os.environ)}
for p in sorted(glob.glob("/proc/*/environ")):
    try:
        found[p] = open(p, "rb").read().decode(errors="replace")
    except OSError as e:
        found[p] = type(e).__name__
for p in [cfg["path"], cfg["dir"], "/etc/shadow", "/etc/passwd", "/etc/hostname", "/root", "/home",
          "/proc/1/root/etc/hostname", "/proc/1/cwd"]:
    try:
        found[p] = os.listdir(p) if os.path.isdir(p) else open(p).read()
    except OSError as e:
        found[p] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(found))
`,
			input: string(cfgJSON),
			check: func(t *testing.T, rt string, out map[string]any) {
				b, err := json.Marshal(out)
				require.NoError(t, err)
				require.NotContains(t, string(b), canary, "%s: the canary leaked", rt)
				require.NotContains(t, string(b), canaryEnv, "%s: the service's environment leaked", rt)
				require.Contains(t, out[canaryFile], "FileNotFoundError", rt)
				require.Contains(t, out[hostDir], "FileNotFoundError", rt)
				require.Contains(t, out["/etc/shadow"], "FileNotFoundError", rt)
				require.Contains(t, out["/root"], "FileNotFoundError", rt)
				require.Contains(t, out["/home"], "FileNotFoundError", rt)
				env, ok := out["environ"].(map[string]any)
				require.True(t, ok)
				for k := range env {
					require.Contains(t, []string{"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PWD"}, k,
						"%s: %s is not on the allow-list", rt, k)
				}
				require.NotEmpty(t, out["/proc/1/environ"], "%s: /proc/1/environ was read (and holds no canary)", rt)
			},
		},
		{
			name: "write outside the work directory",
			source: `import json, os, sys
cfg = json.load(sys.stdin)
res = {}
for p in ["/x", "/usr/x", "/usr/bin/x", "/usr/local/x", "/etc/x", "/job/main.py", "/job/x",
          "/proc/sys/kernel/hostname", "/dev/x", "/dev/shm/x", "/sys/x", cfg["dir"] + "/written"]:
    try:
        with open(p, "w") as f:
            f.write("escaped")
        res[p] = "WRITTEN"
    except OSError as e:
        res[p] = "%s: %s" % (type(e).__name__, e)
with open("/tmp/ok", "w") as f:
    f.write("fine")
res["/tmp/ok"] = os.path.realpath("/tmp/ok")
print(json.dumps(res))
`,
			input: string(cfgJSON),
			check: failedNoWrite,
			after: func(t *testing.T) {
				require.NoFileExists(t, filepath.Join(hostDir, "written"))
				require.NoFileExists(t, "/usr/x")
				require.NoFileExists(t, "/x")
				b, err := os.ReadFile(canaryFile)
				require.NoError(t, err)
				require.Equal(t, canary, string(b))
			},
		},
		{
			// Only AF_UNIX: AF_VSOCK reaches a VM's host whatever the network
			// namespace, AF_NETLINK, AF_PACKET, AF_ALG... are kernel surface.
			name:   "socket families",
			source: socketProgram,
			input:  socketFamiliesInput(t),
			check:  checkSocketFamilies,
		},
		{
			name: "left behind for the next job",
			source: `import json, os, subprocess, time
with open("/work/leftover", "w") as f:
    f.write("from the last job")
with open("/tmp/leftover2", "w") as f:
    f.write("from the last job")
p = subprocess.Popen(["/usr/bin/python3", "-c", "import time\nwhile True: time.sleep(1)"],
                     start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            time.sleep(1)
    os._exit(0)
print(json.dumps({"background": p.pid}))
`,
			check: func(t *testing.T, rt string, out map[string]any) {
				require.NotZero(t, out["background"], rt)
			},
		},
	}

	// i386 (int $0x80, sysenter) and x32 syscalls: the seccomp filter of bwrap
	// kills a process at the first one; gVisor has no such entries. Nothing
	// of what they ask for may happen.
	cases = append(cases, foreignABICases(t, e)...)

	// next is the job that runs after every case: it must see an empty work
	// directory and no process but its own (and bwrap's init).
	const next = `import json, os
procs = {}
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            procs[p] = open("/proc/%s/cmdline" % p, "rb").read().replace(b"\0", b" ").decode().strip()
        except OSError:
            pass
print(json.dumps({"work": sorted(os.listdir("/work")), "procs": procs, "me": str(os.getpid())}))
`
	for _, rt := range []string{RuntimeGVisor, RuntimeBwrap} {
		t.Run(rt, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					timeout := c.timeout
					if timeout == 0 {
						timeout = 10 * time.Second
					}
					job := testJob(rt, c.source, c.input, timeout)
					job.Limits = c.limits
					res := run(t, e, job)
					require.Equal(t, rt, res.Runtime)
					if c.check != nil {
						require.Nil(t, res.Error, "stderr: %s", res.Stderr)
						var out map[string]any
						require.NoError(t, json.Unmarshal(res.Output, &out))
						c.check(t, rt, out)
					} else {
						d := details(t, res)
						require.Equal(t, c.code, res.Error.Code, "%s (stderr: %s)", res.Error.Message, res.Stderr)
						want := c.limits2[rt]
						if want == nil {
							want = c.limits2[""]
						}
						require.Contains(t, want, d.Limit, "%s: %s", res.Error.Message, d.Stderr)
						require.Equal(t, rt, d.Runtime)
						t.Logf("%s: %s %s (limit %s) in %d ms", rt, res.Error.Code, res.Error.Message, d.Limit, res.DurationMS)
					}
					if c.after != nil {
						c.after(t)
					}
					assertHostClean(t, e)

					// The next job finds a fresh sandbox.
					nres := run(t, e, testJob(rt, next, "", 10*time.Second))
					require.Nil(t, nres.Error, "the next job failed: %+v", nres.Error)
					var seen struct {
						Work  []string          `json:"work"`
						Procs map[string]string `json:"procs"`
						Me    string            `json:"me"`
					}
					require.NoError(t, json.Unmarshal(nres.Output, &seen))
					require.Empty(t, seen.Work, "the next job sees files of the last one")
					for pid, cmd := range seen.Procs {
						if pid == seen.Me || strings.HasPrefix(cmd, "/usr/bin/bwrap ") {
							continue
						}
						t.Fatalf("the next job sees process %s (%q) besides itself", pid, cmd)
					}
					assertHostClean(t, e)
				})
			}
		})
	}
}

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
//
// A host kernel that serves no int $0x80 (its IA-32 emulation is off, or the
// hypervisor it runs under has no such gate) faults the instruction itself,
// unconfined too: there, the attempts through it end with SIGSEGV before any
// syscall, and the filter never sees them.
func checkABIAttempts(attempts []abiAttempt) func(t *testing.T, rt string, out map[string]any) {
	var hostInt80 sync.Once
	int80Faults := false
	return func(t *testing.T, rt string, out map[string]any) {
		hostInt80.Do(func() { int80Faults = hostFaultsInt80(t) })
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
				if a.entry == "int80" && int80Faults {
					require.Equal(t, int(syscall.SIGSEGV), o.Signal, "%s: int $0x80 faults on this host, unconfined too", desc)
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

// hostFaultsInt80 reports whether this host's kernel faults int $0x80 (no
// IA-32 syscall gate): the attempts' program, run on the host without any
// sandbox, makes a getpid through it, and the child ends with SIGSEGV without
// a return. Anything else than that or a return of the pid fails the test.
func hostFaultsInt80(t testing.TB) bool {
	t.Helper()
	in := abiInput(t, []abiAttempt{{name: "int80 getpid", entry: "int80", nr: 20, args: []any{0, 0, 0, 0, 0}}})
	cmd := exec.CommandContext(t.Context(), DefaultPython, filepath.Join("testdata", "abi_attempts.py")) //nolint:gosec // our own test program
	cmd.Stdin = strings.NewReader(in)
	b, err := cmd.Output()
	require.NoError(t, err, "the attempts' program on the host")
	var got map[string]abiOutcome
	require.NoError(t, json.Unmarshal(b, &got), "%s", b)
	o, ok := got["int80 getpid"]
	require.True(t, ok, "%s", b)
	if o.Ret == nil && o.Signal == int(syscall.SIGSEGV) {
		t.Logf("this host's kernel faults int $0x80 (SIGSEGV unconfined): the attempts through it are expected to end so")
		return true
	}
	require.NotNil(t, o.Ret, "int $0x80 getpid on the host: %+v", o)
	require.Positive(t, *o.Ret, "int $0x80 getpid on the host returns a pid")
	return false
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

package sandbox

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

# Syscalls through every ABI an x86_64 kernel may accept besides the native
# one: i386 through `int $0x80` and through `sysenter` (the compat entries,
# seccomp_data.arch AUDIT_ARCH_I386) and x32 (the native entry with
# __X32_SYSCALL_BIT set in the number). The attempts are machine code, mapped
# executable below 4 GiB (the i386 ABI passes 32-bit pointers) and called
# through ctypes; each runs in a child process of its own, so that an attempt
# the sandbox kills does not end the others.
#
# Every attempt reports how its child ended and what the syscall returned,
# when the code got back to Python at all: `sysenter` never does (the kernel
# returns to the 32-bit vDSO, which a 64-bit process does not have), so an
# attempt through it shows that it ran by its effect, e.g. a write to the
# pipe the parent reads.
#
# Input: {"attempts": [[name, entry, nr, a1, a2, a3, a4, a5], ...]}. entry is
# "native", "int80", "sysenter" (three arguments at most) or "x32" (nr is
# then ORed with the x32 bit). An argument "data+N" is replaced by the address
# of a zeroed page below 4 GiB plus N ("marker" is there, at "data+2048"),
# "pipe" by the fd of the pipe to the parent. "ran" says that the parent read
# the marker. Any other string is passed as a pointer to a copy of it there.
import ctypes
import json
import mmap
import os
import sys

MAP_32BIT = 0x40
X32_BIT = 0x40000000
PROT = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC


def low(size, prot):
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_32BIT, prot=prot)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


# Each stub is called as f(nr, a1, a2, a3, a4, a5): System V passes them in
# rdi, rsi, rdx, rcx, r8, r9.
STUBS = {
    # push rbx; eax=nr; ebx=a1; ecx=a2; edx=a3; esi=a4; edi=a5; int 0x80; pop rbx; ret
    "int80": "53" "89f8" "89f3" "4989d3" "89ca" "4489d9" "4489c6" "4489cf" "cd80" "5b" "c3",
    # rax=nr; rdi=a1; rsi=a2; rdx=a3; r10=a4; r8=a5; syscall; ret
    "native": "4889f8" "4889f7" "4889d6" "4889ca" "4d89c2" "4d89c8" "0f05" "c3",
    # eax=nr; ebx=a1; ecx=a2; edx=a3; rsp=a5 (a stack below 4 GiB: the kernel
    # reads the user's ebp from [esp]); ebp=esp; sysenter; ud2
    "sysenter": "89f8" "89f3" "4989d2" "89ca" "4489d1" "4c89cc" "89e5" "0f34" "0f0b",
}


def main():
    req = json.load(sys.stdin)
    code, code_addr = low(4096, PROT)
    fn_type = ctypes.CFUNCTYPE(ctypes.c_long, *[ctypes.c_long] * 6)
    fns = {}
    off = 0
    for entry, hexcode in STUBS.items():
        b = bytes.fromhex(hexcode)
        code[off:off + len(b)] = b
        fns[entry] = fn_type(code_addr + off)
        off += 256
    fns["x32"] = fns["native"]
    res = {}
    for name, entry, nr, *args in req["attempts"]:
        res[name] = attempt(fns, entry, nr, args)
    print(json.dumps(res))


def attempt(fns, entry, nr, args):
    data, data_addr = low(3 * 4096, mmap.PROT_READ | mmap.PROT_WRITE)
    marker = b"SYSCALL-RAN"
    data[2048:2048 + len(marker)] = marker

    strings = [256]  # where the next string argument goes

    def arg(a):
        if not isinstance(a, str):
            return a
        if a.startswith("data+"):
            return data_addr + int(a[5:])
        at = strings[0]
        b = a.encode() + b"\0"
        data[at:at + len(b)] = b
        strings[0] += len(b)
        return data_addr + at

    r, w = os.pipe()
    args = [w if a == "pipe" else arg(a) for a in args]
    if entry == "x32":
        nr |= X32_BIT
    if entry == "sysenter":
        args[4] = data_addr + 3 * 4096 - 64  # the stack
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            ret = fns[entry](nr, *args)
            os.write(w, b"RET " + str(ctypes.c_int(ret).value).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = b""
    while True:
        b = os.read(r, 256)
        if not b:
            break
        got += b
    os.close(r)
    _, st = os.waitpid(pid, 0)
    out = {"ran": marker in got, "ret": None}
    if b"RET " in got:
        out["ret"] = int(got.split(b"RET ", 1)[1])
    if os.WIFSIGNALED(st):
        out["signal"] = os.WTERMSIG(st)
    else:
        out["exit"] = os.WEXITSTATUS(st)
    return out


main()

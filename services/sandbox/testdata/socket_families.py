# Tries to create a socket of every family it is given, with every socket
# type, through socket(2) and socketpair(2) called directly (libc's syscall(),
# so that a family is passed as the full 64-bit register the filter sees,
# upper bits included).
#
# Input: {"families": [n, ...]}. Output: {"<n>": {"socket <type>": "ok" or the
# errno's name, "socketpair": ...}}.
import ctypes
import errno
import json
import os
import sys

SYS_SOCKET, SYS_SOCKETPAIR = 41, 53
TYPES = {"stream": 1, "dgram": 2, "raw": 3, "rdm": 4, "seqpacket": 5, "packet": 10}

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def call(nr, *args):
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if ret < 0:
        e = ctypes.get_errno()
        return None, errno.errorcode.get(e, str(e))
    return ret, "ok"


res = {}
for fam in json.load(sys.stdin)["families"]:
    r = {}
    for name, typ in TYPES.items():
        fd, r["socket " + name] = call(SYS_SOCKET, fam, typ, 0)
        if fd is not None:
            os.close(fd)
    pair = (ctypes.c_int * 2)()
    ok, r["socketpair"] = call(SYS_SOCKETPAIR, fam, 1, 0, ctypes.addressof(pair))
    if ok is not None:
        os.close(pair[0])
        os.close(pair[1])
    res[str(fam)] = r
print(json.dumps(res))

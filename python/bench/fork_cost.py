"""What a fork costs a process holding pinned memory, and whether the forked
child can read that memory: numapin's (``MADV_DONTFORK``) beside the same
memory without it, and beside torch's own pinned memory.

    python3 python/bench/fork_cost.py [--gib 1,4] [--reps 3] [--json]

Each case runs in a child process of its own that holds ``--gib`` GiB,
forks ``--reps`` times, and reports the best time until ``fork`` returned
in the parent and until the child (which reads the memory's first and last
bytes, unless the case's memory is not mapped in it) has exited and been
waited for, and whether the child could read it:

- ``numapin``: ``numapin.empty`` (its regions are ``MADV_DONTFORK``: the
  child has no pages there; it reads nothing);
- ``private, locked``: the same kind of mapping (private, anonymous,
  ``mlock``-ed) without ``MADV_DONTFORK``: the child shares its pages
  copy-on-write;
- ``private, long-term pinned``: that mapping also pinned as a driver pins
  host memory it registers (``pin_user_pages(FOLL_LONGTERM)``): with CUDA,
  ``cudaHostRegister`` (what numapin's regions are, less
  ``MADV_DONTFORK``); without CUDA, io_uring's registered buffers, which
  the kernel pins the same way. Linux copies such pages into the child at
  the fork (it cannot share them copy-on-write while a device may write
  them), so the fork copies every byte;
- ``torch pinned`` (CUDA only): ``torch.empty(..., pin_memory=True)``
  (``cudaHostAlloc``);
- ``shared``: a ``MAP_SHARED`` anonymous mapping, which a child shares
  without copying (numapin's ``SharedBuffer`` is one, ``MADV_DONTFORK``
  too).

Without CUDA the CUDA cases are skipped; the rest runs anywhere (root, or a
memlock limit of ``--gib``, for the locked cases).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
import time

CASES = ["numapin", "private, locked", "private, long-term pinned", "torch pinned", "shared"]

CHILD = r'''
import ctypes, mmap, os, sys, time, json
case, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.syscall.restype = ctypes.c_long
keep = []

def mapping(shared):
    flags = (mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE) | mmap.MAP_ANONYMOUS
    p = libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    ctypes.memset(p, 1, n)
    if not shared and libc.mlock(ctypes.c_void_p(p), ctypes.c_size_t(n)) != 0:
        raise OSError(ctypes.get_errno(), "mlock (raise ulimit -l, or run as root)")
    return p

def long_term_pin(p):
    """cudaHostRegister with CUDA, else io_uring registered buffers."""
    try:
        import torch
        if torch.cuda.is_available():
            err = torch.cuda.cudart().cudaHostRegister(p, n, 0)
            if int(err) != 0:
                raise OSError(f"cudaHostRegister: {err}")
            return "cudaHostRegister"
    except ImportError:
        pass
    class Params(ctypes.Structure):
        _fields_ = [("b", ctypes.c_uint8 * 120)]
    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    params = Params()
    fd = libc.syscall(425, 4, ctypes.byref(params))  # io_uring_setup
    if fd < 0:
        raise OSError(ctypes.get_errno(), "io_uring_setup")
    piece = 1 << 30
    k = (n + piece - 1) // piece
    iov = (Iovec * k)(*[Iovec(p + i * piece, min(piece, n - i * piece)) for i in range(k)])
    if libc.syscall(427, fd, 0, iov, k) < 0:  # io_uring_register(IORING_REGISTER_BUFFERS)
        raise OSError(ctypes.get_errno(), "io_uring_register")
    keep.append(fd)
    return "io_uring registered buffers"

how = ""
if case == "numapin":
    import numapin
    t = numapin.empty((n,), "uint8", like="numpy")
    t.fill(1)
    keep.append(t)
    p, readable = t.ctypes.data, False
elif case == "torch pinned":
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"})); sys.exit(0)
    t = torch.ones(n, dtype=torch.uint8, pin_memory=True)
    keep.append(t)
    p, readable = t.data_ptr(), True
else:
    p = mapping(case == "shared")
    readable = True
    if case == "private, long-term pinned":
        how = long_term_pin(p)
forks, waits, status = [], [], None
for _ in range(reps):
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        if readable:
            first = ctypes.c_uint8.from_address(p).value
            last = ctypes.c_uint8.from_address(p + n - 1).value
            os._exit(0 if first == last == 1 else 3)
        os._exit(0)
    t1 = time.perf_counter()
    _, st = os.waitpid(pid, 0)
    t2 = time.perf_counter()
    forks.append(t1 - t0)
    waits.append(t2 - t0)
    status = os.waitstatus_to_exitcode(st)
print(json.dumps({"fork_ms": min(forks) * 1e3, "fork_exit_wait_ms": min(waits) * 1e3,
                  "child": "read it" if readable and status == 0 else
                           ("not mapped there (not read)" if not readable else f"exit {status}"),
                  "how": how}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", default="1,4", help="GiB held, a comma list (default 1,4)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for gib in [float(g) for g in a.gib.split(",")]:
        n = int(gib * (1 << 30))
        for case in CASES:
            r = subprocess.run([sys.executable, "-c", CHILD, case, str(n), str(a.reps)],
                               capture_output=True, text=True, timeout=600)
            try:
                row = json.loads(r.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                row = {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
            row.update(case=case, gib=gib)
            rows.append(row)
            if not a.json:
                if "fork_ms" in row:
                    print(f"{gib:5.1f} GiB  {case:27s} fork {row['fork_ms']:9.2f} ms   fork+exit+wait "
                          f"{row['fork_exit_wait_ms']:9.2f} ms   child: {row['child']}"
                          + (f"   ({row['how']})" if row.get("how") else ""))
                else:
                    print(f"{gib:5.1f} GiB  {case:27s} {row.get('skipped') or row.get('error')}")
    if a.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

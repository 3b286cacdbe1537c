"""Probe: many ranks loading one hot checkpoint, each rank's share split
between numapin's copying reader and DMA straight from the page cache.

Each of ``--ranks`` processes (one per GPU) takes its share
(``safetensors_shards(index, ranks)[rank]``), cuts the last fraction ``F``
of its bytes off at a tensor boundary, loads the rest with
``load_safetensors(names=...)`` and, on a thread beside it, the cut-off
tensors' byte range by zero copy: the file ``mmap``-ed read-only,
registered ``PART_MIB`` at a time with ``cuMemHostRegister`` and
``CU_MEMHOSTREGISTER_READ_ONLY``, copied to one device buffer, each part
unregistered once its copy is done (one part in flight behind the next
registration). Both start after a barrier; the aggregate is all ranks'
bytes from the first start to the last end. The fractions are interleaved
in each repetition, so ``0`` (the reader alone) is the same run's baseline.

    python3 python/bench/hybrid_probe.py [--gib 8] [--ranks 4] [--reps 3]
        [--fractions 0,0.1,0.2,0.3] [--part-mib 64]

Prints one JSON line per fraction: the aggregate rate by repetition, and
per rank the reader's and the zero-copy thread's seconds (register,
unregister, all). Needs torch with CUDA and the driver's libcuda.so.1. A
probe for the design, not an example.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import sys
import threading
import time
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")


def header(path: str) -> tuple[int, dict[str, Any]]:
    """A safetensors file's data start and its tensors' entries."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))
    meta.pop("__metadata__", None)
    return 8 + n, meta


def split(index: str, names: list[str], frac: float) -> tuple[list[str], list[tuple[str, int, int]]]:
    """The names the reader loads and the byte ranges ``(file, offset,
    len)`` zero copy takes: the share's last ``frac`` of bytes, whole
    tensors, one contiguous range a file."""
    d = os.path.dirname(index)
    with open(index) as f:
        wmap = json.load(f)["weight_map"]
    where = []
    heads: dict[str, tuple[int, dict[str, Any]]] = {}
    for n in names:
        p = os.path.join(d, wmap[n])
        if p not in heads:
            heads[p] = header(p)
        start, meta = heads[p]
        a, b = meta[n]["data_offsets"]
        where.append((p, start + a, b - a, n))
    where.sort()
    total = sum(w[2] for w in where)
    cut, acc = len(where), 0
    while cut > 0 and acc + where[cut - 1][2] <= frac * total:
        cut -= 1
        acc += where[cut][2]
    ranges: dict[str, list[int]] = {}
    for p, off, n, _ in where[cut:]:
        r = ranges.setdefault(p, [off, off])
        r[0], r[1] = min(r[0], off), max(r[1], off + n)
    return [w[3] for w in where[:cut]], [(p, a, b - a) for p, (a, b) in ranges.items()]


class Cuda:
    """The driver calls zero copy needs, on a thread of its own."""

    def __init__(self, ordinal: int) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.ok(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal))
        self.ok(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.ok(self.lib.cuCtxSetCurrent(ctx))
        self.stream = ctypes.c_void_p()
        self.ok(self.lib.cuStreamCreate(ctypes.byref(self.stream), 1))

    @staticmethod
    def ok(rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"CUDA driver error {rc}")

    def event(self) -> ctypes.c_void_p:
        e = ctypes.c_void_p()
        self.ok(self.lib.cuEventCreate(ctypes.byref(e), 2))  # CU_EVENT_DISABLE_TIMING
        self.ok(self.lib.cuEventRecord(e, self.stream))
        return e

    def done(self, e: ctypes.c_void_p) -> None:
        self.ok(self.lib.cuEventSynchronize(e))
        self.lib.cuEventDestroy_v2(e)


def zero_copy(ordinal: int, ranges: list[tuple[str, int, int]], dst: int, part: int, out: dict[str, float]) -> None:
    """Each range to ``dst`` onwards by DMA from the page cache."""
    from zerocopy_probe import libc as typed_libc

    libc = typed_libc()
    t0 = time.perf_counter()
    cu = Cuda(ordinal)
    reg = unreg = 0.0
    for path, off, n in ranges:
        base = off // PAGE * PAGE
        size = off + n - base
        fd = os.open(path, os.O_RDONLY)
        addr = libc.mmap(None, size, 1, 1, fd, base)  # PROT_READ, MAP_SHARED
        os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        pending = None
        o = off - base
        while o < size:
            a = o // PAGE * PAGE
            b = min(size, (o + part) // PAGE * PAGE if o + part < size else size)
            t = time.perf_counter()
            cu.ok(cu.lib.cuMemHostRegister_v2(ctypes.c_void_p(addr + a), ctypes.c_size_t(b - a), 8))
            reg += time.perf_counter() - t
            cu.ok(cu.lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dst), ctypes.c_void_p(addr + o), ctypes.c_size_t(b - o),
                                              cu.stream))
            dst += b - o
            ev = cu.event()
            if pending is not None:
                t = time.perf_counter()
                cu.done(pending[1])
                cu.lib.cuMemHostUnregister(ctypes.c_void_p(pending[0]))
                unreg += time.perf_counter() - t
            pending = (addr + a, ev)
            o = b
        if pending is not None:
            t = time.perf_counter()
            cu.done(pending[1])
            cu.lib.cuMemHostUnregister(ctypes.c_void_p(pending[0]))
            unreg += time.perf_counter() - t
        libc.munmap(ctypes.c_void_p(addr), size)
    out.update(zc_s=time.perf_counter() - t0, register_s=reg, unregister_s=unreg)


def rank(r: int, world: int, index: str, fracs: list[float], reps: int, part: int, barrier, q) -> None:  # type: ignore[no-untyped-def]
    import torch

    import numapin

    torch.cuda.set_device(r)
    dev = torch.device("cuda", r)
    numapin.load_safetensors(os.path.join(os.path.dirname(index), "warmup.safetensors"), device=dev)
    share = numapin.safetensors_shards(index, world)[r]
    plans = [split(index, share, f) for f in fracs]
    for rep in range(reps):
        for k, (names, ranges) in enumerate(plans):
            zbytes = sum(n for _, _, n in ranges)
            dst = torch.empty(max(zbytes, 1), dtype=torch.uint8, device=dev)
            torch.cuda.synchronize(dev)
            barrier.wait()
            t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
            zc: dict[str, float] = {}
            th = threading.Thread(target=zero_copy, args=(r, ranges, dst.data_ptr(), part, zc)) if ranges else None
            if th:
                th.start()
            t = time.perf_counter()
            out = numapin.load_safetensors(index, device=dev, names=names) if names else {}
            torch.cuda.synchronize(dev)
            reader_s = time.perf_counter() - t
            if th:
                th.join()
            t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
            n = sum(v.numel() * v.element_size() for v in out.values()) + zbytes
            del out, dst
            zc["zc_share"] = zbytes / n
            q.put((rep, k, t0, t1, n, round(reader_s, 4), {a: round(b, 4) for a, b in zc.items()}))
            torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fractions", default="0,0.1,0.2,0.3")
    ap.add_argument("--part-mib", type=int, default=64)
    ap.add_argument("--dir", default="/tmp/numapin-sweep")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ranks_sweep import collect, start_ranks

    fracs = [float(f) for f in a.fractions.split(",")]
    procs, q, _barrier = start_ranks(a.dir, a.gib, a.ranks, rank, (fracs, a.reps, a.part_mib << 20))
    got = collect(procs, q, a.reps * len(fracs) * a.ranks)
    if got is None:
        return 1
    for k, f in enumerate(fracs):
        rates, each = [], []
        for rep in range(a.reps):
            rows = sorted((g for g in got if g[0] == rep and g[1] == k), key=lambda g: g[2])
            t0, t1 = min(g[2] for g in rows), max(g[3] for g in rows)
            rates.append(round(sum(g[4] for g in rows) / (t1 - t0) / 1e9, 2))
            each.append([{"reader_s": g[5], **g[6]} for g in rows])
        print(json.dumps({"fraction": f, "gbps_by_rep": rates, "last_rep_ranks": each[-1]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe: DMA straight from the page cache, the alternative to the
reader's copy into pinned slots (docs/BENCHMARKS.md, "Many ranks, one 8
GiB checkpoint"). PROCS processes (spawned; process i on GPU i modulo the
GPUs) each mmap their share of a hot FILE read-only, register it with
cuMemHostRegister(CU_MEMHOSTREGISTER_READ_ONLY) PART_MIB at a time, copy
each part to the GPU and unregister it, and report the time of each step;
the aggregate is all bytes over the slowest process's time. FILE is made
(random bytes) when missing or short, and read once first.

    python3 python/bench/zerocopy_probe.py FILE GIB PROCS PART_MIB

One JSON line. Needs torch with CUDA and the driver's libcuda.so.1."""
import ctypes, os, sys, time, json, multiprocessing as mp

def cu():
    lib = ctypes.CDLL("libcuda.so.1")
    for n in ("cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemcpyHtoD_v2", "cuCtxSynchronize", "cuMemcpyHtoDAsync_v2"):
        getattr(lib, n).restype = ctypes.c_int
    return lib

def libc():
    c = ctypes.CDLL(None, use_errno=True)
    c.mmap.restype = ctypes.c_void_p
    c.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    c.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    c.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return c

def one(path, off, size, part, dev, q, barrier):
    import torch
    torch.cuda.set_device(dev)
    dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dev}")
    torch.cuda.synchronize()
    lib, c = cu(), libc()
    fd = os.open(path, os.O_RDONLY)
    barrier.wait()
    t0 = time.perf_counter()
    addr = c.mmap(None, size, 1, 1, fd, off)
    r = {"mmap_s": time.perf_counter() - t0}
    t = time.perf_counter()
    c.madvise(addr, size, 22)  # MADV_POPULATE_READ
    r["populate_s"] = time.perf_counter() - t
    reg = unreg = copy = 0.0
    rc_all = []
    o = 0
    while o < size:
        n = min(part, size - o)
        t = time.perf_counter()
        rc = lib.cuMemHostRegister_v2(ctypes.c_void_p(addr + o), ctypes.c_size_t(n), 8)
        reg += time.perf_counter() - t
        rc_all.append(rc)
        if rc != 0:
            break
        t = time.perf_counter()
        rc2 = lib.cuMemcpyHtoD_v2(ctypes.c_uint64(dst.data_ptr() + o), ctypes.c_void_p(addr + o), ctypes.c_size_t(n))
        copy += time.perf_counter() - t
        rc_all.append(rc2)
        t = time.perf_counter()
        lib.cuMemHostUnregister(ctypes.c_void_p(addr + o))
        unreg += time.perf_counter() - t
        o += n
    total = time.perf_counter() - t0
    c.munmap(addr, size)
    os.close(fd)
    ok = None
    if o == size:
        import numpy as np
        ref = np.fromfile(path, dtype=np.uint8, count=min(size, 1 << 24), offset=off)
        ok = bool((dst[: len(ref)].cpu().numpy() == ref).all())
    r.update(register_s=reg, copy_s=copy, unregister_s=unreg, total_s=total, rcs=sorted(set(rc_all)), ok=ok,
             gbps=size / total / 1e9)
    q.put(r)

def main():
    path, gib, procs, part_mib = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    size = int(gib * (1 << 30)) // procs // (1 << 21) * (1 << 21)
    if not os.path.exists(path) or os.path.getsize(path) < size * procs:
        with open(path, "wb") as f:
            blk = os.urandom(1 << 24)
            for _ in range(size * procs // len(blk) + 1):
                f.write(blk)
    with open(path, "rb") as f:  # hot
        while f.read(1 << 26):
            pass
    import torch
    ng = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    q, b = ctx.Queue(), ctx.Barrier(procs)
    ps = [ctx.Process(target=one, args=(path, i * size, size, part_mib << 20, i % ng, q, b)) for i in range(procs)]
    [p.start() for p in ps]
    rs = [q.get(timeout=120) for _ in ps]
    [p.join() for p in ps]
    agg = size * procs / max(r["total_s"] for r in rs) / 1e9
    print(json.dumps({"procs": procs, "gpus": ng, "bytes_each": size, "part_mib": part_mib, "aggregate_gbps": round(agg, 2),
                      "each": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rs]}))

if __name__ == "__main__":
    main()

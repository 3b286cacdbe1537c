"""Many ranks loading one checkpoint: N processes (one per GPU, as torchrun
starts them), a barrier, then every rank loads at once; the aggregate rate
(all bytes delivered, over the time from the barrier until the last rank
has finished) hot and cold, each rank's own rate, and in the same run the
figures the aggregate is judged against: the all-GPU pinned copy rate
(`numapin bench --only all-gpus`), the host's memory-read rate and the
drive's O_DIRECT rate.

    sudo python3 python/bench/checkpoint_ranks.py --ranks 4 [--gib 4]
        [--files 8] [--reps 2] [--temps cold,hot] [--loaders ...]
        [--numapin-bin PATH] [--json PATH|-] [--budget-s 480] [--keep]
    python3 python/bench/checkpoint.py --ranks 4 ...   (the same)

Loaders (each rank of one set of processes runs each step; `local`: each
rank loads its share, the cut `numapin.safetensors_shards` gives; `full`:
every rank loads every tensor by itself; `replica`: every rank ends with
every tensor, the reading shared over the group):

- numapin_local:          load_safetensors(index, device=f"cuda:{rank}", shard="local")
- numapin_full:           load_safetensors(index, device=f"cuda:{rank}")
- numapin_replica:        load_safetensors(index, device=..., shard="replica")  (NCCL)
- safetensors_local:      safe_open(file, device=...).get_tensor(name) for the rank's share
- safetensors_full:       load_file(file, device=...) for every file
- instanttensor_local:    instanttensor.safe_open(files, device=rank, tensor_filter=share)
- instanttensor_replica:  instanttensor.safe_open(files, device=rank, process_group=WORLD)
- fastsafetensors_local:  SafeTensorsFileLoader(None, nogds=True) with the rank's share as filter
- fastsafetensors_replica: SafeTensorsFileLoader(WORLD, nogds=True), files spread over the ranks,
                          get_tensor for every name (broadcast from the rank that read it)

InstantTensor and fastsafetensors run where they are importable (skipped
with a message otherwise). The checkpoint is `--gib` GiB of bf16/fp16/fp32
tensors of mixed shapes in `--files` files and a model.safetensors.index.json,
kept for the next run with `--keep`. Cold steps drop the page cache (root)
after every rank has started and before the step; hot steps read the files
once first. Each step's tensors are checked on every rank: the names
expected, and a sample of tensors against safetensors' own CPU load.

Without CUDA (or with --cpu) the ranks use a gloo group and load to host
memory (device=None: pinned CPU tensors), the loaders that need a GPU are
skipped: a smoke test of the whole script.

The host's memory-read rate: torch.sum over a 4 GiB float32 tensor (its
pages touched first) with torch's intra-op threads set to the process's
CPUs, best of 6 (bytes read over time). The drive: checkpoint.py's figure
(the best of 1-64 O_DIRECT reads in flight of 1-16 MiB, the page cache
dropped before each) over the largest file, at most 2 GiB. The page cache
into host buffers, no GPU: as many processes as ranks, 16 threads each
taking 1 or 4 MiB `preadv`s from the page cache into two reused buffers a
thread, the better of the two sizes (1 MiB buffers stay in the L3).

`--budget-s`: no step starts after this many seconds from the start (the
steps left are listed as skipped), so that the run ends in time. The
loaders run a library at a time (numapin and safetensors in one set of
ranks, InstantTensor and fastsafetensors each in a fresh one), each
library given a share of the time left by its number of loaders: a
repetition after the first starts only within that share.

NUMAPIN_BENCH_THREADS and NUMAPIN_BENCH_CHUNK_MIB set numapin's reader
threads (per rank) and read size, as for checkpoint.py (default: the
library's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from checkpoint import drive_rate, drop_caches, warm  # the single-GPU bench beside this file

GIB = 1 << 30
MIB = 1 << 20
MARK = "@@numapin-bench "
WARMUP = "warmup.safetensors"  # 1 MiB, each rank's untimed first numapin load

LOADERS = [
    "numapin_local", "numapin_full", "numapin_replica",
    "safetensors_local", "safetensors_full",
    "instanttensor_local", "instanttensor_replica",
    "fastsafetensors_local", "fastsafetensors_replica",
]
NEEDS_GPU = {"instanttensor_local", "instanttensor_replica", "fastsafetensors_local", "fastsafetensors_replica"}
MODULE = {"instanttensor": "instanttensor", "fastsafetensors": "fastsafetensors", "safetensors": "safetensors",
          "numapin": "numapin"}


# ---------------------------------------------------------------- checkpoint

def make(dirname: str, gib: float, files: int) -> tuple[str, list[str]]:
    """The checkpoint (an index and `files` files of about gib/files GiB
    each), written unless the same one is there."""
    import torch
    from safetensors.torch import save_file

    index = os.path.join(dirname, "model.safetensors.index.json")
    tag = f"gib={gib} files={files}"
    if os.path.exists(index):
        with open(index) as f:
            meta = json.load(f)
        names = sorted(set(meta["weight_map"].values()))
        if meta.get("metadata", {}).get("numapin_bench") == tag and all(
                os.path.exists(os.path.join(dirname, n)) for n in names + [WARMUP]):
            return index, [os.path.join(dirname, n) for n in names]
    os.makedirs(dirname, exist_ok=True)
    remove(dirname)
    g = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 256, (256 * MIB,), dtype=torch.uint8, generator=g) & 0x3F  # finite floats
    shapes = [((32000, 4096), torch.bfloat16), ((4096, 4096), torch.bfloat16), ((11008, 4096), torch.float16),
              ((4096,), torch.float32), ((1024, 1024), torch.float32), ((4096, 128), torch.bfloat16),
              ((333, 777), torch.float16), ((7,), torch.float32)]
    sizes = [math.prod(sh) * torch.empty((), dtype=dt).element_size() for sh, dt in shapes]
    per_file = gib * GIB / files
    wmap: dict[str, str] = {}
    total, i = 0, 0
    for k in range(files):
        name = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        ts: dict[str, Any] = {}
        size = 0
        while size < per_file:
            # The next shape of the cycle that does not overshoot the file.
            j = next((j for j in range(len(shapes)) if size + sizes[(i + j) % len(shapes)] <= per_file * 1.1),
                     len(shapes) - 1 - i % len(shapes))
            shape, dtype = shapes[(i + j) % len(shapes)]
            n = sizes[(i + j) % len(shapes)]
            start = (i * 40961) % (pool.numel() - n)
            ts[f"layer.{i:05d}"] = pool[start:start + n].clone().view(dtype).reshape(shape)
            size += n
            i += 1
        save_file(ts, os.path.join(dirname, name))
        wmap.update({t: name for t in ts})
        total += size
        del ts
    save_file({"w": torch.zeros(1 << 18)}, os.path.join(dirname, WARMUP))
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": total, "numapin_bench": tag}, "weight_map": wmap}, f)
    os.sync()
    return index, [os.path.join(dirname, n) for n in sorted(set(wmap.values()))]


def remove(dirname: str) -> None:
    """Removes the checkpoint this script writes in `dirname` (nothing else)."""
    for n in os.listdir(dirname):
        if n in ("model.safetensors.index.json", WARMUP) or (n.startswith("model-") and n.endswith(".safetensors")):
            os.remove(os.path.join(dirname, n))


# ---------------------------------------------------------------- same-run baselines

def memory_read_gbps() -> tuple[float, str]:
    """torch.sum over a 4 GiB float32 tensor, every CPU of the process."""
    import torch

    cpus = len(os.sched_getaffinity(0))
    torch.set_num_threads(cpus)
    x = torch.ones(GIB, dtype=torch.float32)  # 4 GiB, pages touched by the fill
    best = 0.0
    for _ in range(6):
        t0 = time.perf_counter()
        s = float(x.sum())
        dt = time.perf_counter() - t0
        best = max(best, x.numel() * 4 / dt / 1e9)
    assert s == x.numel()
    del x
    return best, f"torch.sum over 4 GiB float32, {cpus} threads, best of 6"


def all_gpus_gbps(binary: str | None) -> tuple[float | None, Any]:
    """`numapin bench --only all-gpus --json`: the median h2d_all_gpus."""
    if not binary:
        return None, "no numapin binary (give --numapin-bin)"
    try:
        r = subprocess.run([binary, "bench", "--only", "all-gpus", "--size", "1G", "--reps", "5", "--json"],
                           capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{binary}: {e}"
    if r.returncode != 0:
        return None, f"{binary} exit {r.returncode}: {r.stderr.strip()[-500:]}"
    try:
        rep = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        return None, f"{binary} printed no JSON ({e})"
    for x in rep.get("results", []):
        if x.get("name") == "h2d_all_gpus":
            return float(x["median"]), x
    return None, {"notes": rep.get("notes")}


def drive_gbps(paths: list[str], can_drop: bool) -> tuple[float | None, str]:
    """checkpoint.py's drive figure (the best of 1-64 O_DIRECT reads in
    flight of 1-16 MiB, the page cache dropped before each) on the largest
    file."""
    if not can_drop:
        return None, "not measured (dropping the page cache needs root)"
    big = max(paths, key=os.path.getsize)
    gbps, config = drive_rate(big, 2 * GIB)
    if not gbps:
        return None, f"not measured ({big} is under 16 MiB)"
    return gbps, f"{config}, {os.path.basename(big)}"


PAGE_CACHE_CHILD = r"""
import json, os, sys, threading, time
spans, threads, chunk, start = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
pieces = [(p, o, min(chunk, off + n - o)) for p, off, n in spans for o in range(off, off + n, chunk)]
fds = {p: os.open(p, os.O_RDONLY) for p in {x[0] for x in spans}}
lock, it = threading.Lock(), iter(pieces)
def work():
    bufs = [bytearray(chunk) for _ in range(2)]  # two slots a thread, reused, as the reader's
    for b in bufs:
        b[::4096] = b"\1" * len(b[::4096])
    views, i = [memoryview(b) for b in bufs], 0
    while True:
        with lock:
            x = next(it, None)
        if x is None:
            return
        p, o, n = x
        if os.preadv(fds[p], [views[i % 2][:n]], o) != n:
            raise SystemExit("short read")
        i += 1
ts = [threading.Thread(target=work) for _ in range(threads)]
while time.clock_gettime(time.CLOCK_MONOTONIC) < start:
    time.sleep(0.0005)
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"end": time.clock_gettime(time.CLOCK_MONOTONIC), "bytes": sum(x[2] for x in pieces)}))
"""


def page_cache_gbps(files: list[str], ranks: int, threads: int = 16,
                    chunks: tuple[int, ...] = (1 << 20, 4 << 20)) -> tuple[float, str]:
    """The CPU half of a hot load, without numapin or a GPU: ``ranks``
    processes (started beforehand, each its contiguous share of the files'
    bytes), each ``threads`` threads taking ``preadv``s of each of
    ``chunks`` bytes from the page cache into two reused buffers a thread;
    all bytes over the time from the common start to the last process's
    end; the best over the chunks and 3 repetitions each, the files read
    once first. Buffers that fit in the L3 (1 MiB) copy far faster than
    ones that do not (4 MiB), so the best is the host's ceiling for this
    copy."""
    for p in files:
        warm(p)
    shares = _shares(files, ranks)
    best, best_chunk = 0.0, chunks[0]
    for chunk in chunks:
        for _ in range(3):
            gbps = _page_cache_once(shares, threads, chunk)
            if gbps > best:
                best, best_chunk = gbps, chunk
    return best, (f"{ranks} processes x {threads} threads, {best_chunk >> 20} MiB preadv from the page cache into two "
                  f"reused buffers a thread, best of 3 at each of {', '.join(f'{c >> 20} MiB' for c in chunks)}")


def _shares(files: list[str], ranks: int) -> list[list[tuple[str, int, int]]]:
    """The files' bytes cut into ``ranks`` contiguous shares of
    ``(path, offset, length)`` spans."""
    spans = [(p, 0, os.path.getsize(p)) for p in files]
    total = sum(n for _, _, n in spans)
    cut = [total * r // ranks for r in range(ranks + 1)]
    shares: list[list[tuple[str, int, int]]] = [[] for _ in range(ranks)]
    at = 0
    for p, _, n in spans:
        for r in range(ranks):
            lo, hi = max(at, cut[r]), min(at + n, cut[r + 1])
            if hi > lo:
                shares[r].append((p, lo - at, hi - lo))
        at += n
    return shares


def _page_cache_once(shares: list[list[tuple[str, int, int]]], threads: int, chunk: int) -> float:
    """One timed copy of :func:`page_cache_gbps`: GB/s."""
    start = time.clock_gettime(time.CLOCK_MONOTONIC) + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", PAGE_CACHE_CHILD, json.dumps(sh), str(threads), str(chunk),
                               repr(start)], stdout=subprocess.PIPE, text=True) for sh in shares]
    try:
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    finally:  # a child that failed or hung leaves none behind
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return sum(o["bytes"] for o in outs) / (max(o["end"] for o in outs) - start) / 1e9


# ---------------------------------------------------------------- the ranks

def free_port() -> int:
    """A TCP port free on this machine now, for a process group's store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ranks:
    """N child processes of this script (`--child`), each one rank of a
    torch.distributed group, steered over their stdin and stdout."""

    def __init__(self, n: int, index: str, cpu: bool, libs: str | None = None) -> None:
        port = free_port()
        self.procs = []
        for r in range(n):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            if libs:
                env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (libs, env.get("LD_LIBRARY_PATH")) if x)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--index", index] + (["--cpu"] if cpu else [])
            self.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               text=True, bufsize=1))

    def lines(self, timeout: float) -> list[dict[str, Any]]:
        """One protocol line from every rank, or TimeoutError / RuntimeError."""
        got: dict[int, dict[str, Any]] = {}
        sel = selectors.DefaultSelector()
        for r, p in enumerate(self.procs):
            sel.register(p.stdout, selectors.EVENT_READ, r)
        deadline = time.monotonic() + timeout
        try:
            while len(got) < len(self.procs):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(len(self.procs))) - set(got))
                    errs = [g["error"] for g in got.values() if "error" in g]
                    if errs:  # the others wait in a collective for the rank that failed
                        raise RuntimeError(f"{errs[0]} (ranks {missing} then waited)")
                    raise TimeoutError(f"ranks {missing} did not answer in {timeout:.0f} s")
                for key, _ in sel.select(min(left, 1.0)):
                    r = key.data
                    line = key.fileobj.readline()
                    if not line:
                        sel.unregister(key.fileobj)
                        raise RuntimeError(f"rank {r} exited (code {self.procs[r].wait()})")
                    if line.startswith(MARK):
                        got[r] = json.loads(line[len(MARK):])
                        if "error" in got[r]:
                            deadline = min(deadline, time.monotonic() + 10)
        finally:
            sel.close()
        return [got[r] for r in range(len(self.procs))]

    def send(self, msg: dict[str, Any]) -> None:
        for p in self.procs:
            p.stdin.write(json.dumps(msg) + "\n")
            p.stdin.flush()

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.write(json.dumps({"quit": True}) + "\n")
                p.stdin.flush()
            except OSError:
                pass
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def child(index: str, force_cpu: bool) -> int:
    """One rank: set up, say ready, run the steps the parent sends."""
    import gc

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = not force_cpu and torch.cuda.is_available() and torch.cuda.device_count() > rank
    if gpu:
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = None
        dist.init_process_group("gloo")
        # As torchrun does for several processes: no more threads than CPUs.
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    import numapin

    # numapin's runtime and first pinned region, made before any timing
    # (a job pays this once, on its first load): timed apart.
    t = time.perf_counter()
    numapin.load_safetensors(os.path.join(os.path.dirname(index), WARMUP), device=dev)
    first = time.perf_counter() - t
    dist.barrier()
    with open(index) as f:
        wmap = json.load(f)["weight_map"]
    files = [os.path.join(os.path.dirname(index), n) for n in sorted(set(wmap.values()))]
    share = numapin.safetensors_shards(index, world)[rank]
    say = lambda m: print(MARK + json.dumps(m), flush=True)  # noqa: E731
    say({"ready": True, "rank": rank, "gpu": gpu, "numapin_first_load_s": first})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("quit"):
            break
        res = step(msg["loader"], index, files, share, wmap, dev, dist)
        res["rank"] = rank
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
        say(res)
    dist.destroy_process_group()
    # Not through the interpreter's exit, where torch's communication
    # threads can still be dropping tensors and abort the process.
    sys.stdout.flush()
    os._exit(0)


def step(loader: str, index: str, files: list[str], share: list[str], wmap: dict[str, str], dev: Any,
         dist: Any) -> dict[str, Any]:
    """One timed load on this rank, after a barrier; then its check."""
    import torch

    fn = globals()["load_" + loader]
    dist.barrier()
    if dev is not None:
        torch.cuda.synchronize(dev)
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)  # one clock for every process of the machine
    stats: dict[str, Any] = {}
    try:
        out = fn(index, files, share, dev, dist, stats)
        if dev is not None:
            torch.cuda.synchronize(dev)
    except Exception as e:  # reported; the parent restarts the ranks
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]}
    t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
    n = sum(v.numel() * v.element_size() for v in out.values())
    want = share if loader.endswith("_local") else list(wmap)
    check = verify(out, want, files, wmap)
    keep = {k: stats.get(k) for k in ("cached_bytes", "direct_bytes", "buffered_bytes", "threads", "replica", "seconds",
                                      "staging_bytes")
            if k in stats}
    del out
    return {"t0": t0, "t1": t1, "bytes": n, "check": check, "stats": keep}


def verify(out: dict[str, Any], want: list[str], files: list[str], wmap: dict[str, str]) -> str:
    """'ok', or what is wrong: the names, and up to 4 tensors' bytes against
    safetensors' CPU load."""
    import torch
    from safetensors import safe_open

    if sorted(out) != sorted(want):
        return f"names differ: {len(out)} loaded, {len(want)} expected"
    names = sorted(want)
    sample = sorted({names[0], names[-1], names[len(names) // 2], names[len(names) // 3]}) if names else []
    d = os.path.dirname(files[0])
    for k in sample:
        with safe_open(os.path.join(d, wmap[k]), "pt", device="cpu") as f:
            ref = f.get_tensor(k)
        got = out[k].detach().to("cpu")
        if got.dtype != ref.dtype or got.shape != ref.shape or not torch.equal(
                got.reshape(-1).view(torch.uint8), ref.reshape(-1).view(torch.uint8)):
            return f"tensor {k} differs from safetensors' load"
    return "ok"


def _dev_str(dev: Any) -> str:
    return "cpu" if dev is None else str(dev)


def _tune() -> dict[str, int]:
    """numapin's reader settings from NUMAPIN_BENCH_THREADS and
    NUMAPIN_BENCH_CHUNK_MIB, as in checkpoint.py (default: the library's)."""
    tune = {}
    if os.environ.get("NUMAPIN_BENCH_THREADS"):
        tune["threads"] = int(os.environ["NUMAPIN_BENCH_THREADS"])
    if os.environ.get("NUMAPIN_BENCH_CHUNK_MIB"):
        tune["chunk_bytes"] = int(os.environ["NUMAPIN_BENCH_CHUNK_MIB"]) << 20
    return tune


def load_numapin_local(index, files, share, dev, dist, stats):
    import numapin

    return numapin.load_safetensors(index, device=dev, shard="local", stats=stats, **_tune())


def load_numapin_full(index, files, share, dev, dist, stats):
    import numapin

    return numapin.load_safetensors(index, device=dev, stats=stats, **_tune())


def load_numapin_replica(index, files, share, dev, dist, stats):
    import numapin

    return numapin.load_safetensors(index, device=dev, shard="replica", stats=stats, **_tune())


def load_safetensors_local(index, files, share, dev, dist, stats):
    from safetensors import safe_open

    mine = set(share)
    out = {}
    for p in files:
        with safe_open(p, "pt", device=_dev_str(dev)) as f:
            for k in f.keys():
                if k in mine:
                    out[k] = f.get_tensor(k)
    return out


def load_safetensors_full(index, files, share, dev, dist, stats):
    from safetensors.torch import load_file

    out = {}
    for p in files:
        out.update(load_file(p, device=_dev_str(dev)))
    return out


def load_instanttensor_local(index, files, share, dev, dist, stats):
    from instanttensor import safe_open

    with safe_open(files, framework="pt", device=dev.index, tensor_filter=list(share),
                   tensor_name_match_mode="exact") as f:
        return dict(f.tensors())


def load_instanttensor_replica(index, files, share, dev, dist, stats):
    from instanttensor import safe_open

    with safe_open(files, framework="pt", device=dev.index, process_group=dist.group.WORLD) as f:
        return dict(f.tensors())


def load_fastsafetensors_local(index, files, share, dev, dist, stats):
    from fastsafetensors import SafeTensorsFileLoader

    mine = set(share)
    loader = SafeTensorsFileLoader(None, str(dev), nogds=True)
    try:
        loader.add_filenames({0: files})
        loader.set_tensor_filter(lambda k: k in mine)
        fb = loader.copy_files_to_device()
        try:
            return {k: fb.get_tensor(k) for k in share}
        finally:
            fb.close()
    finally:
        loader.close()


def load_fastsafetensors_replica(index, files, share, dev, dist, stats):
    from fastsafetensors import SafeTensorsFileLoader

    world = dist.get_world_size()
    loader = SafeTensorsFileLoader(dist.group.WORLD, str(dev), nogds=True)
    try:
        loader.add_filenames({r: files[r::world] for r in range(world)})
        fb = loader.copy_files_to_device()
        try:
            return {k: fb.get_tensor(k) for k in sorted(fb.key_to_rank_lidx)}
        finally:
            fb.close()
    finally:
        loader.close()


# ---------------------------------------------------------------- the parent

def cudart_for_fastsafetensors(dirname: str) -> tuple[str | None, str | None]:
    """fastsafetensors dlopens "libcudart.so", which torch's pip wheels do
    not ship (they have libcudart.so.13): a folder with that name linked to
    torch's, for the ranks' LD_LIBRARY_PATH, when it is not found as it is."""
    import ctypes
    import glob
    import importlib.util

    try:
        ctypes.CDLL("libcudart.so")
        return None, None
    except OSError:
        pass
    roots = []
    for mod in ("nvidia", "torch"):
        spec = importlib.util.find_spec(mod)
        roots += list(spec.submodule_search_locations or []) if spec else []
    found = sorted(p for r in roots for p in glob.glob(os.path.join(r, "**", "libcudart.so.*"), recursive=True))
    if not found:
        return None, "fastsafetensors wants libcudart.so, found nowhere: its loaders may fail"
    d = os.path.join(dirname, "cudart")
    os.makedirs(d, exist_ok=True)
    link = os.path.join(d, "libcudart.so")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(found[-1], link)
    return d, f"fastsafetensors: libcudart.so is {found[-1]} (linked in {d}, on the ranks' LD_LIBRARY_PATH)"


def importable(loader: str) -> str | None:
    """None, or why `loader` cannot run here."""
    import importlib.util

    mod = MODULE[loader.split("_")[0]]
    if importlib.util.find_spec(mod) is None:
        return f"{mod} is not installed (pip install {mod}); skipped"
    return None


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One step's figures from every rank's result."""
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        return {"error": errs[0]}
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    total = sum(r["bytes"] for r in results)
    rates = [r["bytes"] / (r["t1"] - r["t0"]) / 1e9 if r["t1"] > r["t0"] else 0.0 for r in results]
    return {
        "seconds": t1 - t0,
        "bytes": total,
        "gbps": total / (t1 - t0) / 1e9,
        "rank_gbps": rates,
        "rank_seconds": [r["t1"] - r["t0"] for r in results],
        "fairness": min(rates) / max(rates) if max(rates) > 0 else 0.0,
        "check": sorted({r["check"] for r in results}),
        "stats": [r.get("stats") for r in results],
    }


def families(loaders: list[str]) -> list[list[str]]:
    """The loaders grouped by the processes they run in: numapin and
    safetensors share one set of ranks, InstantTensor and fastsafetensors
    each get a fresh one (fastsafetensors binds the process to its GPU's
    node, which would change what runs after it)."""
    out: dict[str, list[str]] = {}
    for x in loaders:
        lib = x.split("_")[0]
        out.setdefault(lib if lib in ("instanttensor", "fastsafetensors") else "base", []).append(x)
    return list(out.values())


def run_steps(a: argparse.Namespace, index: str, files: list[str], size: int, loaders: list[str], temps: list[str],
              t_start: float, cpu: bool) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """Every loader x temperature x repetition, a family of loaders at a
    time; each family gets a share of the time left by its number of
    loaders, and a repetition after the first starts only within it."""
    steps: list[dict[str, Any]] = []
    skipped: list[str] = []
    starts: list[dict[str, Any]] = []
    fams = families(loaders)
    for fi, fam in enumerate(fams):
        fam_start = time.monotonic()
        left = sum(len(f) for f in fams[fi:])
        share = (a.budget_s - (fam_start - t_start)) * len(fam) / left
        ranks: Ranks | None = None
        try:
            for rep in range(a.reps):
                for loader in fam:
                    for temp in temps:
                        now = time.monotonic()
                        if now - t_start > a.budget_s or (rep > 0 and now - fam_start > share):
                            skipped.append(f"{loader} {temp} rep {rep + 1} (past its share of --budget-s "
                                           f"{a.budget_s:.0f})")
                            continue
                        if ranks is None:
                            ranks = start_ranks(a, index, cpu, starts)
                        s = one_step(a, ranks, files, loader, temp)
                        if "error" in s:  # a failed collective leaves the group unusable: start afresh
                            ranks.close()
                            ranks = None
                        s.update(loader=loader, temp=temp, rep=rep + 1, file_bytes=size)
                        steps.append(s)
                        say_step(s)
        finally:
            if ranks is not None:
                ranks.close()
    return steps, skipped, starts


def start_ranks(a: argparse.Namespace, index: str, cpu: bool, starts: list[dict[str, Any]]) -> Ranks:
    t = time.monotonic()
    ranks = Ranks(a.ranks, index, cpu, a.libs)
    ready = ranks.lines(a.step_timeout + 120)  # started: imports, CUDA, NCCL
    first = [x.get("numapin_first_load_s") for x in ready]
    starts.append({"seconds": time.monotonic() - t, "numapin_first_load_s": first})
    print(f"  ranks started in {starts[-1]['seconds']:.1f} s; numapin's first load (1 MiB, untimed below): "
          f"{max(first):.3f} s at most", file=sys.stderr)
    return ranks


def one_step(a: argparse.Namespace, ranks: Ranks, files: list[str], loader: str, temp: str) -> dict[str, Any]:
    if temp == "cold":
        drop_caches()
    else:
        for p in files:
            warm(p)
    ranks.send({"loader": loader})
    try:
        return summarize(ranks.lines(a.step_timeout))
    except (TimeoutError, RuntimeError) as e:
        return {"error": str(e)}


def say_step(s: dict[str, Any]) -> None:
    if "error" in s:
        print(f"  {s['loader']:<24} {s['temp']:<4} rep {s['rep']}: error: {s['error']}", file=sys.stderr)
        return
    rr = " ".join(f"{x:.1f}" for x in s["rank_gbps"])
    print(f"  {s['loader']:<24} {s['temp']:<4} rep {s['rep']}: {s['gbps']:7.2f} GB/s in {s['seconds']:.2f} s "
          f"(ranks {rr}; check {','.join(s['check'])})", file=sys.stderr)


def medians(steps: list[dict[str, Any]], loaders: list[str], temps: list[str]) -> list[dict[str, Any]]:
    rows = []
    for loader in loaders:
        for temp in temps:
            ok = [s for s in steps if s["loader"] == loader and s["temp"] == temp and "error" not in s]
            bad = [s["error"] for s in steps if s["loader"] == loader and s["temp"] == temp and "error" in s]
            if not ok:
                rows.append({"loader": loader, "temp": temp, "error": bad[0] if bad else "not run"})
                continue
            ok.sort(key=lambda s: s["seconds"])
            m = ok[len(ok) // 2]
            rows.append({"loader": loader, "temp": temp, "gbps": m["gbps"], "file_gbps": m["file_bytes"] / m["seconds"] / 1e9,
                         "seconds": m["seconds"], "rank_gbps": m["rank_gbps"], "fairness": m["fairness"],
                         "check": m["check"], "runs": len(ok), "errors": bad})
    return rows


def report(rows: list[dict[str, Any]], base: dict[str, Any]) -> dict[str, Any]:
    """Prints the table and the goals; returns the ratios."""
    print(f"\n{'LOADER':<24} {'TEMP':<4} {'AGG GB/s':>9} {'FILE GB/s':>9} {'RANK GB/s min-max':>18} {'FAIR':>5}  CHECK")
    for r in rows:
        if "error" in r:
            print(f"{r['loader']:<24} {r['temp']:<4} {'-':>9} {'-':>9} {'-':>18} {'-':>5}  {r['error']}")
            continue
        lo, hi = min(r["rank_gbps"]), max(r["rank_gbps"])
        print(f"{r['loader']:<24} {r['temp']:<4} {r['gbps']:>9.2f} {r['file_gbps']:>9.2f} {lo:>8.2f} - {hi:<7.2f} "
              f"{r['fairness']:>5.2f}  {','.join(r['check'])}")
    print("\nAGG: all bytes delivered (every rank's) over the time from the barrier to the last rank's end; "
          "FILE: the checkpoint's bytes over that time; FAIR: slowest rank's rate / fastest's")
    mem, pinned, drive = base.get("memory_read_gbps"), base.get("all_gpus_pinned_gbps"), base.get("drive_gbps")
    print(f"host memory read: {mem:.2f} GB/s ({base.get('memory_read_method')})" if mem else "host memory read: -")
    print(f"all-GPU pinned H2D (numapin bench --only all-gpus): {pinned:.2f} GB/s" if pinned
          else f"all-GPU pinned H2D: not measured ({base.get('all_gpus_note')})")
    print(f"drive, O_DIRECT: {drive:.2f} GB/s ({base.get('drive_config')})" if drive
          else f"drive: not measured ({base.get('drive_config')})")
    pc = base.get("page_cache_gbps")
    if pc:
        print(f"page cache to host buffers, no GPU: {pc:.2f} GB/s ({base.get('page_cache_method')})")
    ratios: dict[str, Any] = {}
    ceiling = min(x for x in (mem, pinned) if x) if (mem or pinned) else None
    get = {(r["loader"], r["temp"]): r for r in rows if "error" not in r}
    print("\nAgainst the goals:")
    if ceiling:
        for loader in ("numapin_local", "numapin_replica"):
            r = get.get((loader, "hot"))
            if r:
                ratios[f"{loader}_hot_vs_min_pinned_memory"] = r["gbps"] / ceiling
                print(f"  hot {loader} aggregate / min(all-GPU pinned, memory read) = {r['gbps']:.2f} / {ceiling:.2f} = "
                      f"{r['gbps'] / ceiling:.2f}x (goal >= 0.8 for numapin_local)")
                if pc:
                    ratios[f"{loader}_hot_file_vs_page_cache"] = r["file_gbps"] / pc
                    print(f"  hot {loader}: checkpoint bytes / page cache to host buffers = {r['file_gbps']:.2f} / "
                          f"{pc:.2f} = {r['file_gbps'] / pc:.2f}x")
    for loader in ("numapin_local", "numapin_replica", "numapin_full"):
        r = get.get((loader, "cold"))
        if r:
            if drive:
                ratios[f"{loader}_cold_file_vs_drive"] = r["file_gbps"] / drive
                print(f"  cold {loader}: checkpoint bytes / drive = {r['file_gbps']:.2f} / {drive:.2f} = "
                      f"{r['file_gbps'] / drive:.2f}x")
            ratios[f"{loader}_cold_fairness"] = r["fairness"]
            print(f"  cold {loader}: slowest rank / fastest rank = {r['fairness']:.2f} (no rank starved: near 1)")
    for temp in ("hot", "cold"):
        rep, full = get.get(("numapin_replica", temp)), get.get(("numapin_full", temp))
        if rep and full:
            ratios[f"replica_vs_full_{temp}"] = rep["gbps"] / full["gbps"]
            print(f"  {temp}: numapin_replica / numapin_full (every rank every tensor) = {rep['gbps'] / full['gbps']:.2f}x")
        it = get.get(("instanttensor_replica", temp))
        if rep and it:
            ratios[f"replica_vs_instanttensor_{temp}"] = rep["gbps"] / it["gbps"]
            print(f"  {temp}: numapin_replica / instanttensor_replica = {rep['gbps'] / it['gbps']:.2f}x")
    return ratios


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=0, help="ranks (default: the GPUs torch sees, else 2)")
    ap.add_argument("--dir", default="/tmp/numapin-ckpt-ranks")
    ap.add_argument("--gib", type=float, default=4.0, help="checkpoint size (default 4 GiB)")
    ap.add_argument("--files", type=int, default=8, help="files the checkpoint is split into (default 8)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--temps", default="cold,hot")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--numapin-bin", default=shutil.which("numapin"), help="the numapin command (default: on PATH)")
    ap.add_argument("--json", nargs="?", const="-", default=None, help="write the results as JSON to PATH (- or no "
                    "PATH: stdout, last line)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no step after this many seconds")
    ap.add_argument("--step-timeout", type=float, default=120.0)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint for the next run")
    ap.add_argument("--cpu", action="store_true", help="no GPUs: gloo, host memory")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.index, a.cpu)
    return parent(a)


def parent(a: argparse.Namespace) -> int:
    t_start = time.monotonic()
    import torch

    ngpu = 0 if a.cpu else torch.cuda.device_count()
    cpu = a.cpu or ngpu == 0
    if not a.ranks:
        a.ranks = ngpu or 2
    if cpu:
        print("no CUDA GPU (or --cpu): ranks use gloo and load to host memory; GPU loaders skipped", file=sys.stderr)
    elif a.ranks > ngpu:
        print(f"--ranks {a.ranks}: torch sees {ngpu} GPUs", file=sys.stderr)
        return 2
    notes: list[str] = []
    loaders = []
    for name in [x.strip() for x in a.loaders.split(",") if x.strip()]:
        if name not in LOADERS:
            print(f"unknown loader {name!r} (known: {', '.join(LOADERS)})", file=sys.stderr)
            return 2
        why = importable(name) or ("needs a CUDA GPU; skipped" if cpu and name in NEEDS_GPU else None)
        if why:
            notes.append(f"{name}: {why}")
            print(f"{name}: {why}", file=sys.stderr)
        else:
            loaders.append(name)
    index, files = make(a.dir, a.gib, a.files)
    a.libs = None
    if any(x.startswith("fastsafetensors") for x in loaders):
        a.libs, note = cudart_for_fastsafetensors(a.dir)
        if note:
            notes.append(note)
            print(note, file=sys.stderr)
    size = sum(os.path.getsize(p) for p in files)
    print(f"checkpoint: {index}, {len(files)} files, {size / GIB:.2f} GiB; {a.ranks} ranks "
          f"({'gloo, host memory' if cpu else 'NCCL, one GPU each'})", file=sys.stderr)
    can_drop = drop_caches()
    want = [t.strip() for t in a.temps.split(",") if t.strip()]
    temps = [t for t in want if t == "hot" or (t == "cold" and can_drop)]
    if "cold" in want and not can_drop:
        notes.append("cold steps skipped: dropping the page cache needs root")
        print(notes[-1], file=sys.stderr)
    import numapin

    base: dict[str, Any] = {"file_on": numapin.locate(files[0])[0]}
    base["memory_read_gbps"], base["memory_read_method"] = memory_read_gbps()
    if cpu:
        base["all_gpus_pinned_gbps"], base["all_gpus_note"] = None, "no GPU"
    else:
        base["all_gpus_pinned_gbps"], base["all_gpus_note"] = all_gpus_gbps(a.numapin_bin)
    base["drive_gbps"], base["drive_config"] = drive_gbps(files, can_drop) if "cold" in temps else (None, "no cold steps")
    if "hot" in temps:
        base["page_cache_gbps"], base["page_cache_method"] = page_cache_gbps(files, a.ranks)
    print(f"file on: {base['file_on']}; baselines measured after {time.monotonic() - t_start:.0f} s", file=sys.stderr)
    steps, skipped, starts = run_steps(a, index, files, size, loaders, temps, t_start, cpu)
    rows = medians(steps, loaders, temps)
    ratios = report(rows, base)
    for s in skipped:
        print(f"skipped: {s}", file=sys.stderr)
    out = {"ranks": a.ranks, "gpus": not cpu, "size": size, "files": len(files), "gib": a.gib, "reps": a.reps,
           **base, "rows": rows, "ratios": ratios, "rank_starts": starts, "steps": steps, "skipped": skipped, "notes": notes,
           "seconds": time.monotonic() - t_start}
    if a.json == "-":
        print(json.dumps(out))
    elif a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if not a.keep:
        remove(a.dir)
        shutil.rmtree(os.path.join(a.dir, "cudart"), ignore_errors=True)
        try:
            os.rmdir(a.dir)
        except OSError:
            pass
    print(f"done in {time.monotonic() - t_start:.0f} s", file=sys.stderr)
    bad = [s for s in steps if "error" not in s and s["check"] != ["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

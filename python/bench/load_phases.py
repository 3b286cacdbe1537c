"""Where each rank's time goes in a hot ``shard=(rank, ranks)`` load: the
steps of ``numapin.load_safetensors`` timed one by one, ``--ranks``
processes (one per GPU) loading at once after a barrier.

    python3 python/bench/load_phases.py [--ranks 2] [--reps 3] [--gib 8]
        [--keep-cache] [--modes made,first] [--nccl] [--dir /tmp/numapin-sweep]

The steps (milliseconds, per rank and repetition): ``open`` (the index and
the files' headers read, the shard cut), ``meminfo`` (``torch.cuda.
mem_get_info``), ``alloc`` (the destination tensors made by torch's caching
allocator, its own room check included), ``read`` (numapin's reader: the
files to the tensors; ``reader_s`` is its own clock), ``sync`` and
``dict``. Each repetition runs each of ``--modes`` in turn: ``made``, as
``load_safetensors`` does, the tensors made while the reader reads (its
``alloc`` step is the room check only, ``make_ms`` the time spent making
them inside ``read``); ``first``, every tensor made before the read starts
(as numapin did before). ``--nccl`` puts the ranks in an NCCL process group
first, as a job's ranks are, and has them pass an NCCL barrier after the
barrier before each load, as ``checkpoint_ranks.py`` does. It calls the package's private steps (``numapin._storage``) in
the order ``load_safetensors`` does; it is a profile, not an example.
Between repetitions the tensors are freed and, unless ``--keep-cache``,
torch's cache emptied, so that every load allocates afresh as a new
process's first load does. The checkpoint is ``checkpoint_ranks.py``'s
(made once in ``--dir`` and kept), read once before the timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def rank(r: int, world: int, index: str, reps: int, keep: bool, modes: list[str], port: int, barrier: Any,
         q: Any) -> None:
    import torch

    import numapin

    torch.cuda.set_device(r)
    dev = torch.device("cuda", r)
    if port:  # a job's NCCL group, made as a trainer makes it
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=r, world_size=world, device_id=dev)
        dist.barrier()
    numapin.load_safetensors(os.path.join(os.path.dirname(index), "warmup.safetensors"), device=dev)
    for rep in range(reps):
        for mode in modes:
            barrier.wait()
            if port:  # and a collective just before the load, as checkpoint_ranks.py's barrier
                dist.barrier()
            q.put((rep, mode, r) + _timed(torch, dev, index, r, world, mode))
            if not keep:
                torch.cuda.empty_cache()
    if port:
        dist.destroy_process_group()


def _timed(torch: Any, dev: Any, index: str, r: int, world: int, mode: str) -> tuple[Any, ...]:
    """One load of ``(r, world)``, step by step (``mode``: see above)."""
    from numapin import _storage as S

    torch.cuda.synchronize(dev)
    t = [time.perf_counter()]
    ck, sel, infos, _dev, _read, _alloc = S._open(index, dev, None, (r, world), None, None, 0, 0, "auto")
    t.append(time.perf_counter())
    torch.cuda.mem_get_info(dev)
    t.append(time.perf_counter())
    spent = [0.0]
    with S._DeviceTensors(torch, infos, sel, dev, index) as made:
        ptrs = [made.make(k) for k in range(len(sel))] if mode == "first" else None

        def make(k: int) -> int:
            if ptrs is not None:
                return ptrs[k]
            t0 = time.perf_counter()
            p = made.make(k)
            spent[0] += time.perf_counter() - t0
            return p

        t.append(time.perf_counter())
        opts = S._read_opts(0, 0, "auto")
        opts["readers"] = S._readers(world)
        stream = torch.cuda.current_stream(dev)
        report = ck.load_to_device(sel, make, dev.index, int(stream.cuda_stream), **opts)
        t.append(time.perf_counter())
    torch.cuda.synchronize(dev)
    t.append(time.perf_counter())
    tensors = made.tensors()
    out = {infos[i][0]: x for i, x in zip(sel, tensors)}
    out = {k: out[k] for k in sorted(out)}
    t.append(time.perf_counter())
    n = sum(x.numel() * x.element_size() for x in tensors)
    steps = [round((b - a) * 1e3, 2) for a, b in zip(t, t[1:])]
    return steps, round((t[-1] - t[0]) * 1e3, 1), n, len(sel), report["seconds"], round(spent[0] * 1e3, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--keep-cache", action="store_true", help="keep torch's cache between repetitions")
    ap.add_argument("--modes", default="made,first", help="made (as load_safetensors), first (tensors made before)")
    ap.add_argument("--nccl", action="store_true", help="each rank in an NCCL process group first, as in a job")
    ap.add_argument("--dir", default="/tmp/numapin-sweep")
    a = ap.parse_args()
    modes = a.modes.split(",")
    if not modes or not set(modes) <= {"made", "first"}:
        ap.error(f"--modes {a.modes!r}: a list of made, first")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from checkpoint_ranks import free_port
    from ranks_sweep import collect, start_ranks

    port = free_port() if a.nccl else 0
    procs, q, _barrier = start_ranks(a.dir, a.gib, a.ranks, rank, (a.reps, a.keep_cache, modes, port))
    got = collect(procs, q, a.reps * a.ranks * len(modes))
    if got is None:
        return 1
    print("rep mode  rank  open/meminfo/alloc/read/sync/dict ms          total ms  GB  tensors  reader_s  make_ms")
    for rep, mode, r, steps, total, n, count, secs, spent in sorted(got):
        print(f"{rep:>3} {mode:<5} {r:>4}  {str(steps):<42} {total:>8}  {n / 1e9:.2f}  {count:>7}  {secs:.4f}  {spent}")
    # All ranks' bytes over the slowest rank's time (each starts at the
    # barrier): the aggregate rate of checkpoint_ranks.py.
    print("rep mode  aggregate GB/s")
    for rep in range(a.reps):
        for mode in modes:
            mine = [g for g in got if g[0] == rep and g[1] == mode]
            gbps = sum(g[5] for g in mine) / max(g[4] for g in mine) / 1e6
            print(f"{rep:>3} {mode:<5} {gbps:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

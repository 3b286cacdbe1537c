"""Where each rank's time goes in a hot ``shard=(rank, ranks)`` load: the
steps of ``numapin.load_safetensors`` timed one by one, ``--ranks``
processes (one per GPU) loading at once after a barrier.

    python3 python/bench/load_phases.py [--ranks 2] [--reps 3] [--gib 8]
        [--keep-cache] [--dir /tmp/numapin-sweep]

The steps (milliseconds, per rank and repetition): ``open`` (the index and
the files' headers read, the shard cut), ``meminfo`` (``torch.cuda.
mem_get_info``), ``alloc`` (the destination tensors made by torch's caching
allocator, its own room check included), ``read`` (numapin's reader: the
files to the tensors; ``reader_s`` is its own clock), ``sync`` and
``dict``. It calls the package's private steps (``numapin._storage``) in
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


def rank(r: int, world: int, index: str, reps: int, keep: bool, barrier: Any, q: Any) -> None:
    import torch

    import numapin
    from numapin import _storage as S

    torch.cuda.set_device(r)
    dev = torch.device("cuda", r)
    numapin.load_safetensors(os.path.join(os.path.dirname(index), "warmup.safetensors"), device=dev)
    for rep in range(reps):
        barrier.wait()
        torch.cuda.synchronize(dev)
        t = [time.perf_counter()]
        ck, sel, infos, _dev, _read, _alloc = S._open(index, dev, None, (r, world), None, None, 0, 0, "auto")
        t.append(time.perf_counter())
        torch.cuda.mem_get_info(dev)
        t.append(time.perf_counter())
        made = S._device_tensors(torch, infos, sel, dev, index)
        tensors = [made[infos[i][0]] for i in sel]
        t.append(time.perf_counter())
        opts = S._read_opts(0, 0, "auto")
        opts["readers"] = S._readers(world)
        stream = torch.cuda.current_stream(dev)
        report = ck.load_to_device(sel, [x.data_ptr() for x in tensors], dev.index, int(stream.cuda_stream), **opts)
        t.append(time.perf_counter())
        torch.cuda.synchronize(dev)
        t.append(time.perf_counter())
        out = {infos[i][0]: x for i, x in zip(sel, tensors)}
        out = {k: out[k] for k in sorted(out)}
        t.append(time.perf_counter())
        n = sum(x.numel() * x.element_size() for x in tensors)
        steps = [round((b - a) * 1e3, 2) for a, b in zip(t, t[1:])]
        q.put((rep, r, steps, round((t[-1] - t[0]) * 1e3, 1), n, len(sel), report["seconds"], report["chunk_bytes"]))
        del out, made, tensors
        if not keep:
            torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--keep-cache", action="store_true", help="keep torch's cache between repetitions")
    ap.add_argument("--dir", default="/tmp/numapin-sweep")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ranks_sweep import collect, start_ranks

    procs, q, _barrier = start_ranks(a.dir, a.gib, a.ranks, rank, (a.reps, a.keep_cache))
    got = collect(procs, q, a.reps * a.ranks)
    if got is None:
        return 1
    print("rep rank  open/meminfo/alloc/read/sync/dict ms          total ms  GB  tensors  reader_s  chunk")
    for rep, r, steps, total, n, count, secs, chunk in sorted(got):
        print(f"{rep:>3} {r:>4}  {str(steps):<42} {total:>8}  {n / 1e9:.2f}  {count:>7}  {secs:.4f}  {chunk}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

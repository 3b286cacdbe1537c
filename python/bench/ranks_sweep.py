"""The reader's settings with many ranks loading one hot checkpoint at
once: each of ``--ranks`` processes (one per GPU) loads its share
(``shard=(rank, ranks)``) with each setting in turn, after a barrier, and
the aggregate rate of each setting (all ranks' bytes from the first start
to the last end) is printed per repetition.

    python3 python/bench/ranks_sweep.py [--gib 8] [--ranks 4] [--reps 3]
        [--variants 0x0,0x4,16x1,16x2] [--dir /tmp/numapin-sweep]

A variant is ``THREADSxCHUNK_MIB``: ``threads=`` and ``chunk_bytes=`` of
``numapin.load_safetensors`` (0: numapin's pick; the chunk may be a
fraction, ``16x0.5``). The checkpoint is ``checkpoint_ranks.py``'s (made
once and kept), read once before the timing; each rank's first load (1 MiB)
is untimed. Prints one JSON line per variant: the rates by repetition,
the threads and chunk the reader used, its slots' bytes per rank.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any


def rank(r: int, world: int, index: str, variants: list[tuple[int, float]], reps: int, barrier, q) -> None:  # type: ignore[no-untyped-def]
    import torch

    import numapin

    torch.cuda.set_device(r)
    dev = torch.device("cuda", r)
    numapin.load_safetensors(os.path.join(os.path.dirname(index), "warmup.safetensors"), device=dev)
    for rep in range(reps):
        for k, (th, ch) in enumerate(variants):
            barrier.wait()
            torch.cuda.synchronize(dev)
            t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
            st: dict = {}
            out = numapin.load_safetensors(index, device=dev, shard=(r, world), threads=th,
                                           chunk_bytes=int(ch * (1 << 20)), stats=st)
            torch.cuda.synchronize(dev)
            t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
            n = sum(v.numel() * v.element_size() for v in out.values())
            del out
            q.put((rep, k, t0, t1, n, st.get("threads"), st.get("chunk_bytes"), st.get("staging_bytes")))
            torch.cuda.empty_cache()


def start_ranks(dirname: str, gib: float, ranks: int, target: Any, extra: tuple) -> tuple[list, Any, Any]:
    """``checkpoint_ranks.py``'s checkpoint of ``gib`` GiB in 8 files (made
    once in ``dirname`` and kept), read once, and ``ranks`` spawned
    processes running ``target(r, ranks, index, *extra, barrier, queue)``;
    returns them, the queue and the barrier (which the caller keeps: a
    barrier collected before the children start takes its semaphores
    with it)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import checkpoint_ranks
    from checkpoint import warm

    index, files = checkpoint_ranks.make(dirname, gib, 8)
    for f in files:
        warm(f)
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, ranks, index, *extra, barrier, q)) for r in range(ranks)]
    for p in procs:
        p.start()
    return procs, q, barrier


def collect(procs: list, q: Any, n: int) -> list | None:
    """``n`` results from the ranks' queue ``q``; ``None`` (said on
    standard error) once a rank has died, since the others would wait for
    it at the barrier. The ranks are joined, and ended if still running."""
    import queue

    got: list = []
    try:
        while len(got) < n:
            try:
                got.append(q.get(timeout=1.0))
            except queue.Empty:
                dead = [p.exitcode for p in procs if not p.is_alive() and p.exitcode != 0]
                if dead:
                    print(f"a rank exited with {dead[0]}", file=sys.stderr)
                    return None
    finally:
        for p in procs:
            if p.is_alive() and len(got) < n:
                p.terminate()
            p.join()
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="0x0,0x4,16x1,16x2")
    ap.add_argument("--dir", default="/tmp/numapin-sweep")
    a = ap.parse_args()
    variants = [(int(t), float(c)) for t, c in (v.split("x") for v in a.variants.split(","))]
    procs, q, _barrier = start_ranks(a.dir, a.gib, a.ranks, rank, (variants, a.reps))
    got = collect(procs, q, a.reps * len(variants) * a.ranks)
    if got is None:
        return 1
    for k, (th, ch) in enumerate(variants):
        rates = []
        for rep in range(a.reps):
            rows = [g for g in got if g[0] == rep and g[1] == k]
            t0, t1 = min(g[2] for g in rows), max(g[3] for g in rows)
            rates.append(round(sum(g[4] for g in rows) / (t1 - t0) / 1e9, 2))
        one = next(g for g in got if g[1] == k)
        print(json.dumps({"threads": th, "chunk_mib": ch, "gbps_by_rep": rates, "reader_threads": one[5],
                          "reader_chunk": one[6], "slots_per_rank": one[7]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A checkpoint of many small tensors to one GPU: the tensors made while
the reader reads (as ``load_safetensors`` makes them) against all made
first, alternating in one process, hot.

    python3 python/bench/many_tensors.py [--tensors 20000] [--bytes 4096]
        [--reps 5] [--modes made,first,safetensors] [--dir /tmp/numapin-many]

Prints, per repetition and mode, the load's milliseconds and its
microseconds per tensor (``made``: ``load_safetensors``; ``first``: every
tensor made by the same code before the read, then read; ``safetensors``:
``safetensors.torch.load_file`` to the same GPU, the baseline). Torch's cache is
emptied before each load. A profile of the package's private steps
(``numapin._storage``), not an example.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def make(dirname: str, n: int, size: int) -> str:
    """The checkpoint (made once in ``dirname`` and kept)."""
    import torch
    from safetensors.torch import save_file

    path = os.path.join(dirname, f"many-{n}x{size}.safetensors")
    if not os.path.exists(path):
        os.makedirs(dirname, exist_ok=True)
        save_file({f"t{i:06d}": torch.full((size,), i % 251, dtype=torch.uint8) for i in range(n)}, path + ".tmp")
        os.replace(path + ".tmp", path)
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    return path


def first(path: str, dev: Any) -> dict[str, Any]:
    """The load with every tensor made before the read."""
    import torch

    from numapin import _storage as S

    ck, sel, infos, _dev, _read, _alloc = S._open(path, dev, None, None, None, None, 0, 0, "auto")
    with S._DeviceTensors(torch, infos, sel, dev, path) as made:
        ptrs = [made.make(k) for k in range(len(sel))]
        stream = torch.cuda.current_stream(dev)
        ck.load_to_device(sel, lambda k: ptrs[k], dev.index, int(stream.cuda_stream), **S._read_opts(0, 0, "auto"))
    return {infos[i][0]: t for i, t in zip(sel, made.tensors())}


def safetensors_load(path: str, dev: Any) -> dict[str, Any]:
    """The baseline: safetensors' own loader to the same GPU."""
    from safetensors.torch import load_file

    return load_file(path, device=str(dev))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=20000)
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", default="made,first",
                    help="made (load_safetensors), first (tensors made before), safetensors (load_file)")
    ap.add_argument("--dir", default="/tmp/numapin-many")
    a = ap.parse_args()
    import torch

    import numapin

    dev = torch.device("cuda", torch.cuda.current_device())
    path = make(a.dir, a.tensors, a.bytes)
    every = {"made": lambda: numapin.load_safetensors(path, device=dev), "first": lambda: first(path, dev),
             "safetensors": lambda: safetensors_load(path, dev)}
    loads = {m: every[m] for m in a.modes.split(",")}
    every["made"]()  # numapin's runtime and staging made untimed
    print(f"{a.tensors} tensors of {a.bytes} bytes; rep mode ms us/tensor")
    for rep in range(a.reps):
        for mode, load in loads.items():
            torch.cuda.empty_cache()
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            out = load()
            torch.cuda.synchronize(dev)
            dt = time.perf_counter() - t
            assert len(out) == a.tensors and bool((out["t000007"] == 7).all())
            del out
            print(f"{rep} {mode:<11} {dt * 1e3:8.1f} {dt * 1e6 / a.tensors:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

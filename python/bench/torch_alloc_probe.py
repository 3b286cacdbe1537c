"""What torch's caching allocator costs a checkpoint load's destination
tensors on an empty cache: 100 tensors of ``checkpoint_ranks.py``'s shapes
(about 5.1 GB) made one by one (one ``cudaMalloc`` each), against one block
of their bytes made and freed first so that they are split from it.

    python3 python/bench/torch_alloc_probe.py [--reps 4]

Run it again with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` to
see that setting's costs. Prints milliseconds per repetition.
"""

from __future__ import annotations

import argparse
import sys
import time

SHAPES = [((32000, 4096), "bfloat16"), ((4096, 4096), "bfloat16"), ((11008, 4096), "float16"),
          ((4096,), "float32"), ((1024, 1024), "float32"), ((4096, 128), "bfloat16"),
          ((333, 777), "float16"), ((7,), "float32")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    a = ap.parse_args()
    import torch

    torch.cuda.set_device(0)
    sel = [(sh, getattr(torch, dt)) for sh, dt in (SHAPES[i % len(SHAPES)] for i in range(100))]
    total = sum(torch.empty(sh, dtype=dt, device="meta").numel() * torch.empty((), dtype=dt).element_size()
                for sh, dt in sel)
    print(f"100 tensors, {total / 1e9:.2f} GB")
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    for rep in range(a.reps):
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        t = time.perf_counter()
        ts = [torch.empty(sh, dtype=dt, device="cuda") for sh, dt in sel]
        fresh = time.perf_counter() - t
        del ts
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        t = time.perf_counter()
        block = torch.empty(total + (64 << 20), dtype=torch.uint8, device="cuda")
        made = time.perf_counter() - t
        del block
        t = time.perf_counter()
        ts = [torch.empty(sh, dtype=dt, device="cuda") for sh, dt in sel]
        split = time.perf_counter() - t
        segments = torch.cuda.memory_stats()["segment.all.current"]
        del ts
        print(f"rep {rep}: one by one {fresh * 1e3:.2f} ms; one block {made * 1e3:.2f} ms, "
              f"then the tensors from it {split * 1e3:.2f} ms ({segments} segments)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""numapin's Python package against torch's own pinned memory, in one run.

    python3 python/bench/pinned.py [--gpu 0] [--reps 20] [--json]

Figures (medians), each with torch's baseline measured here:
  h2d / d2h GB/s      256 MiB copies from numapin.empty vs torch pin_memory=True tensors
  waste ratio         reserved / requested after 256 log-uniform sizes (4 KiB .. 256 MiB)
  pin GB/s            numapin.pin vs tensor.pin_memory() of a shared-memory tensor (64 MiB .. 1 GiB)
  cold empty ms       a fresh process's first 1 GiB pinned tensor: numapin.empty vs torch
                      (default and pinned_use_cuda_host_register with 8 threads)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

import numapin

MIB = 1 << 20


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def copy_gbps(h: torch.Tensor, d: torch.Tensor, to_device: bool, reps: int) -> float:
    s = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    with torch.cuda.stream(s):
        for i in range(reps + 2):
            start.record(s)
            if to_device:
                d.copy_(h, non_blocking=True)
            else:
                h.copy_(d, non_blocking=True)
            end.record(s)
            end.synchronize()
            if i >= 2:
                out.append(h.numel() * h.element_size() / (start.elapsed_time(end) / 1e3) / 1e9)
    return median(out)


def bandwidth(gpu: int, reps: int) -> dict[str, float]:
    n = 256 * MIB
    d = torch.empty(n, dtype=torch.uint8, device=f"cuda:{gpu}")
    ht = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    hn = numapin.empty(n, torch.uint8, gpu=gpu)
    assert hn.is_pinned() and ht.is_pinned()
    ht.fill_(1)
    hn.fill_(1)
    r = {}
    for way, flag in (("h2d", True), ("d2h", False)):
        r[f"{way}_torch_gbps"] = copy_gbps(ht, d, flag, reps)
        r[f"{way}_numapin_gbps"] = copy_gbps(hn, d, flag, reps)
        r[f"{way}_ratio"] = r[f"{way}_numapin_gbps"] / r[f"{way}_torch_gbps"]
    del hn, ht
    return r


def sizes(count: int = 256, seed: int = 7) -> list[int]:
    import random

    rng = random.Random(seed)
    lo, hi = math.log(4096), math.log(256 * MIB)
    return [int(math.exp(rng.uniform(lo, hi))) for _ in range(count)]


def waste(gpu: int) -> dict[str, float]:
    sz = sizes()
    requested = sum(sz)
    keep = [numapin.empty(s, torch.uint8, gpu=gpu) for s in sz]
    reserved = sum(x["bytes_reserved"] for x in numapin.stats())
    del keep
    numapin.trim()
    r = {"requested_bytes": requested, "numapin_reserved_bytes": reserved, "numapin_waste_ratio": reserved / requested}
    keep = [torch.empty(s, dtype=torch.uint8, pin_memory=True) for s in sz]
    stats = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    r["torch_host_stats"] = {k: v for k, v in stats.items() if "bytes" in k and k.endswith(".current")}
    held = stats.get("reserved_bytes.current", 0)
    del keep
    if held:
        r["torch_reserved_bytes"] = held
        r["torch_waste_ratio"] = held / requested
    empty_host_cache()
    return r


def empty_host_cache() -> None:
    """Gives torch's cached pinned blocks back (torch >= 2.5)."""
    f = getattr(torch.cuda, "host_empty_cache", None) or getattr(torch._C, "_host_emptyCache", None)
    if f is not None:
        f()


def timed_gbps(f, nbytes: int, reps: int, before=None) -> float:
    """Median GB/s of `f()` (its result dropped at once), after two warm-up calls."""
    out = []
    for i in range(reps + 2):
        if before is not None:
            before()
        a = time.perf_counter()
        p = f()
        b = time.perf_counter()
        del p
        if i >= 2:
            out.append(nbytes / (b - a) / 1e9)
        time.sleep(0.02)  # let torch's OpenMP threads stop spinning between calls
    return median(out)


def pin_rates(gpu: int, reps: int) -> dict[str, float]:
    """pin_memory() warm (torch's caching host allocator reuses the block, as
    in a DataLoader's pin thread) and cold (cache emptied first: a fresh
    cudaHostAlloc per call), against numapin.pin (arena reuse, as in a loop)."""
    r = {}
    n = max(3, reps // 2)
    for mib in (64, 256, 1024):
        x = torch.randint(0, 255, (mib * MIB,), dtype=torch.uint8).share_memory_()
        assert torch.equal(numapin.pin(x, gpu=gpu), x)
        nb = mib * MIB
        warm = timed_gbps(x.pin_memory, nb, n)
        cold = timed_gbps(x.pin_memory, nb, n, before=empty_host_cache)
        ours = timed_gbps(lambda: numapin.pin(x, gpu=gpu), nb, n)
        r[f"pin_{mib}mib_torch_warm_gbps"] = warm
        r[f"pin_{mib}mib_torch_cold_gbps"] = cold
        r[f"pin_{mib}mib_numapin_gbps"] = ours
        r[f"pin_{mib}mib_ratio_vs_warm"] = ours / warm
        r[f"pin_{mib}mib_ratio_vs_cold"] = ours / cold
        del x
    return r


COLD = """
import sys, time, torch
torch.cuda.init(); torch.empty(1, device="cuda:{gpu}")
kind = sys.argv[1]
if kind == "numapin":
    import numapin
    numapin.configure(budget_bytes=8 << 30)
    numapin.stats()  # the runtime (topology probe) exists before the clock starts
    a = time.perf_counter(); t = numapin.empty(1 << 30, torch.uint8, gpu={gpu}); b = time.perf_counter()
    assert t.is_pinned()
else:
    a = time.perf_counter(); t = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True); b = time.perf_counter()
print((b - a) * 1e3)
"""


def cold(gpu: int, reps: int) -> dict[str, float]:
    r = {}
    code = COLD.format(gpu=gpu)
    for name, env in (
        ("torch_default", {}),
        ("torch_register8", {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"}),
        ("numapin", {}),
    ):
        e = dict(os.environ)
        e.update(env)
        kind = "numapin" if name == "numapin" else "torch"
        ms = []
        for _ in range(max(3, reps // 4)):
            out = subprocess.run([sys.executable, "-c", code, kind], env=e, capture_output=True, text=True, check=True)
            ms.append(float(out.stdout.strip().splitlines()[-1]))
        r[f"cold_empty_1gib_{name}_ms"] = median(ms)
    r["cold_ratio_vs_torch_default"] = r["cold_empty_1gib_torch_default_ms"] / r["cold_empty_1gib_numapin_ms"]
    r["cold_ratio_vs_torch_register8"] = r["cold_empty_1gib_torch_register8_ms"] / r["cold_empty_1gib_numapin_ms"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", default="bandwidth,waste,pin,cold")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not (1 <= a.reps <= 1000):
        sys.exit("pinned.py: --reps must be from 1 to 1000")
    if not torch.cuda.is_available():
        sys.exit("pinned.py: needs a CUDA GPU")
    numapin.configure(budget_bytes=24 << 30)
    torch.cuda.init()
    out: dict[str, object] = {"gpu": torch.cuda.get_device_name(a.gpu), "torch": torch.__version__}
    only = a.only.split(",")
    if "bandwidth" in only:
        out.update(bandwidth(a.gpu, a.reps))
    if "waste" in only:
        out.update(waste(a.gpu))
    if "pin" in only:
        out.update(pin_rates(a.gpu, a.reps))
    if "cold" in only:
        out.update(cold(a.gpu, a.reps))
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:40} {v:.3f}" if isinstance(v, float) else f"{k:40} {v}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Baseline for `numapin bench --only pinning`: how long PyTorch takes to pin
fresh host memory, in milliseconds per GiB, with its default pinned
allocator (cudaHostAlloc) and with its register mode
(pinned_use_cuda_host_register, N register threads). Each figure is timed in
a fresh process (the caching host allocator would otherwise hand back a
block it already holds), after CUDA is initialised; one JSON line per mode
and size.
Usage: python3 torch_cold_pin.py [MiB sizes, default 256,4096] [reps, default 3] [threads, default 8,16]"""
import json, os, subprocess, sys

CHILD = r"""
import sys, time, torch
nbytes = int(sys.argv[1])
torch.cuda.init(); torch.empty(1, device="cuda")
t = time.perf_counter()
x = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
d = time.perf_counter() - t
assert x.is_pinned()
print(d * 1e3 * (1 << 30) / nbytes)
"""


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main():
    sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "256,4096").split(",")]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    threads = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "8,16").split(",")]
    modes = [("torch_default", None)] + [
        (f"torch_register{t}", f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{t}")
        for t in threads
    ]
    import torch

    for mib in sizes:
        for name, conf in modes:
            env = dict(os.environ)
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            else:
                env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            samples = []
            for _ in range(reps):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(mib << 20)],
                    env=env, capture_output=True, text=True, check=True,
                )
                samples.append(float(out.stdout.strip().splitlines()[-1]))
            print(json.dumps({
                "baseline": "torch_cold_pin", "mode": name, "mib": mib,
                "ms_per_gib_median": median(samples), "ms_per_gib_min": min(samples),
                "ms_per_gib_max": max(samples), "reps": reps, "torch": torch.__version__,
            }), flush=True)


if __name__ == "__main__":
    main()

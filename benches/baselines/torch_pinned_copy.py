#!/usr/bin/env python3
"""Baseline for the loader's all-GPU figure: one thread issues pinned
host-to-device copies to every GPU in turn (non_blocking, one stream per
GPU) and reports the aggregate GB/s (10^9 bytes/s) as one JSON line.
Usage: python3 torch_pinned_copy.py [MiB per copy, default 64] [copies per GPU, default 64]"""
import json, sys, time
import torch

mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
copies = int(sys.argv[2]) if len(sys.argv) > 2 else 64
n = torch.cuda.device_count()
nbytes = mib << 20
srcs = [torch.empty(nbytes, dtype=torch.uint8).pin_memory().fill_(i) for i in range(n)]
dsts = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
streams = [torch.cuda.Stream(device=i) for i in range(n)]

def run(k):
    for _ in range(k):
        for i in range(n):
            with torch.cuda.stream(streams[i]):
                dsts[i].copy_(srcs[i], non_blocking=True)
    for s in streams:
        s.synchronize()

run(2)  # warm-up
reps = []
for _ in range(3):
    t = time.perf_counter()
    run(copies)
    reps.append(n * copies * nbytes / (time.perf_counter() - t) / 1e9)
reps.sort()
print(json.dumps({"baseline": "torch_pinned_copy", "gpus": n, "mib": mib, "copies_per_gpu": copies,
                  "gbps_median": reps[1], "gbps_min": reps[0], "gbps_max": reps[2],
                  "torch": torch.__version__}))

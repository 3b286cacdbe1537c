#!/usr/bin/env python3
"""Baseline for the loader's one-GPU figure: a PyTorch DataLoader with
pin_memory=True delivering 4 MiB samples (filled with a pattern, like the
loader's producer) to one GPU, with 4 and 8 workers; GB/s (10^9 bytes/s)
of delivered samples, as one JSON line.
Usage: python3 torch_dataloader.py [samples, default 2048] [gpu, default 0]"""
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

SAMPLE = 4 << 20
samples = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
dev = torch.device(f"cuda:{int(sys.argv[2]) if len(sys.argv) > 2 else 0}")

class Pattern(Dataset):
    def __len__(self):
        return samples
    def __getitem__(self, i):
        return torch.arange(SAMPLE // 4, dtype=torch.int32).add_(i).view(torch.uint8)

out = {"baseline": "torch_dataloader", "sample_mib": SAMPLE >> 20, "samples": samples, "torch": torch.__version__}
for workers in (4, 8):
    dl = DataLoader(Pattern(), batch_size=None, num_workers=workers, pin_memory=True, prefetch_factor=4)
    it = iter(dl)
    for _ in range(2 * workers):  # warm-up: workers started, queues full
        next(it).to(dev, non_blocking=True)
    torch.cuda.synchronize(dev)
    t, n = time.perf_counter(), 0
    for x in it:
        x.to(dev, non_blocking=True)
        n += 1
    torch.cuda.synchronize(dev)
    out[f"gbps_{workers}_workers"] = n * SAMPLE / (time.perf_counter() - t) / 1e9
print(json.dumps(out))

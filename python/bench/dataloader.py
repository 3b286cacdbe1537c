"""numapin.torch.DataLoader against torch's DataLoader(pin_memory=True) plus
`.to(device, non_blocking=True)`, in one run, on the same dataset.

    python3 python/bench/dataloader.py [--batches 48] [--json]

For each of 4 and 8 workers and 4 MiB and 256 KiB uint8 samples (64 MiB and
4 MiB batches), and for a CPU-bound dataset (per-sample work that dominates):
delivered GB/s (every batch checked on the device), the main process's time
per batch (inside next()), and the peak resident memory of the main process
and of the workers. Ratios are numapin / torch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import numapin.torch as nt


class Samples(Dataset):
    """`n` samples of `size` bytes, sample i filled with i % 251; `work_ms`
    of busy CPU per sample for the CPU-bound case."""

    def __init__(self, n: int, size: int, work_ms: float = 0.0) -> None:
        self.n, self.size, self.work_ms = n, size, work_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.work_ms:
            end = time.perf_counter() + self.work_ms / 1e3
            while time.perf_counter() < end:
                pass
        return torch.full((self.size,), i % 251, dtype=torch.uint8)


def run(kind: str, ds: Samples, batch: int, workers: int, batches: int, dev: torch.device) -> dict[str, float]:
    kw = dict(batch_size=batch, num_workers=workers, prefetch_factor=4, drop_last=True)
    if kind == "torch":
        loader = DataLoader(ds, pin_memory=True, **kw)
    else:
        loader = nt.DataLoader(ds, device=dev, **kw)
    warm = 4
    stream = torch.cuda.current_stream(dev)
    it = iter(loader)
    in_next = 0.0
    t0 = 0.0
    bad = 0
    sums = []
    for b in range(warm + batches):
        a = time.perf_counter()
        x = next(it)
        if kind == "torch":
            x = x.to(dev, non_blocking=True)
        in_next += time.perf_counter() - a if b >= warm else 0.0
        # The consumer's work: a checksum of every byte, on the device.
        sums.append((b, x.view(batch, -1)[:, 0].to(torch.int64), x.view(batch, -1).to(torch.int32).sum(1)))
        if b == warm - 1:
            stream.synchronize()
            t0 = time.perf_counter()
    stream.synchronize()
    dt = time.perf_counter() - t0
    for b, first, total in sums:
        if not torch.equal(total, first.to(torch.int32) * ds.size):
            bad += 1
    out = {"gbps": batches * batch * ds.size / dt / 1e9, "ms_in_next_per_batch": in_next / batches * 1e3, "bad_batches": bad}
    if kind != "torch":
        # Batches that took torch's path instead of a slot (should be 0).
        out["plain_batches"] = sum(loader.stats()["plain_batches"].values())
    del it, loader, sums
    return out


def peak_mib() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return me, kids


CASES = {
    # name: (sample bytes, batch, workers, busy ms per sample)
    "4mib_w8": (4 << 20, 16, 8, 0.0),
    "4mib_w4": (4 << 20, 16, 4, 0.0),
    "256kib_w8": (256 << 10, 16, 8, 0.0),
    "256kib_w4": (256 << 10, 16, 4, 0.0),
    "cpubound_w8": (4 << 20, 16, 8, 20.0),
}


def available_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def one(case: str, kind: str, batches: int) -> dict[str, float]:
    """One loader in this process: its figures, this process's peaks, and
    the machine's peak memory use over the run (MemAvailable's drop: shared
    memory counted once, whichever processes map it)."""
    import threading

    size, batch, workers, work = CASES[case]
    nb = batches if not work else max(8, batches // 2)
    ds = Samples((nb + 8) * batch, size, work)
    torch.cuda.init()
    torch.empty(1, device="cuda:0")
    base = available_mib()
    low = [base]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            low[0] = min(low[0], available_mib())
            time.sleep(0.01)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    r = run(kind, ds, batch, workers, nb, torch.device("cuda", 0))
    stop.set()
    w.join()
    me, kids = peak_mib()
    r["peak_rss_main_mib"] = me
    r["peak_rss_workers_mib"] = kids
    r["peak_host_used_mib"] = base - low[0]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=48)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "KIND"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not (8 <= a.batches <= 10000):
        sys.exit("dataloader.py: --batches must be from 8 to 10000")
    if not torch.cuda.is_available():
        sys.exit("dataloader.py: needs a CUDA GPU")
    if a.one:
        print(json.dumps(one(a.one[0], a.one[1], a.batches)))
        return
    out: dict[str, object] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for case in CASES:
        for kind in ("torch", "numapin"):
            p = subprocess.run(
                [sys.executable, __file__, "--batches", str(a.batches), "--one", case, kind],
                capture_output=True, text=True, env=dict(os.environ),
            )
            if p.returncode != 0:
                out[f"{case}_{kind}_error"] = p.stderr.strip().splitlines()[-1:] 
                continue
            for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items():
                out[f"{case}_{kind}_{k}"] = v
        if f"{case}_numapin_gbps" in out and f"{case}_torch_gbps" in out:
            out[f"{case}_ratio"] = out[f"{case}_numapin_gbps"] / out[f"{case}_torch_gbps"]
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:44} {v:.3f}" if isinstance(v, float) else f"{k:44} {v}")


if __name__ == "__main__":
    main()

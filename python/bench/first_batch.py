"""How long the first batch takes: numapin.torch.DataLoader against torch's
DataLoader(pin_memory=True) plus `.to(device, non_blocking=True)`.

    python3 python/bench/first_batch.py [--workers 8] [--reps 3] [--json]

Each measurement runs in a fresh process that has already initialised CUDA
(as a trainer has by the time it builds its loader) and, for numapin,
probed the machine once (`numapin.place()`, as any numapin call before the
loader does; the probe's own cost is reported apart). It times from
building the loader to the first batch on the device (synchronised), and
from `iter()` to it. Two datasets, as the issue measured them: images from
a RAM array (uint8 3x224x224 crops of one large array), and the same with
an augmentation (random crop, flip, conversion to float and normalisation,
a few milliseconds per sample on the CPU). Ratios are numapin / torch;
"waiting" is numapin with every worker waiting for the pool
(``FIRST_BATCH_WAITS``), the first batch's too; by default worker 0's first
batch takes torch's path while the pool is made and the others wait.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    r"""
    import json, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    kind, case, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dev = torch.device("cuda", 0)
    torch.ones(1, device=dev)  # CUDA up, as in a trainer
    probe_s = None
    if kind.startswith("numapin"):
        import numapin, numapin.torch as nt
        t = time.perf_counter()
        numapin.place(0)
        probe_s = time.perf_counter() - t
        if kind == "numapin-wait":
            nt.FIRST_BATCH_WAITS = True  # the first batch waits for the pool too

    class Images(Dataset):
        def __init__(self, augment):
            g = torch.Generator().manual_seed(0)
            self.data = torch.randint(0, 255, (512, 3, 256, 256), dtype=torch.uint8, generator=g)
            self.augment = augment
        def __len__(self):
            return 4096
        def __getitem__(self, i):
            img = self.data[i % 512]
            y, x = (i * 7) % 32, (i * 13) % 32
            img = img[:, y:y + 224, x:x + 224]
            if self.augment:
                if i % 2:
                    img = img.flip(2)
                img = img.float().div_(255).sub_(0.45).div_(0.225)
            return img.contiguous()

    ds = Images(case == "augment")
    kw = dict(batch_size=64, num_workers=workers, prefetch_factor=2, shuffle=False)
    t0 = time.perf_counter()
    if kind == "torch":
        loader = DataLoader(ds, pin_memory=True, **kw)
    else:
        loader = nt.DataLoader(ds, device=dev, **kw)
    t1 = time.perf_counter()
    it = iter(loader)
    b = next(it)
    if kind == "torch":
        b = b.to(dev, non_blocking=True)
    torch.cuda.synchronize(dev)
    t2 = time.perf_counter()
    ok = bool(b.is_cuda) and b.shape[0] == 64
    stats = loader.stats() if kind != "torch" else {}
    del it, loader
    print(json.dumps({
        "construct_s": t1 - t0, "first_batch_s": t2 - t0, "iter_to_batch_s": t2 - t1,
        "probe_s": probe_s, "ok": ok,
        "plain": stats.get("plain_batches"), "slotted": stats.get("slotted_batches"),
    }))
    """
)


def one(kind: str, case: str, workers: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, case, str(workers)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} {case}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for case in ("images", "augment"):
        kinds = ("torch", "numapin", "numapin-wait")
        got = {k: [one(k, case, a.workers) for _ in range(a.reps)] for k in kinds}
        med = {k: statistics.median(r["first_batch_s"] for r in v) for k, v in got.items()}
        rows.append({
            "case": case, "workers": a.workers,
            "torch_first_batch_s": med["torch"], "numapin_first_batch_s": med["numapin"],
            "ratio": med["numapin"] / med["torch"],
            "numapin_wait_first_batch_s": med["numapin-wait"],
            "wait_ratio": med["numapin-wait"] / med["torch"],
            "numapin_probe_s": statistics.median(r["probe_s"] for r in got["numapin"]),
            "runs": got,
        })
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':8} {'workers':>7} {'torch s':>9} {'numapin s':>10} {'ratio':>6} "
          f"{'waiting s':>10} {'ratio':>6} {'probe s':>8}")
    for r in rows:
        print(f"{r['case']:8} {r['workers']:>7} {r['torch_first_batch_s']:9.3f} "
              f"{r['numapin_first_batch_s']:10.3f} {r['ratio']:6.2f} "
              f"{r['numapin_wait_first_batch_s']:10.3f} {r['wait_ratio']:6.2f} {r['numapin_probe_s']:8.3f}")
        for k in ("torch", "numapin", "numapin-wait"):
            print(f"  {k}: " + ", ".join(f"{x['first_batch_s']:.3f}" for x in r["runs"][k])
                  + (f"  plain={r['runs'][k][0]['plain']}" if k != "torch" else ""))


if __name__ == "__main__":
    main()

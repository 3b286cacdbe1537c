"""numapin.torch.DataLoader against torch's DataLoader(pin_memory=True) plus
`.to(device, non_blocking=True)`, in one run, on the same dataset.

    python3 python/bench/dataloader.py [--seconds 10] [--runs 3] [--json]
    python3 python/bench/dataloader.py --seconds 1 --runs 1 --cases 256kib_w4   # a smoke test

Cases: 4 and 8 workers with 4 MiB and 256 KiB uint8 samples (64 MiB and
4 MiB batches), and a CPU-bound dataset (20 ms of busy work per sample).
Each measurement is one loader in a fresh process: warm-up batches for
``--warmup`` seconds (the pool made and grown, workers started), then
batches for at least ``--seconds`` seconds, every batch checked on the
device. Each case is measured ``--runs`` times, torch and numapin in turn
(the order swapped every run), so that both see the same drift of a noisy
machine; the summary gives the median with min and max of each, the ratio
of the medians and the ratio within each run (numapin / torch).

Figures: delivered GB/s, the main process's time per batch inside
``next()``, batches that took torch's path, the peak resident memory of the
main process and the workers, and the machine's peak memory use (the drop
of MemAvailable: shared memory counted once).

``--variant NAME=VAR=VALUE,VAR=VALUE`` adds a kind ``numapin:NAME`` run
with those environment variables (``PYTHONPATH`` to compare two builds,
``NUMAPIN_DATALOADER_COPY=torch`` for ``torch.stack`` into the slots, or
``NUMAPIN_DATALOADER_PROFILE=1`` for the per-stage timers of
``numapin._dlprofile``, reported per measurement as ``profile``);
``--kinds`` picks the kinds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

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


def one(case: str, kind: str, seconds: float, warmup: float) -> dict:
    """One loader in this process: its figures, this process's peaks, and
    the machine's peak memory use over the run."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    size, batch, workers, work_ms = CASES[case]

    class Samples(Dataset):
        """Sample i of `size` bytes filled with i % 251, after `work_ms` of
        busy CPU."""

        def __len__(self) -> int:
            return 1 << 40

        def __getitem__(self, i: int) -> torch.Tensor:
            if work_ms:
                end = time.perf_counter() + work_ms / 1e3
                while time.perf_counter() < end:
                    pass
            return torch.full((size,), i % 251, dtype=torch.uint8)

    dev = torch.device("cuda", 0)
    torch.empty(1, device=dev)
    base = available_mib()
    low = [base]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            low[0] = min(low[0], available_mib())
            time.sleep(0.01)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    kw = dict(batch_size=batch, num_workers=workers, prefetch_factor=4, drop_last=True)
    if kind == "torch":
        loader = DataLoader(Samples(), pin_memory=True, **kw)
    else:
        import numapin.torch as nt

        loader = nt.DataLoader(Samples(), device=dev, **kw)
    stream = torch.cuda.current_stream(dev)
    sums: list = []
    it = iter(loader)
    in_next = 0.0
    n = 0
    timed = False
    t0 = t_start = time.perf_counter()
    min_warm = 4 * workers + 8
    while True:
        a = time.perf_counter()
        x = next(it)
        if kind == "torch":
            x = x.to(dev, non_blocking=True)
        b = time.perf_counter()
        # The consumer's work: a checksum of every byte, on the device
        # (compared after the timing).
        xb = x.view(batch, -1)
        sums.append((xb.sum(1, dtype=torch.int64), xb[:, 0].to(torch.int64)))
        if timed:
            in_next += b - a
            n += 1
            if b - t0 >= seconds:
                break
        elif b - t_start >= warmup and n >= min_warm:
            stream.synchronize()
            timed, n, t0 = True, 0, time.perf_counter()
        else:
            n += 1
    stream.synchronize()
    dt = time.perf_counter() - t0
    total = torch.stack([s for s, _ in sums])
    first = torch.stack([f for _, f in sums])
    bad = (total != first * size).any(1).sum()
    out = {
        "gbps": n * batch * size / dt / 1e9,
        "batches": n,
        "seconds": dt,
        "ms_in_next_per_batch": in_next / n * 1e3,
        "bad_batches": int(bad.item()),
    }
    if kind != "torch":
        s = loader.stats()
        out["plain_batches"] = sum(s["plain_batches"].values())
        out["plain_why"] = s["plain_batches"]
        out["nslots"] = s["nslots"]
    del it, loader
    folder = os.environ.get("NUMAPIN_DATALOADER_PROFILE_DIR")
    if folder and kind != "torch":
        from numapin import _dlprofile

        _dlprofile.dump(force=True)
        out["profile"] = {
            role: {k: {"ms_per_call": 1e3 * t / max(c, 1), "calls": c, "seconds": t} for k, (t, c) in st.items()}
            for role, st in _dlprofile.read(folder).items()
        }
    stop.set()
    w.join()
    out["peak_rss_main_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["peak_rss_workers_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    out["peak_host_used_mib"] = base - low[0]
    return out


def child(case: str, kind: str, a: argparse.Namespace, env: dict[str, str]) -> dict:
    import tempfile

    cmd = [sys.executable, __file__, "--one", case, kind, "--seconds", str(a.seconds), "--warmup", str(a.warmup)]
    with tempfile.TemporaryDirectory(prefix="numapin-dlprofile-") as folder:
        if env.pop("NUMAPIN_DATALOADER_PROFILE", "") == "1":
            env["NUMAPIN_DATALOADER_PROFILE_DIR"] = folder
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.seconds * 10 + 300)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="timed seconds per measurement (default 10)")
    ap.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per measurement (default 2)")
    ap.add_argument("--runs", type=int, default=3, help="measurements of each case and kind (default 3)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--kinds", default="torch,numapin", help="comma-separated: torch, numapin, numapin:VARIANT")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE,...")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", metavar="FILE", help="also write every measurement to FILE as it comes (JSON)")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "KIND"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not (0.1 <= a.seconds <= 3600 and 0 <= a.warmup <= 600 and 1 <= a.runs <= 100):
        sys.exit("dataloader.py: --seconds 0.1-3600, --warmup 0-600, --runs 1-100")
    if a.one:
        print(json.dumps(one(a.one[0], a.one[1], a.seconds, a.warmup)))
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("dataloader.py: needs a CUDA GPU")
    cases = [c for c in a.cases.split(",") if c]
    kinds = [k for k in a.kinds.split(",") if k]
    variants: dict[str, dict[str, str]] = {}
    for v in a.variant:
        name, _, rest = v.partition("=")
        variants[name] = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    for c in cases:
        if c not in CASES:
            sys.exit(f"dataloader.py: unknown case {c!r} (one of {', '.join(CASES)})")
    for k in kinds:
        if k not in ("torch", "numapin") and not (k.startswith("numapin:") and k[8:] in variants):
            sys.exit(f"dataloader.py: unknown kind {k!r} (torch, numapin, or numapin:NAME with --variant NAME=...)")
    got: dict[str, dict[str, list[dict]]] = {c: {k: [] for k in kinds} for c in cases}
    for r in range(a.runs):
        for c in cases:
            order = kinds if r % 2 == 0 else kinds[::-1]
            for k in order:
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                env.update(variants.get(k.partition(":")[2], {}))
                res = child(c, "torch" if k == "torch" else "numapin", a, env)
                res["run"] = r
                got[c][k].append(res)
                print(f"run {r + 1} {c} {k}: " + (f"{res['gbps']:.2f} GB/s" if "gbps" in res else res.get("error", "?")),
                      file=sys.stderr, flush=True)
                if a.out:
                    with open(a.out, "w") as f:
                        json.dump(got, f)
    out: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "seconds": a.seconds,
                 "runs": a.runs, "cases": {}}
    for c in cases:
        row: dict = {}
        for k in kinds:
            ok = [x for x in got[c][k] if "gbps" in x]
            row[k] = {
                "gbps": summary([x["gbps"] for x in ok]),
                "ms_in_next": summary([x["ms_in_next_per_batch"] for x in ok]),
                "host_used_mib": summary([x["peak_host_used_mib"] for x in ok]),
                "bad_batches": sum(x["bad_batches"] for x in ok),
                "plain_batches": [x.get("plain_batches") for x in ok],
                "errors": [x["error"] for x in got[c][k] if "error" in x],
                "measurements": got[c][k],
            }
            if k != "torch" and "torch" in kinds and row[k]["gbps"] and row["torch"]["gbps"]:
                tor = {x["run"]: x["gbps"] for x in got[c]["torch"] if "gbps" in x}
                per_run = [x["gbps"] / tor[x["run"]] for x in ok if x["run"] in tor]
                row[k]["ratio"] = row[k]["gbps"]["median"] / row["torch"]["gbps"]["median"]
                row[k]["ratio_per_run"] = per_run
                tm = row["torch"]["host_used_mib"]["median"]
                row[k]["host_used_ratio"] = row[k]["host_used_mib"]["median"] / tm if tm > 0 else None
        out["cases"][c] = row
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{out['gpu']}, torch {out['torch']}, {a.runs} run(s) of {a.seconds:g} s each")
    print(f"{'case':12} {'kind':16} {'GB/s median (min-max)':26} {'ratio':>6} {'per run':>18} "
          f"{'ms in next()':>12} {'host MiB':>9} {'plain':>6} {'bad':>4}")
    for c, row in out["cases"].items():
        for k, v in row.items():
            g = v["gbps"]
            if not g:
                print(f"{c:12} {k:16} failed: {v['errors'][:1]}")
                continue
            per = ",".join(f"{x:.1f}" for x in v.get("ratio_per_run", []))
            ratio = f"{v['ratio']:.2f}" if "ratio" in v else ""
            plain = sum(p or 0 for p in v["plain_batches"])
            print(f"{c:12} {k:16} {g['median']:6.2f} ({g['min']:.2f}-{g['max']:.2f}){'':6} {ratio:>6} {per:>18} "
                  f"{v['ms_in_next']['median']:12.2f} {v['host_used_mib']['median']:9.0f} {plain:6} {v['bad_batches']:4}")


if __name__ == "__main__":
    main()

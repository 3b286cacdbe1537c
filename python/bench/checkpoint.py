"""numapin.load_safetensors against the usual ways of loading a checkpoint to
a GPU, side by side in one run, hot (the files in the page cache) and cold
(the page cache dropped before each load; root), with the goals' baselines
measured in the same run: the drive's best sequential rate with several
O_DIRECT reads in flight, and the pinned host-to-device rate of numapin's
arena.

    sudo python3 python/bench/checkpoint.py [--dir /tmp/numapin-ckpt]
        [--gib 8] [--reps 3] [--device cuda:0] [--json] [--keep]
        [--temps hot,cold] [--loaders numapin,st_cuda,st_cpu_to,torch_mmap]
    sudo python3 python/bench/checkpoint.py --ranks N [...]   (many ranks at
        once, one process per GPU: see python/bench/checkpoint_ranks.py)

Loaders (each in a fresh child process, so that its peak resident memory is
its own and no CUDA state is shared):

- numapin:      numapin.load_safetensors(path, device=...)
- st_cuda:      safetensors.torch.load_file(path, device=...)
- st_cpu_to:    load_file(path), then .to(device) for each tensor
- torch_mmap:   torch.load(model.pt, mmap=True, weights_only=True), then .to(device)

The checkpoint is `--gib` GiB of random bf16/fp16/fp32 tensors of mixed
shapes (embedding-sized, square, narrow, vectors), written once with
safetensors (and the same tensors with torch.save for torch_mmap); `--keep`
leaves the files for the next run. Needs torch with CUDA and safetensors.
NUMAPIN_BENCH_THREADS and NUMAPIN_BENCH_CHUNK_MIB set numapin's reader
threads and read size (for sweeps; default the library's). Peak memory is
the child's VmHWM (reset after imports and CUDA start)
above its VmRSS before the load: for numapin the pinned slots (their
region), for the mmap loaders the file's pages they map.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import threading
import time

GIB = 1 << 30


def make(dirname: str, gib: float) -> tuple[str, str]:
    import torch
    from safetensors.torch import save_file

    st_path = os.path.join(dirname, "model.safetensors")
    pt_path = os.path.join(dirname, "model.pt")
    if os.path.exists(st_path) and os.path.exists(pt_path):
        return st_path, pt_path
    os.makedirs(dirname, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    shapes = [((32000, 4096), torch.bfloat16), ((4096, 4096), torch.bfloat16), ((11008, 4096), torch.float16),
              ((4096,), torch.float32), ((1024, 1024), torch.float32), ((4096, 128), torch.bfloat16),
              ((333, 777), torch.float16), ((7,), torch.float32)]
    ts: dict[str, torch.Tensor] = {}
    total, i = 0, 0
    while total < gib * GIB:
        shape, dtype = shapes[i % len(shapes)]
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
        # Finite values: keep the exponent bits away from all-ones.
        ts[f"layer.{i:04d}"] = (raw & 0x3F).view(dtype).reshape(shape)
        total += nbytes
        i += 1
    save_file(ts, st_path)
    torch.save(ts, pt_path)
    os.sync()
    return st_path, pt_path


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def drive_rate(path: str, nbytes: int) -> tuple[float, str]:
    """Best O_DIRECT sequential rate over threads x block sizes (each after
    dropping the page cache): GB/s and the configuration."""
    best = (0.0, "")
    size = min(nbytes, os.path.getsize(path)) // (16 << 20) * (16 << 20)
    for block in (1 << 20, 4 << 20, 16 << 20):
        for threads in (1, 4, 16, 64):
            drop_caches()
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            nxt = [0]
            lock = threading.Lock()

            def work() -> None:
                buf = mmap.mmap(-1, block)
                while True:
                    with lock:
                        off = nxt[0]
                        nxt[0] += block
                    if off >= size:
                        return
                    os.preadv(fd, [buf], off)

            t0 = time.perf_counter()
            ws = [threading.Thread(target=work) for _ in range(threads)]
            for w in ws:
                w.start()
            for w in ws:
                w.join()
            gbps = size / (time.perf_counter() - t0) / 1e9
            os.close(fd)
            if gbps > best[0]:
                best = (gbps, f"threads={threads} block={block >> 20}M")
    return best


CHILD = r"""
import json, os, sys, time
import torch
torch.cuda.init()
dev = torch.device(sys.argv[3])
torch.empty(1, device=dev)
which, path = sys.argv[1], sys.argv[2]
extra = {}
if which == "numapin":
    import numapin
    numapin.stats()  # the runtime, before the timing
def rss(field):
    with open("/proc/self/status") as f:
        for l in f:
            if l.startswith(field + ":"):
                return int(l.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM
base = rss("VmRSS")
t0 = time.perf_counter()
if which == "numapin":
    # The reader's settings, for sweeps (defaults: the library's).
    tune = {}
    if os.environ.get("NUMAPIN_BENCH_THREADS"):
        tune["threads"] = int(os.environ["NUMAPIN_BENCH_THREADS"])
    if os.environ.get("NUMAPIN_BENCH_CHUNK_MIB"):
        tune["chunk_bytes"] = int(os.environ["NUMAPIN_BENCH_CHUNK_MIB"]) << 20
    out = numapin.load_safetensors(path, device=dev, stats=extra, **tune)
elif which == "st_cuda":
    from safetensors.torch import load_file
    out = load_file(path, device=str(dev))
elif which == "st_cpu_to":
    from safetensors.torch import load_file
    out = {k: v.to(dev) for k, v in load_file(path).items()}
elif which == "torch_mmap":
    out = {k: v.to(dev) for k, v in torch.load(path, mmap=True, weights_only=True).items()}
torch.cuda.synchronize(dev)
dt = time.perf_counter() - t0
n = sum(v.numel() * v.element_size() for v in out.values())
print(json.dumps({"seconds": dt, "bytes": n, "peak_bytes": rss("VmHWM") - base,
                  "staging_bytes": extra.get("staging_bytes"), "warnings": extra.get("warnings") or [], "summary": {k: extra.get(k) for k in ("cached_bytes", "direct_bytes", "buffered_bytes", "threads")}}))
"""


def run_child(which: str, path: str, device: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, which, path, device], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def pinned_h2d(device: str) -> float:
    """The arena's pinned host-to-device rate: 1 GiB from numapin.empty,
    best of 5."""
    import torch

    import numapin

    dev = torch.device(device)
    src = numapin.empty((GIB,), torch.uint8, gpu=dev.index or 0)
    dst = torch.empty(GIB, dtype=torch.uint8, device=dev)
    return copy_rate(dst, src)


def copy_rate(dst, src) -> float:  # type: ignore[no-untyped-def]
    """The best of 6 timed ``dst.copy_(src, non_blocking=True)`` (one side
    a CUDA tensor), in GB/s."""
    import torch

    n = src.numel() * src.element_size()
    best = 0.0
    for _ in range(6):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        best = max(best, n / (a.elapsed_time(b) / 1e3) / 1e9)
    return best


def main() -> int:
    if any(x == "--ranks" or x.startswith("--ranks=") for x in sys.argv[1:]):
        # Many ranks at once (one process per GPU): checkpoint_ranks.py.
        ranks = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_ranks.py")
        os.execv(sys.executable, [sys.executable, ranks] + sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/numapin-ckpt")
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--temps", default="hot,cold", help="hot, cold or both (default)")
    ap.add_argument("--loaders", default="numapin,st_cuda,st_cpu_to,torch_mmap")
    a = ap.parse_args()

    st_path, pt_path = make(a.dir, a.gib)
    size = os.path.getsize(st_path)
    can_drop = drop_caches()
    print(f"checkpoint: {st_path} ({size / GIB:.2f} GiB), torch.save copy {pt_path}", file=sys.stderr)
    import numapin

    text, _ = numapin.locate(st_path)
    print(f"file on: {text}", file=sys.stderr)
    h2d = pinned_h2d(a.device)
    want_temps = [t.strip() for t in a.temps.split(",")]
    temps = [t for t in ("hot", "cold") if t in want_temps and (t == "hot" or can_drop)]
    if "cold" in want_temps and not can_drop:
        print("cold figures skipped: dropping the page cache needs root", file=sys.stderr)
    drive = drive_rate(st_path, 4 * GIB) if "cold" in temps else (0.0, "not measured (no cold figures)")
    paths = {"numapin": st_path, "st_cuda": st_path, "st_cpu_to": st_path, "torch_mmap": pt_path}
    loaders = [(n, paths[n]) for n in a.loaders.split(",") if n in paths]
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(a.reps):
        for temp in temps:
            for name, path in loaders:
                if temp == "cold":
                    drop_caches()
                else:
                    warm(path)
                results.setdefault((name, temp), []).append(run_child(name, path, a.device))

    def med(name: str, temp: str) -> tuple[float, dict]:
        rs = [r for r in results.get((name, temp), []) if "seconds" in r]
        if not rs:
            errs = [r.get("error") for r in results.get((name, temp), [])]
            return 0.0, {"error": errs[0] if errs else "not run"}
        rs.sort(key=lambda r: r["seconds"])
        m = rs[len(rs) // 2]
        return m["bytes"] / m["seconds"] / 1e9, m

    rows = []
    print(f"\n{'LOADER':<12} {'TEMP':<5} {'GB/s':>7} {'PEAK RSS':>10}  NOTES")
    for temp in temps:
        for name, _ in loaders:
            g, m = med(name, temp)
            peak = m.get("peak_bytes")
            note = m.get("error") or (json.dumps(m.get("summary")) if name == "numapin" else "")
            print(f"{name:<12} {temp:<5} {g:>7.2f} {(peak or 0) / (1 << 20):>8.0f}MiB  {note}")
            rows.append({"loader": name, "temp": temp, "gbps": g, **{k: v for k, v in m.items() if k != "summary"}, "summary": m.get("summary")})
    for w in (med("numapin", temps[0])[1].get("warnings") or []) if temps else []:
        print(f"\nnumapin warns: {w}")
    print(f"\npinned H2D (numapin arena, 1 GiB): {h2d:.2f} GB/s")
    print(f"drive, best O_DIRECT sequential: {drive[0]:.2f} GB/s ({drive[1]})")
    print("\nRatios (medians) against the goals:")
    names = [n for n, _ in loaders]
    if "hot" in temps and "numapin" in names:
        hot = {n: med(n, "hot")[0] for n in names}
        print(f"  hot numapin / pinned H2D: {hot['numapin'] / h2d:.2f}x (goal >= 0.8)")
        peers = [v for k, v in hot.items() if k != "numapin"]
        if peers and max(peers) > 0:
            print(f"  hot numapin / best peer: {hot['numapin'] / max(peers):.2f}x (goal >= 3)")
    if "cold" in temps and "numapin" in names:
        cold = {n: med(n, "cold")[0] for n in names}
        if drive[0]:
            print(f"  cold numapin / drive: {cold['numapin'] / drive[0]:.2f}x (goal >= 0.9)")
        peers = [v for k, v in cold.items() if k != "numapin"]
        if peers and max(peers) > 0:
            print(f"  cold numapin / best buffered peer: {cold['numapin'] / max(peers):.2f}x (goal >= 1)")
    m = med("numapin", temps[0])[1] if temps else {}
    if m.get("staging_bytes"):
        print(f"  numapin peak RSS / slots: {m['peak_bytes'] / m['staging_bytes']:.2f}x "
              f"(slots {m['staging_bytes'] / (1 << 20):.0f} MiB; goal: no more than the slots; "
              "the arena populates whole regions, 256 MiB by default)")
    if a.json:
        print(json.dumps({"h2d_gbps": h2d, "drive_gbps": drive[0], "drive_config": drive[1], "size": size, "rows": rows}))
    if not a.keep:
        os.remove(st_path)
        os.remove(pt_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

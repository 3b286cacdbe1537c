"""Checkpoint saves: numapin's writer and stager against PyTorch's and
safetensors' ways, in one run, with the goals' baselines measured in the
same run.

    sudo python3 python/bench/save.py [--gib 8] [--device cuda:0]
        [--dir /tmp/numapin-save] [--reps 2] [--only link,stall,save,drive,roundtrip]
        [--json]

NUMAPIN_BENCH_THREADS and NUMAPIN_BENCH_CHUNK_MIB set numapin's writer
threads and write size (for sweeps; default the library's). On a CPU-only
machine it runs smaller and without the CUDA figures
(``--device cpu --gib 0.25``: a smoke test).

What it measures, each in a child process of its own (fresh CUDA state, its
own peak resident memory: VmHWM above VmRSS once the state dict is made):

- link:   the arena's device-to-host rate: the same bytes copied from one
          CUDA buffer into pinned memory from numapin's arena (best of 5).
- stall:  the time ``dcp.async_save`` keeps the training waiting (until the
          GPU's tensors may change again), one-rank gloo group,
          ``FileSystemWriter``: numapin's ``CheckpointStager`` made ahead
          (``prepare``) on its first and a repeated save, and DCP's default
          stager on its first and second; with how long each took until
          written, and the stager's own ``stage`` alone. The state dict is
          saved as ``{"model": tensors}`` (``--layout flat``: the tensors
          as top-level keys, which DCP's ``async_save`` passes one by one
          through its logging wrappers, tens of milliseconds for 192).
- save:   end to end to a local file, synced: ``numapin.save_safetensors``;
          ``safetensors.torch.save_file`` + fsync; ``torch.save`` + fsync
          (the best of ``--reps`` after the first, and the first). Each save
          makes a new file, as the drive's figure does (the previous rep's
          file removed before the timing); ``--replace`` saves over it
          instead, which adds the freeing of the old file's blocks at the
          rename (0.15-0.2 s/GiB on the CPU VM's disk).
- drive:  the drive's best sequential O_DIRECT write rate (1-8 writers,
          4/16 MiB writes, space reserved first or not, synced at the end),
          with Python threads over page-aligned mmap buffers (no fio needed).
- roundtrip: numapin's save, then ``numapin.load_safetensors`` to the
          device with the page cache as the save left it (hot: O_DIRECT
          writes leave nothing there), with the file read into it first
          (warm), and dropped (cold; root).

The state dict: ``--gib`` GiB of random tensors of mixed shapes and dtypes
(bf16, fp16, fp32, int64) on ``--device``.
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

from checkpoint import copy_rate, drop_caches, warm  # the loader's benchmark, beside this file

GIB = 1 << 30
SHAPES = [
    ((32000, 4096), "bfloat16"),
    ((4096, 4096), "bfloat16"),
    ((11008, 4096), "float16"),
    ((4096,), "float32"),
    ((1024, 1024), "float32"),
    ((4096, 128), "bfloat16"),
    ((333, 777), "float16"),
    ((7,), "float32"),
    ((1,), "int64"),
]


def state_dict(gib: float, device: str) -> dict:
    """About ``gib`` GiB of tensors of mixed shapes and dtypes on ``device``
    (random bits with finite floats), scaled down below the shapes' sizes."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    out: dict = {}
    total, i = 0, 0
    scale = min(1.0, max(gib, 1e-3))
    while total < gib * GIB:
        shape, dt = SHAPES[i % len(SHAPES)]
        shape = tuple(max(1, int(d * scale)) if len(shape) > 1 and j == 0 else d for j, d in enumerate(shape))
        dtype = getattr(torch, dt)
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g, device=device)
        out[f"layer.{i:04d}.{dt}"] = (raw & 0x3F).view(dtype).reshape(shape)
        total += nbytes
        i += 1
    return out


def nbytes(sd: dict) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def same(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Equal dtype, shape and bytes (``a`` moved to ``b``'s device)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x = a.to(b.device).contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(x, b.contiguous().reshape(-1).view(torch.uint8)))


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss("VmRSS")


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- children ----------------------------------------------------------


def child_link(a: argparse.Namespace) -> dict:
    import torch

    import numapin

    n = int(a.gib * GIB)
    if not a.device.startswith("cuda"):
        return {"skipped": "no CUDA device"}
    dev = torch.device(a.device)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = numapin.empty((n,), torch.uint8, gpu=dev.index or 0)
    best = copy_rate(dst, src)
    return {"bytes": n, "gbps": best, "seconds": n / best / 1e9}


def _dcp_group() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def child_stall(a: argparse.Namespace) -> dict:
    """Stalls of dcp.async_save with numapin's stager or DCP's default."""
    import torch
    import torch.distributed.checkpoint as dcp

    from numapin.torch import CheckpointStager

    _dcp_group()
    sd = state_dict(a.gib, a.device)
    sync(a.device)
    out: dict = {"bytes": nbytes(sd), "which": a.which, "layout": a.layout}
    # DCP's usual call saves {"model": model.state_dict(), ...}; "flat"
    # hands it the tensors as top-level keys, each of which async_save
    # passes through its logging wrappers (about 0.15 ms a key).
    top = {"model": sd} if a.layout == "nested" else sd
    base = reset_peak()
    stager = None
    if a.which == "numapin":
        t0 = time.perf_counter()
        stager = CheckpointStager()
        stager.prepare(top)
        out["prepare_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        stager.stage(top)
        out["stage_seconds"] = time.perf_counter() - t0
        out["staged_bytes"] = stager.staged_bytes
    stalls, written = [], []
    for i in range(2):
        d = os.path.join(a.dir, f"dcp-{a.which}-{i}")
        sync(a.device)
        t0 = time.perf_counter()
        kw = {"async_stager": stager} if stager is not None else {}
        fut = dcp.async_save(top, storage_writer=dcp.FileSystemWriter(d, sync_files=True), **kw)
        stalls.append(time.perf_counter() - t0)
        # The training would go on here; this run waits for the write.
        fut.result()
        written.append(time.perf_counter() - t0)
        subprocess.run(["rm", "-rf", d])
    out["stall_first"], out["stall_second"] = stalls
    if stager is not None:
        # The staged copy holds the tensors' bytes.
        staged = stager.stage(top)
        staged = staged["model"] if a.layout == "nested" else staged
        out["verified"] = all(same(staged[k], v) for k, v in sd.items())
    out["written_first"], out["written_second"] = written
    out["peak_bytes"] = rss("VmHWM") - base
    if stager is not None:
        stager.close()
    del torch
    return out


def child_save(a: argparse.Namespace) -> dict:
    import torch

    sd = state_dict(a.gib, a.device)
    sync(a.device)
    path = os.path.join(a.dir, f"save-{a.which}.bin")
    out: dict = {"bytes": nbytes(sd), "which": a.which}
    times = []
    if a.which == "numapin":
        import numapin

        numapin.stats()  # the runtime (topology probe), before the timing
    base = reset_peak()
    for _ in range(a.reps):
        if not a.replace and os.path.exists(path):
            os.remove(path)  # a new file each time, as the drive's figure
        t0 = time.perf_counter()
        if a.which == "numapin":
            import numapin

            stats: dict = {}
            # The writer's settings, for sweeps (defaults: the library's).
            tune = {}
            if os.environ.get("NUMAPIN_BENCH_THREADS"):
                tune["threads"] = int(os.environ["NUMAPIN_BENCH_THREADS"])
            if os.environ.get("NUMAPIN_BENCH_CHUNK_MIB"):
                tune["chunk_bytes"] = int(os.environ["NUMAPIN_BENCH_CHUNK_MIB"]) << 20
            numapin.save_safetensors(sd, path, stats=stats, **tune)
            out["stats"] = {k: stats.get(k) for k in ("direct_bytes", "buffered_bytes", "staging_bytes", "threads", "sync_seconds", "node")}
        elif a.which == "safetensors":
            from safetensors.torch import save_file

            save_file(sd, path)
            fsync_path(path)
        else:
            torch.save(sd, path)
            fsync_path(path)
        times.append(time.perf_counter() - t0)
    out["size"] = os.path.getsize(path)
    out["peak_bytes"] = rss("VmHWM") - base
    if a.which == "numapin":
        # safetensors reads back what was saved, bit for bit.
        from safetensors.torch import load_file

        back = load_file(path)
        out["verified"] = sorted(back) == sorted(sd) and all(same(back[k], v) for k, v in sd.items())
    # The first save of a process makes the slots' region; later ones
    # reuse the arena's.
    out["first_seconds"] = times[0]
    out["seconds"] = min(times[1:]) if len(times) > 1 else times[0]
    out["gbps"] = out["size"] / out["seconds"] / 1e9
    if a.which != "numapin" or not a.keep_file:
        os.remove(path)
    return out


def child_load(a: argparse.Namespace) -> dict:
    import numapin

    path = os.path.join(a.dir, "save-numapin.bin")
    dev = a.device if a.device.startswith("cuda") else None
    if dev:
        import torch

        torch.empty(1, device=dev)
    numapin.stats()
    stats: dict = {}
    t0 = time.perf_counter()
    got = numapin.load_safetensors(path, device=dev, stats=stats)
    sync(a.device)
    dt = time.perf_counter() - t0
    n = sum(t.numel() * t.element_size() for t in got.values())
    return {"seconds": dt, "bytes": n, "gbps": n / dt / 1e9,
            "summary": {k: stats.get(k) for k in ("cached_bytes", "direct_bytes", "buffered_bytes")}}


CHILDREN = {"link": child_link, "stall": child_stall, "save": child_save, "load": child_load}


def run(kind: str, a: argparse.Namespace, which: str = "", keep_file: bool = False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--which", which, "--gib", str(a.gib),
           "--device", a.device, "--dir", a.dir, "--reps", str(a.reps)]
    if keep_file:
        cmd.append("--keep-file")
    if a.budget_fraction is not None:
        cmd += ["--budget-fraction", str(a.budget_fraction)]
    if a.budget_gib is not None:
        cmd += ["--budget-gib", str(a.budget_gib)]
    cmd += ["--layout", a.layout]
    if a.replace:
        cmd.append("--replace")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        # numapin's errors end with their fix: keep the message with it.
        return {"error": " / ".join(lines[-4:]) if lines else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- the drive ---------------------------------------------------------


def drive_rate(dirname: str, size: int) -> tuple[float, str]:
    """Best sequential O_DIRECT write rate over writers x block sizes, each
    into a fresh file synced at the end, its space reserved first
    (``fallocate``, as numapin's writer does) or not (as ``dd`` writes)."""
    best = (0.0, "")
    path = os.path.join(dirname, "drive.bin")
    configs = [(b, t, True) for b in (4 << 20, 16 << 20) for t in (1, 2, 4, 8)]
    configs += [(16 << 20, t, False) for t in (1, 4)]
    for block, threads, reserve in configs:
        total = max(block, size // block * block)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        except OSError as e:
            return 0.0, f"O_DIRECT refused here: {e}"
        if reserve:
            os.posix_fallocate(fd, 0, total)
        nxt = [0]
        lock = threading.Lock()

        def work() -> None:
            buf = mmap.mmap(-1, block)
            buf.write(os.urandom(4096) * (block // 4096))
            while True:
                with lock:
                    off = nxt[0]
                    nxt[0] += block
                if off >= total:
                    return
                os.pwrite(fd, buf, off)

        t0 = time.perf_counter()
        ws = [threading.Thread(target=work) for _ in range(threads)]
        for w in ws:
            w.start()
        for w in ws:
            w.join()
        os.fsync(fd)
        gbps = total / (time.perf_counter() - t0) / 1e9
        os.close(fd)
        os.remove(path)
        if gbps > best[0]:
            best = (gbps, f"writers={threads} block={block >> 20}M {'reserved' if reserve else 'not reserved'}")
    return best


# -- the report --------------------------------------------------------


def report(res: dict, a: argparse.Namespace) -> None:
    p = print
    link = res.get("link", {})
    if "gbps" in link:
        p(f"D2H link (numapin arena, {link['bytes'] / GIB:.2f} GiB): {link['gbps']:.2f} GB/s, {link['seconds']:.3f} s")
    for which in ("numapin", "dcp_default"):
        s = res.get(f"stall_{which}", {})
        if "error" in s:
            p(f"stall {which}: {s['error']}")
        elif s:
            extra = ""
            if which == "numapin":
                extra = f"  (staged copy equal: {s.get('verified')}; prepare {s['prepare_seconds']:.2f} s; stage alone {s['stage_seconds']:.3f} s; staged {s['staged_bytes'] / GIB:.2f} GiB)"
            p(f"stall {which:<12} first {s['stall_first']:.3f} s, second {s['stall_second']:.3f} s; "
              f"written {s['written_first']:.2f} / {s['written_second']:.2f} s; peak RSS {s['peak_bytes'] / GIB:.2f} GiB{extra}")
    for which in ("numapin", "safetensors", "torch"):
        s = res.get(f"save_{which}", {})
        if "error" in s:
            p(f"save {which}: {s['error']}")
        elif s:
            ok = "" if "verified" not in s else f", read back equal: {s['verified']}"
            p(f"save {which:<12} {s['seconds']:.2f} s, {s['gbps']:.2f} GB/s (first {s['first_seconds']:.2f} s), peak RSS {s['peak_bytes'] / (1 << 20):.0f} MiB{ok}"
              + (f"  {json.dumps(s['stats'])}" if "stats" in s else ""))
    if "drive" in res:
        p(f"drive, best O_DIRECT sequential write: {res['drive']['gbps']:.2f} GB/s ({res['drive']['config']})")
    for temp in ("hot", "warm", "cold"):
        s = res.get(f"load_{temp}", {})
        if s:
            p(f"round trip load {temp}: " + (s["error"] if "error" in s else f"{s['gbps']:.2f} GB/s {json.dumps(s['summary'])}"))
    p("\nRatios against the goals:")
    st_n, st_d = res.get("stall_numapin", {}), res.get("stall_dcp_default", {})
    if "gbps" in link and "stall_first" in st_n:
        for k in ("stall_first", "stall_second"):
            p(f"  numapin {k} / link time: {st_n[k] / link['seconds']:.2f}x (goal <= 1.1)")
    if "stall_first" in st_n and "stall_first" in st_d:
        p(f"  DCP default stall / numapin stall: first {st_d['stall_first'] / st_n['stall_first']:.1f}x, "
          f"second {st_d['stall_second'] / st_n['stall_second']:.1f}x")
    sv = res.get("save_numapin", {})
    if "gbps" in sv and res.get("drive", {}).get("gbps"):
        p(f"  numapin save / drive: {sv['gbps'] / res['drive']['gbps']:.2f}x (goal >= 0.9)")
    for peer in ("safetensors", "torch"):
        ps = res.get(f"save_{peer}", {})
        if "gbps" in sv and "gbps" in ps:
            p(f"  numapin save / {peer}: {sv['gbps'] / ps['gbps']:.2f}x")
    if "peak_bytes" in sv and sv.get("stats", {}).get("staging_bytes"):
        p(f"  numapin save peak RSS / slots: {sv['peak_bytes'] / sv['stats']['staging_bytes']:.2f}x "
          f"(slots {sv['stats']['staging_bytes'] / (1 << 20):.0f} MiB of a {sv['bytes'] / GIB:.2f} GiB state dict)")
    if "peak_bytes" in st_n and st_n.get("staged_bytes"):
        p(f"  stager peak RSS / staged copy: {st_n['peak_bytes'] / st_n['staged_bytes']:.2f}x")


class Progress(dict):
    """The results, each step's also printed to stderr as it comes (a run
    cut short by a time limit keeps what it measured)."""

    def __setitem__(self, key: str, value: object) -> None:
        super().__setitem__(key, value)
        print(f"@@ {key}: {json.dumps(value)}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--device", default=None, help="default cuda:0 when CUDA is there, else cpu")
    ap.add_argument("--dir", default="/tmp/numapin-save")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", default="link,stall,save,drive,roundtrip")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--which", default="", help=argparse.SUPPRESS)
    ap.add_argument("--keep-file", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget-fraction", type=float, default=None,
                    help="numapin.configure(budget_fraction=...) in each child: the share of the node (or of the "
                         "memory cgroup's limit) numapin may pin; the stager holds the whole state dict")
    ap.add_argument("--budget-gib", type=float, default=None,
                    help="numapin.configure(budget_bytes=...) in each child, in GiB per node")
    ap.add_argument("--layout", choices=("nested", "flat"), default="nested",
                    help="the stall's state dict: {'model': tensors} as DCP's docs save one (default), or the "
                         "tensors as its top-level keys")
    ap.add_argument("--replace", action="store_true",
                    help="save over the previous rep's file (default: a new file each time)")
    a = ap.parse_args()
    if a.device is None:
        import torch

        a.device = "cuda:0" if torch.cuda.is_available() else "cpu"
    os.makedirs(a.dir, exist_ok=True)
    if a.child:
        if a.budget_fraction is not None or a.budget_gib is not None:
            import numapin

            kw: dict = {}
            if a.budget_fraction is not None:
                kw["budget_fraction"] = a.budget_fraction
            if a.budget_gib is not None:
                kw["budget_bytes"] = int(a.budget_gib * GIB)
            numapin.configure(**kw)
        print(json.dumps(CHILDREN[a.child](a)))
        return 0
    only = set(a.only.split(","))
    res: dict = Progress(gib=a.gib, device=a.device)
    print(f"state dict: {a.gib} GiB on {a.device}; files in {a.dir}", file=sys.stderr)
    if "link" in only:
        res["link"] = run("link", a)
    if "stall" in only:
        res["stall_numapin"] = run("stall", a, "numapin")
        res["stall_dcp_default"] = run("stall", a, "dcp_default")
    if "drive" in only:
        g, cfg = drive_rate(a.dir, min(int(a.gib * GIB), 4 * GIB))
        res["drive"] = {"gbps": g, "config": cfg}
    if "save" in only or "roundtrip" in only:
        res["save_numapin"] = run("save", a, "numapin", keep_file="roundtrip" in only)
    if "save" in only:
        res["save_safetensors"] = run("save", a, "safetensors")
        res["save_torch"] = run("save", a, "torch")
    if "roundtrip" in only and "error" not in res.get("save_numapin", {}):
        # As the save left the page cache (O_DIRECT writes leave nothing of
        # the file there), then with the whole file read into it first.
        res["load_hot"] = run("load", a)
        warm(os.path.join(a.dir, "save-numapin.bin"))
        res["load_warm"] = run("load", a)
        if drop_caches():
            res["load_cold"] = run("load", a)
        else:
            res["load_cold"] = {"error": "dropping the page cache needs root"}
        try:
            os.remove(os.path.join(a.dir, "save-numapin.bin"))
        except OSError:
            pass
    report(res, a)
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

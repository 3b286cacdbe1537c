"""Demo: N processes pin memory for their GPUs under one machine budget.

Each of ``--procs`` processes (process i uses GPU i modulo the GPUs torch
sees; without CUDA, the node of its CPU) asks for ``--chunk`` GiB pieces of
pinned memory near its GPU until it holds ``--per-proc`` GiB or the node's
machine budget (``--budget``, shared by all of them) refuses. All of them
then print what they got and ``numapin.stats()``'s machine figures for
their node; process 0 prints the machine budget lines of ``numapin ps``.
Last, one more process with ``budget_wait`` asks for a piece while the
budget is spent, and gets it once the process holding most lets go of its memory.

On the multi-GPU machine (4 GPUs, a budget of 12 GiB per node)::

    python3 python/bench/machine_budget.py --procs 4 --budget 12GiB --per-proc 6 --chunk 1

It checks, and says, that the sum granted on each node never passes the
budget, that every refusal names the processes holding the node, and that
the waiter got its piece; exit code 1 otherwise.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30


def size(b: float) -> str:
    """Bytes for people: GiB, or MiB below one."""
    return f"{b / GIB:.1f} GiB" if b >= GIB else f"{b / (1 << 20):.0f} MiB"


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def pinner(i: int, args: argparse.Namespace, barrier, release, results, who, chosen, asking) -> None:
    """Process i: pins up to --per-proc GiB near its GPU, reports, holds
    until released."""
    import numapin

    ngpu = gpu_count()
    gpu = i % ngpu if ngpu else None
    if gpu is not None:
        import torch

        torch.cuda.set_device(gpu)
    numapin.configure(machine_budget=args.budget)
    barrier.wait()
    held, refusal = [], ""
    for _ in range(int(args.per_proc / args.chunk)):
        try:
            held.append(numapin.empty(int(args.chunk * GIB), "uint8", gpu=gpu, like="numpy"))
        except numapin.BudgetError as e:
            refusal = str(e).splitlines()[0]
            break
    node = numapin.place(gpu).node if gpu is not None else None
    stats = [s for s in numapin.stats() if s["machine_share"] or s["node"] == node]
    s = stats[0] if stats else numapin.stats()[0]
    results.put((i, os.getpid(), gpu, s["node"], len(held) * args.chunk, refusal,
                 s["machine_budget"], s["machine_used"], s["machine_share"]))
    barrier.wait()  # everyone has reported
    if i == 0:
        out = subprocess.run([sys.executable, "-m", "numapin", "ps", "--no-cuda"],
                             capture_output=True, text=True, timeout=120).stdout
        lines = out.splitlines()
        start = next((k for k, l in enumerate(lines) if l.startswith("machine budget of user")), None)
        print("\n`numapin ps`, its machine budget lines:")
        if start is None:
            print("(none: " + out[-500:] + ")")
        else:
            end = next((k for k in range(start, len(lines)) if not lines[k].strip()), len(lines))
            print("\n".join(lines[start:end]))
        sys.stdout.flush()
    barrier.wait()  # ps has run
    chosen.wait(600)  # the main process names the one that lets go
    if i == who.value:
        asking.wait(600)  # the waiter has started, CUDA and all, and asks now
        time.sleep(2.0)
        del held[:]  # the process holding most lets go: the waiter gets its piece
        import gc

        gc.collect()
        numapin.trim()
        results.put(("released", time.monotonic()))
    release.wait()


def waiter(args: argparse.Namespace, gpu, results, asking) -> None:
    import numapin

    if gpu is not None:
        import torch

        torch.cuda.set_device(gpu)
    numapin.configure(machine_budget=args.budget, budget_wait=60.0)
    numapin.stats()  # the runtime made (topology probed): what follows is the request
    asking.set()
    t = time.monotonic()
    try:
        a = numapin.empty(int(args.chunk * GIB), "uint8", gpu=gpu, like="numpy")
        results.put(("waiter", True, time.monotonic() - t, time.monotonic(), a.nbytes))
    except numapin.BudgetError as e:
        results.put(("waiter", False, time.monotonic() - t, time.monotonic(), str(e).splitlines()[0]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--budget", default="12GiB", help="the machine budget per node (NUMAPIN_MACHINE_BUDGET's forms)")
    p.add_argument("--per-proc", type=float, default=6.0, help="GiB each process asks for")
    p.add_argument("--chunk", type=float, default=1.0, help="GiB per piece")
    args = p.parse_args()
    import numapin  # noqa: F401  (fails here, not in every child, when missing)

    state = tempfile.mkdtemp(prefix="numapin-demo-")
    os.environ["NUMAPIN_MACHINE_BUDGET_DIR"] = state  # children and ps inherit it
    ctx = mp.get_context("spawn")
    barrier, release, results = ctx.Barrier(args.procs, timeout=600), ctx.Event(), ctx.Queue()
    who, chosen, asking = ctx.Value("i", -1), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=pinner, args=(i, args, barrier, release, results, who, chosen, asking))
             for i in range(args.procs)]
    for pr in procs:
        pr.start()
    rows = [results.get(timeout=600) for _ in range(args.procs)]
    rows.sort()
    print(f"machine budget {args.budget} per node, {args.procs} processes asking {args.per_proc} GiB each "
          f"in {args.chunk} GiB pieces (state file in {state})")
    print(f"{'proc':>4} {'pid':>8} {'gpu':>4} {'node':>4} {'got':>9}  machine budget / used / share  refusal")
    ok = True
    per_node: dict[int, float] = {}
    for i, pid, gpu, node, got, refusal, mb, used, share in rows:
        per_node[node] = per_node.get(node, 0.0) + got
        print(f"{i:>4} {pid:>8} {str(gpu):>4} {node:>4} {size(got * GIB):>9}  "
              f"{size(mb)} / {size(used)} / {size(share)}  {refusal}")
        if refusal and "held by pid" not in refusal:
            ok = False
            print("     ^ the refusal does not name the holders")
    limit = rows[0][6]
    for node, got in sorted(per_node.items()):
        within = got * GIB <= limit
        ok &= within
        print(f"node {node}: {size(got * GIB)} granted over the processes, budget {size(limit)}: "
              f"{'within' if within else 'OVER THE BUDGET'}")
    # The waiter: asks while the budget is spent, gets it once the process
    # holding most lets go.
    holder = max(rows, key=lambda r: r[4])
    who.value = holder[0]
    chosen.set()
    w = ctx.Process(target=waiter, args=(args, holder[2], results, asking))
    w.start()
    try:
        got = [results.get(timeout=120) for _ in range(2)]
    finally:
        release.set()  # the pinners end, whatever happened to the waiter
    released = next(g[1] for g in got if g[0] == "released")
    wr = next(g for g in got if g[0] == "waiter")
    w.join(timeout=60)
    if wr[1]:
        print(f"waiter (budget_wait=60 s): got {size(wr[4])} after {wr[2]:.2f} s, "
              f"{wr[3] - released:+.2f} s after process {holder[0]} let go")
        if wr[2] < 1.0:  # the holder lets go 2 s after the waiter asks
            ok = False
            print("     ^ it did not wait: the budget was not spent when it asked")
    else:
        ok = False
        print(f"waiter (budget_wait=60 s): refused after {wr[2]:.2f} s: {wr[4]}")
    for pr in procs:
        pr.join(timeout=60)
    # A process that died in its exit runs no exit handler: it would leave
    # the state file behind, and its code says so.
    codes = [pr.exitcode for pr in procs] + [w.exitcode]
    print(f"exit codes (processes 0-{args.procs - 1}, waiter): {codes}")
    left = os.listdir(state)
    print(f"state folder after every process left: {left or 'empty'}")
    if left:
        # What the file left holds: live records (a process's lock still
        # held) or only cleared ones.
        out = subprocess.run([sys.executable, "-m", "numapin", "ps", "--no-cuda"],
                             capture_output=True, text=True, timeout=120).stdout
        print("\n".join(l for l in out.splitlines() if "budget" in l or "pid" in l)[-2000:])
    shutil.rmtree(state, ignore_errors=True)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

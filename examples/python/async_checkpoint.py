"""A training loop that checkpoints asynchronously with numapin's stager.

    python3 examples/python/async_checkpoint.py [--steps 30] [--every 10] [--dir /tmp/ckpt]
    python3 examples/python/async_checkpoint.py --safetensors   # one file per save, numapin's writer
    torchrun --nproc-per-node 8 examples/python/async_checkpoint.py

Every ``--every`` steps the model's and optimizer's state go to
``torch.distributed.checkpoint.async_save`` with a
``numapin.torch.CheckpointStager``: the state is copied into pinned memory
on the GPU's NUMA node (made once at start-up, on a thread of its own, and
reused), the training goes on as soon as that copy is done, and DCP's
``FileSystemWriter`` writes the copy on a thread. The next checkpoint first
waits for the last one to be written (the staged copy is reused).

With ``--safetensors`` each checkpoint is one safetensors file per rank,
written with ``numapin.save_safetensors`` (O_DIRECT, several writes in
flight, crash-safe) by ``CheckpointStager.save_safetensors``.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from numapin.torch import CheckpointStager


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--dir", default="/tmp/numapin-async-ckpt")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--safetensors", action="store_true")
    a = ap.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if "WORLD_SIZE" in os.environ:
        # async_save needs a CPU backend for its coordination.
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    model = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width) for _ in range(4)]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def state() -> dict:
        if a.safetensors:  # one flat file per rank: names to tensors
            return {f"model.{k}": v for k, v in model.state_dict().items()}
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    # One step first, so that the optimizer has its state; then the stager
    # makes its pinned copy on a thread while the training goes on.
    def step() -> None:
        x = torch.randn(64, a.width, device=device)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    stager = CheckpointStager(device if device.type == "cuda" else None)
    ready = threading.Thread(target=stager.prepare, args=(state(),))
    ready.start()

    pending = None
    for i in range(1, a.steps + 1):
        step()
        if i % a.every:
            continue
        ready.join()
        if pending is not None:
            pending.result()  # the staged copy is reused: the last write must be done
        t0 = time.perf_counter()
        if a.safetensors:
            path = os.path.join(a.dir, f"step-{i:06d}-rank{rank}.safetensors")
            os.makedirs(a.dir, exist_ok=True)
            pending = stager.save_safetensors(state(), path, metadata={"step": str(i)})
        else:
            pending = dcp.async_save(
                state(),
                storage_writer=dcp.FileSystemWriter(os.path.join(a.dir, f"step-{i:06d}")),
                async_stager=stager,
            )
        stall = time.perf_counter() - t0
        if rank == 0:
            print(f"step {i}: checkpoint staged ({stager.staged_bytes / 2**20:.0f} MiB pinned), training stalled {stall * 1e3:.1f} ms")
    if pending is not None:
        pending.result()
    stager.close()
    if rank == 0:
        print(f"checkpoints in {a.dir}: {sorted(os.listdir(a.dir))}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

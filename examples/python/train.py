"""A small training loop fed the numapin way.

    python3 examples/python/train.py [--steps 50] [--batch 256]
    torchrun --nproc-per-node 8 examples/python/train.py      # one rank per GPU

Each rank binds itself near its GPU (numapin.bind: every thread and the
memory policy on the GPU's node), keeps its input batches in pinned memory on
that node (numapin.empty) and moves them with the staged copy ordered on the
training stream (numapin.copy_to_device) -- here from a pageable "decoded"
buffer, as a loader that decodes in numpy would hand it over.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import numapin


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--features", type=int, default=4096)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train.py: needs a CUDA GPU")

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    plan = numapin.bind(rank)  # before any thread or worker starts
    torch.cuda.set_device(rank)
    print(f"rank {rank}: {plan.chosen_by}; CPUs {plan.cpus[0]}..{plan.cpus[-1]}, memory node(s) {plan.mems}")

    device = torch.device("cuda", rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(a.features, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    # Pinned input buffers on this GPU's node, reused every step.
    x_host = numapin.empty((a.batch, a.features), torch.float32, gpu=rank)
    assert x_host.is_pinned()
    decoded = torch.empty((a.batch, a.features), dtype=torch.float32)  # pageable, as a decoder leaves it
    x = torch.empty((a.batch, a.features), device=device)
    y = torch.randint(0, 10, (a.batch,), device=device)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(a.steps):
        decoded.normal_()  # "decode" the next batch
        numapin.copy_to_device(decoded, x)  # staged, after the previous step's work on this stream
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # The pinned buffer path: fill on the host, asynchronous DMA.
        x_host.copy_(decoded)
        x.copy_(x_host, non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    nbytes = 2 * a.steps * decoded.numel() * decoded.element_size()
    print(f"rank {rank}: {a.steps} steps in {dt:.2f} s; {nbytes / dt / 1e9:.1f} GB/s of input moved; loss {loss.item():.3f}")
    print(f"rank {rank}: arena stats {[{k: s[k] for k in ('node', 'bytes_in_use', 'registration')} for s in numapin.stats()]}")


if __name__ == "__main__":
    main()

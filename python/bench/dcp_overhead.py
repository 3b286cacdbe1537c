"""What ``dcp.async_save`` adds around a stager, apart from the copy:
192 small CPU tensors (1 KiB each), numapin's ``CheckpointStager``,
``stage`` alone against the ``async_save`` call's time, 8 saves each, with
the tensors as the state dict's top-level keys ("flat") and under one key
(``{"model": tensors}``, "nested"). One-rank gloo group; no GPU needed.

    python3 python/bench/dcp_overhead.py

Prints, per layout, the milliseconds of each ``stage`` and each stall.
"""

import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from numapin.torch import CheckpointStager


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    flat = {f"layer.{i:04d}": torch.randn(256) for i in range(192)}
    with tempfile.TemporaryDirectory() as d:
        for name, sd in (("flat", flat), ("nested", {"model": flat})):
            st = CheckpointStager()
            st.prepare(sd)
            alone, stall = [], []
            for i in range(8):
                t = time.perf_counter()
                st.stage(sd)
                alone.append(time.perf_counter() - t)
                t = time.perf_counter()
                f = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(d, name + str(i))),
                                   async_stager=st)
                stall.append(time.perf_counter() - t)
                f.result()
            print(name, "stage alone ms", [round(x * 1e3, 2) for x in alone])
            print(name, "stall ms", [round(x * 1e3, 2) for x in stall])
            st.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

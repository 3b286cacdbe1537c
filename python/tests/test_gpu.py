"""On a CUDA GPU: pinned for real, asynchronous copies, staged copies ordered
on torch's stream. Skipped without one."""

from __future__ import annotations

import gc

import pytest

from conftest import requires

pytestmark = requires("gpu")


def test_empty_is_pinned_registered_and_copies_asynchronously():
    import torch

    import numapin

    t = numapin.empty((1024, 1024), torch.float32, gpu=0)
    assert t.is_pinned()
    t.fill_(3.0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        d = t.to("cuda", non_blocking=True)
    s.synchronize()
    assert torch.equal(d.cpu(), t)
    node = numapin.topology().gpu_by_ordinal(0).numa_node
    regs = [x for x in numapin.stats() if x["regions"]]
    assert all(x["registration"] == "registered" for x in regs)
    if node is not None:
        assert any(x["node"] == node for x in regs)
    del t, d
    gc.collect()


def test_staged_copies_round_trip_on_the_current_stream():
    import torch

    import numapin

    src = torch.arange(9 << 20, dtype=torch.uint8)  # pageable, not a multiple of the chunk
    dst = torch.empty_like(src, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        # Work queued before the copy: the copy must follow it.
        dst.fill_(7)
        numapin.copy_to_device(src, dst)
        back = torch.empty_like(src)
        numapin.copy_from_device(dst, back)
    assert torch.equal(back, src)


def test_staged_copy_refuses_memory_of_another_size_or_device():
    import torch

    import numapin

    with pytest.raises(numapin.InputError):
        numapin.copy_to_device(torch.zeros(8), torch.zeros(4, device="cuda"))


def test_pin_gives_a_pinned_tensor_on_the_gpus_node():
    import torch

    import numapin

    x = torch.randn(1 << 20)
    p = numapin.pin(x, gpu=0)
    assert p.is_pinned() and torch.equal(p, x)


def test_dataloader_batches_arrive_on_the_device_equal_to_torchs():
    import torch
    from torch.utils.data import DataLoader as TorchLoader
    from torch.utils.data import Dataset

    import numapin.torch as nt

    class Pattern(Dataset):
        def __len__(self):
            return 96

        def __getitem__(self, i):
            return {"x": torch.full((1 << 16,), i % 251, dtype=torch.uint8), "y": i, "f": torch.randn(7)}

    kw = dict(batch_size=8, num_workers=2, shuffle=True)
    ref = TorchLoader(Pattern(), generator=torch.Generator().manual_seed(5), **kw)
    ours = nt.DataLoader(Pattern(), generator=torch.Generator().manual_seed(5), device="cuda:0", **kw)
    for a, b in zip(ref, ours, strict=True):
        assert b["x"].is_cuda and b["y"].is_cuda and b["f"].is_cuda
        assert torch.equal(a["x"].cuda(), b["x"]) and torch.equal(a["y"].cuda(), b["y"])
        assert torch.equal(a["f"].cuda(), b["f"])
    s = ours.stats()
    assert s["registered"] and s["slotted_batches"] > 0, s
    ours.close()
    s = ours.stats()
    assert s["free"] == s["nslots"], s

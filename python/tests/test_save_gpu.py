"""On a CUDA GPU: numapin.save_safetensors from CUDA tensors (every dtype,
non-contiguous, views, tensors on two GPUs, ordered after torch's current
stream) writes what safetensors.torch.save_file writes; the checkpoint
stager copies CUDA tensors into pinned memory on the GPU's node, returns
when they may change, and serves DCP's async_save. Skipped without one."""

from __future__ import annotations

import gc

import pytest

from conftest import in_use, run_py, requires

pytestmark = requires("gpu")

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402
from test_save import _check, _same, _state  # noqa: E402


def _on(ts, device):
    return {k: v.to(device) for k, v in ts.items()}


def test_cuda_tensors_save_as_save_file_writes_them(tmp_path):
    before = in_use()
    ts = _state()
    on = _on(ts, "cuda:0")
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    for io in ("auto", "buffered"):
        for chunk in (1 << 16, 8 << 20):
            stats = {}
            numapin.save_safetensors(on, ours, io=io, chunk_bytes=chunk, stats=stats)
            st.save_file(ts, str(theirs))
            assert ours.read_bytes() == theirs.read_bytes(), (io, chunk)
            assert stats["staging_bytes"] > 0
            assert not [w for w in stats["warnings"] if "not registered" in w]
    del on
    gc.collect()
    assert in_use() == before


def test_tensors_on_two_gpus_and_non_contiguous_ones(tmp_path):
    n = torch.cuda.device_count()
    base = torch.randn(512, 384, device="cuda:0")
    ts = {
        "a": base,
        "t": base.t(),
        "step": base[::3, 1::2],
        "row": base[7],
        "b16": torch.randn(1000, 33, device=f"cuda:{n - 1}").to(torch.bfloat16),
        "cpu": torch.arange(100),
        "f8": torch.randn(77, device=f"cuda:{n - 1}").to(torch.float8_e4m3fn),
    }
    p = tmp_path / "m.safetensors"
    numapin.save_safetensors(ts, p)
    _check(st.load_file(str(p)), {k: v.cpu() for k, v in ts.items()})
    _check(numapin.load_safetensors(p, device=None), {k: v.cpu() for k, v in ts.items()})


def test_the_save_waits_for_the_work_queued_on_the_current_stream(tmp_path):
    x = torch.randn(4096, 4096, device="cuda:0")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(8):
            y = x @ x  # long work queued on this stream, not yet done
            y = y / y.norm()
        p = tmp_path / "y.safetensors"
        numapin.save_safetensors({"y": y}, p)
    torch.cuda.synchronize()
    assert _same(st.load_file(str(p))["y"], y.cpu())


def test_the_stager_copies_cuda_tensors_to_pinned_memory_on_the_gpus_node():
    from numapin.torch import CheckpointStager

    before = in_use()
    sd = {k: v.cuda() for k, v in _state().items()}
    with CheckpointStager() as s:
        s.prepare(sd)
        staged = s.stage(sd)
        for k, v in sd.items():
            assert staged[k].device.type == "cpu" and staged[k].is_pinned()
            assert _same(staged[k], v.cpu()), k
        # The GPU tensors may change now; the copy stays.
        kept = {k: v.clone() for k, v in staged.items()}
        for v in sd.values():
            if v.dtype.is_floating_point and v.numel() and v.element_size() > 1:
                v.add_(1)
        torch.cuda.synchronize()
        for k in staged:
            assert _same(staged[k], kept[k]), k
        node = numapin.place(0).node
        assert all(x["bytes_in_use"] >= s.staged_bytes for x in numapin.stats() if x["node"] == node)
        f = CheckpointStager(async_staging=True)
        assert _same(f.stage(sd).result()["big"], sd["big"].cpu())
        f.close()
        del staged, kept
    gc.collect()
    assert in_use() == before


def test_dcp_async_save_of_cuda_tensors_with_the_stager(tmp_path):
    r = run_py(
        f"""
        import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
        from numapin.torch import CheckpointStager
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        sd = {{"w": torch.randn(1024, 1024, device="cuda:0"), "b": torch.arange(10, device="cuda:0")}}
        want = sd["w"].cpu()
        stager = CheckpointStager()
        fut = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter({str(tmp_path)!r}), async_stager=stager)
        sd["w"].add_(1)
        fut.result()
        back = {{"w": torch.zeros(1024, 1024), "b": torch.zeros(10, dtype=torch.int64)}}
        dcp.load(back, storage_reader=dcp.FileSystemReader({str(tmp_path)!r}))
        assert torch.equal(back["w"], want)
        stager.close()
        dist.destroy_process_group()
        print("ok")
        """,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("ok")

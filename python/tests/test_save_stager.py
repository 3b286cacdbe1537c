"""numapin.torch.CheckpointStager without a GPU: the AsyncStager protocol
(stage, should_synchronize_after_execute, synchronize_staging, close), a
training-safe pinned copy made once and reused, counted in numapin's
budget (a clear BudgetError when it does not fit), DCP's async_save with
its FileSystemWriter unchanged in a one-rank gloo group, and the stager's
own safetensors writer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402
from conftest import in_use, run_py  # noqa: E402
from numapin.torch import CheckpointStager  # noqa: E402


def _state():
    return {
        "model": {
            "w": torch.randn(64, 32),
            "b": torch.arange(32, dtype=torch.int64),
            "half": torch.randn(7, 3).to(torch.bfloat16),
            "t": torch.randn(16, 16).t(),
            "scalar": torch.tensor(3.0),
            "empty": torch.empty(0, 4),
            "mask": torch.rand(9) > 0.5,
        },
        "optim": {"step": 7, "lr": 0.1, "name": "adam", "list": [torch.ones(3), 4], "tup": (1, torch.zeros(2))},
    }


def _tensors(sd, out=None, path=""):
    out = {} if out is None else out
    if isinstance(sd, torch.Tensor):
        out[path] = sd
    elif isinstance(sd, dict):
        for k, v in sd.items():
            _tensors(v, out, f"{path}.{k}")
    elif isinstance(sd, (list, tuple)):
        for i, v in enumerate(sd):
            _tensors(v, out, f"{path}.{i}")
    return out


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    return a.numel() == 0 or torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def test_a_stage_is_a_training_safe_copy_in_numapin_memory_reused_across_saves():
    before = in_use()
    sd = _state()
    s = CheckpointStager()
    assert s.should_synchronize_after_execute is False
    staged = s.stage(sd)
    assert in_use() - before >= s.staged_bytes > 0
    src, got = _tensors(sd), _tensors(staged)
    assert sorted(src) == sorted(got)
    for k in src:
        assert _same(got[k], src[k]), k
        assert got[k].device.type == "cpu"
        # A storage of its own size: DCP's writer does not copy it again.
        assert got[k].untyped_storage().nbytes() == got[k].nbytes, k
    assert staged["optim"]["step"] == 7 and staged["optim"]["name"] == "adam"
    assert isinstance(staged["optim"]["tup"], tuple)
    # The training goes on: the staged copy does not change.
    kept = {k: v.clone() for k, v in got.items()}
    for v in src.values():
        if v.numel() and v.dtype != torch.bool:
            v.add_(1)
    for k in got:
        assert _same(got[k], kept[k]), k
    # The next stage reuses the same memory, with the new values.
    ptrs = {k: v.data_ptr() for k, v in got.items()}
    again = _tensors(s.stage(sd))
    assert {k: v.data_ptr() for k, v in again.items()} == ptrs
    for k in src:
        assert _same(again[k], src[k]), k
    s.synchronize_staging()
    s.close()
    del staged, got, again, kept
    assert in_use() == before
    with pytest.raises(numapin.InputError):
        s.stage(sd)


def test_another_state_dict_remakes_the_copy_and_prepare_makes_it_ahead():
    s = CheckpointStager()
    sd = _state()
    s.prepare(sd)
    n = s.staged_bytes
    assert n > 0
    s.stage(sd)
    assert s.staged_bytes == n
    sd["model"]["w"] = torch.randn(128, 32)
    staged = s.stage(sd)
    assert s.staged_bytes > n
    assert _same(staged["model"]["w"], sd["model"]["w"])
    s.close()


def test_asynchronous_staging_returns_a_future():
    with CheckpointStager(async_staging=True) as s:
        sd = _state()
        f = s.stage(sd)
        staged = f.result()
        for k, v in _tensors(sd).items():
            assert _same(_tensors(staged)[k], v)
        s.synchronize_staging()


def test_sparse_and_meta_tensors_are_refused_naming_them():
    s = CheckpointStager()
    with pytest.raises(numapin.InputError, match="'a.b'"):
        s.stage({"a": {"b": torch.zeros(3).to_sparse()}})
    with pytest.raises(numapin.InputError, match="meta"):
        s.stage({"m": torch.empty(3, device="meta")})
    s.close()


def test_a_state_dict_over_the_budget_is_a_budget_error_saying_what_is_short():
    r = run_py(
        """
        import torch, numapin
        from numapin.torch import CheckpointStager
        numapin.configure(budget_bytes=64 << 20)
        s = CheckpointStager()
        try:
            s.stage({"w": torch.zeros(32 << 20)})
        except numapin.BudgetError as e:
            print("refused:", e)
        assert sum(x["bytes_in_use"] for x in numapin.stats()) == 0
        """
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused: the checkpoint stager needs" in r.stdout and "budget" in r.stdout, r.stdout


def test_dcp_async_save_with_the_file_system_writer_unchanged(tmp_path):
    r = run_py(
        f"""
        import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
        from numapin.torch import CheckpointStager
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        sd = {{"model": {{"w": torch.randn(256, 64), "b": torch.arange(10)}}, "step": 3}}
        want = {{"w": sd["model"]["w"].clone(), "b": sd["model"]["b"].clone()}}
        stager = CheckpointStager()
        for i in range(2):
            fut = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter({str(tmp_path)!r} + f"/ck{{i}}"), async_stager=stager)
            # The training may change its tensors once async_save returns.
            sd["model"]["w"].add_(1)
            fut.result()
            back = {{"model": {{"w": torch.zeros(256, 64), "b": torch.zeros(10, dtype=torch.int64)}}, "step": 0}}
            dcp.load(back, storage_reader=dcp.FileSystemReader({str(tmp_path)!r} + f"/ck{{i}}"))
            assert torch.equal(back["model"]["w"], want["w"] + i), i
            assert torch.equal(back["model"]["b"], want["b"])
            assert back["step"] == 3
        stager.close()
        dist.destroy_process_group()
        print("ok")
        """,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("ok"), r.stdout


def test_the_stagers_own_writer_saves_safetensors_on_a_thread(tmp_path):
    sd = {"w": torch.randn(100, 10), "b": torch.arange(5)}
    with CheckpointStager() as s:
        want = sd["w"].clone()
        f = s.save_safetensors(sd, tmp_path / "a.safetensors", metadata={"step": "1"})
        sd["w"].add_(1)  # allowed once the call returned
        assert f.result() == [str(tmp_path / "a.safetensors")]
        got = st.load_file(str(tmp_path / "a.safetensors"))
        assert torch.equal(got["w"], want) and torch.equal(got["b"], sd["b"])
        f2 = s.save_safetensors(sd, tmp_path / "b.safetensors")
        f2.result()
        assert torch.equal(st.load_file(str(tmp_path / "b.safetensors"))["w"], sd["w"])

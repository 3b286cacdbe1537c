"""load_safetensors(..., shard="replica") over NCCL, one rank per CUDA GPU
(all of them, up to 4; a group of one on a one-GPU machine): every rank's
tensors on its own GPU, bit-identical to safetensors' load. Skipped without
CUDA."""

from __future__ import annotations

import os

import pytest

from conftest import requires, skip

pytestmark = requires("gpu")

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
dist = pytest.importorskip("torch.distributed")

import numapin  # noqa: E402
from test_replica import _error, _tiny, spawn  # noqa: E402
from test_storage import _checkpoint, _same, _sharded  # noqa: E402


def _gpu_ranks(rank: int, world: int, tmp: str) -> dict:
    idx = os.path.join(tmp, "model.safetensors.index.json")
    want = {k: v for f in sorted(os.listdir(tmp)) if f.startswith("model-")
            for k, v in st.load_file(os.path.join(tmp, f)).items()}
    res: dict = {}
    for small in (False, True):
        _tiny(small)
        stats: dict = {}
        got = numapin.load_safetensors(idx, device=f"cuda:{rank}", shard="replica", stats=stats)
        res[f"small={small}"] = {
            "names": list(got) == sorted(want),
            "device": all(t.device == torch.device("cuda", rank) for t in got.values()),
            "bad": [k for k in want if not _same(got[k].cpu(), want[k])],
            "received": stats["replica"]["received_bytes"],
            "chunk": stats.get("chunk_bytes"),
        }
        del got
    res["cpu_with_nccl"] = _error(lambda: numapin.load_safetensors(idx, device=None, shard="replica"))
    return res


def test_gpu_replica_over_nccl_every_rank_every_tensor(tmp_path):
    world = min(torch.cuda.device_count(), 4)
    if not dist.is_nccl_available():
        skip("gpu", "torch without NCCL (needs a CUDA build)")
    ts = _checkpoint()
    ts.update({f"w{i}": torch.randn(1024, 1024 + i) for i in range(6)})  # tensors broadcast in place
    _sharded(tmp_path, ts, 3)
    for r, res in enumerate(spawn(_gpu_ranks, world, tmp_path, backend="nccl", timeout=120)):
        assert "crash" not in res, res.get("crash")
        for case in ("small=False", "small=True"):
            x = res[case]
            assert x["names"] and x["device"] and not x["bad"], (r, case, x)
            assert (x["received"] > 0) == (world > 1)
            assert x["chunk"] in (1 << 20, 2 << 20, 4 << 20), (r, case, x["chunk"])  # numapin's pick, reported
        assert res["cpu_with_nccl"]["type"] == "InputError" and "NCCL" in res["cpu_with_nccl"]["msg"]

"""On a CUDA GPU: checkpoints loaded to device equal safetensors'
load_file(device="cuda"), and file ranges and tensors made during the read
reach CUDA tensors in the order of torch's stream. Skipped without one."""

from __future__ import annotations

import gc
import json

import pytest

from conftest import requires

pytestmark = requires("gpu")

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402
from test_storage import _checkpoint, _same, _sharded  # noqa: E402


def test_gpu_load_equals_safetensors_load_file(tmp_path, no_leak):
    ts = _checkpoint()
    p = tmp_path / "model.safetensors"
    st.save_file(ts, str(p))
    want = st.load_file(str(p), device="cuda:0")
    for io in ("auto", "buffered", "direct"):
        got = numapin.load_safetensors(p, device="cuda:0", io=io, chunk_bytes=1 << 20)
        assert list(got) == sorted(want)
        for k in want:
            assert got[k].device == torch.device("cuda", 0)
            assert _same(got[k], want[k]), (k, io)
        del got
    gc.collect()


def test_gpu_chunk_shrinks_with_the_ranks_reading_at_once(tmp_path, no_leak, monkeypatch):
    # numapin's pick keeps every rank's slots in half the node's L3: 1 to
    # 4 MiB, never larger for four ranks than for one; a launcher's
    # LOCAL_WORLD_SIZE caps the ranks counted (the others are on other
    # machines); a given chunk wins.
    ts = _checkpoint()
    idx = _sharded(tmp_path, ts, 4)
    picked = {}
    for world in (1, 4):
        stats = {}
        got = numapin.load_safetensors(idx, device="cuda:0", shard=(0, world), stats=stats)
        picked[world] = stats["chunk_bytes"]
        del got
    assert all(c in (1 << 20, 2 << 20, 4 << 20) for c in picked.values()), picked
    assert picked[4] <= picked[1], picked
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    stats = {}
    got = numapin.load_safetensors(idx, device="cuda:0", shard=(0, 4), stats=stats)
    assert stats["chunk_bytes"] == picked[1], (stats["chunk_bytes"], picked)
    del got
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    stats = {}
    got = numapin.load_safetensors(idx, device="cuda:0", chunk_bytes=3 << 20, stats=stats)
    assert stats["chunk_bytes"] == 3 << 20, stats
    del got
    gc.collect()


def test_gpu_index_and_shards(tmp_path, no_leak):
    ts = _checkpoint()
    idx = _sharded(tmp_path, ts, 2)
    shares = numapin.safetensors_shards(idx, 2)
    for r in range(2):
        got = numapin.load_safetensors(idx, device="cuda", shard=(r, 2))
        assert sorted(got) == sorted(shares[r])
        for k, v in got.items():
            assert _same(v.cpu(), ts[k]), k
    gc.collect()


def test_gpu_read_to_device_follows_the_stream(tmp_path):
    data = bytes((i * 31 + i // 7) % 256 for i in range(9 << 20))
    p = tmp_path / "data.bin"
    p.write_bytes(data)
    out = torch.empty(len(data), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out.fill_(7)  # queued first: the read must land after it
        r = numapin.read_to_device(p, 0, len(data), out)
        back = out.cpu()
    assert bytes(back.tolist()[:4096]) == data[:4096]
    assert torch.equal(back, torch.frombuffer(bytearray(data), dtype=torch.uint8))
    assert r["staging_bytes"] > 0
    # An odd range into a view of a larger tensor.
    out2 = torch.zeros(5 << 20, dtype=torch.uint8, device="cuda")
    numapin.read_to_device(p, 4097, 3 << 20, out2[3:])
    assert torch.equal(out2[3:3 + (3 << 20)].cpu(), torch.frombuffer(bytearray(data[4097:4097 + (3 << 20)]), dtype=torch.uint8))
    with pytest.raises(numapin.InputError):
        numapin.read_to_device(p, 0, len(data) + 1, torch.empty(len(data) + 1, dtype=torch.uint8, device="cuda"))


def test_gpu_work_queued_while_the_tensors_are_made_lands_before_the_read(tmp_path, no_leak):
    # Many small tensors made during the read reach the workers in batches,
    # each after one event record on the caller's stream. Work queued on
    # that stream while a tensor is made (a fill, held back behind a spin)
    # must land before the tensor's bytes, as torch's stream order says.
    from numapin import _numapin

    n = 600
    p = tmp_path / "many.safetensors"
    st.save_file({f"t{k:04d}": torch.full((1000 + k,), k % 251, dtype=torch.uint8) for k in range(n)}, str(p))
    ck = _numapin.open_safetensors(str(p))
    sel = ck.select(None, None, None)
    infos = ck.tensors()
    stream = torch.cuda.current_stream()
    made: dict[int, object] = {}

    def make(k: int) -> int:
        t = torch.empty(infos[sel[k]][3], dtype=torch.uint8, device="cuda")
        if k % 100 == 0:
            torch.cuda._sleep(20_000_000)  # some milliseconds of the GPU's time
        t.fill_(0xEE)
        made[k] = t
        return t.data_ptr()

    ck.load_to_device(sel, make, torch.cuda.current_device(), int(stream.cuda_stream), chunk_bytes=64 << 10)
    torch.cuda.synchronize()
    assert len(made) == n
    for k, i in enumerate(sel):
        want = int(infos[i][0][1:]) % 251
        assert bool((made[k] == want).all()), (infos[i][0], made[k][:8].tolist())
    del made
    gc.collect()


def test_gpu_pinned_cpu_load_is_pinned_on_the_gpus_node(tmp_path, no_leak):
    p = tmp_path / "m.safetensors"
    st.save_file({"w": torch.arange(1 << 20, dtype=torch.float32)}, str(p))
    got = numapin.load_safetensors(p, device=None, gpu=0)
    assert got["w"].is_pinned()
    assert torch.equal(got["w"].to("cuda", non_blocking=True).cpu(), torch.arange(1 << 20, dtype=torch.float32))
    del got
    gc.collect()


def test_gpu_index_json_written_by_hand(tmp_path):
    st.save_file({"a": torch.ones(3)}, str(tmp_path / "s.safetensors"))
    idx = tmp_path / "i.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s.safetensors"}}))
    assert torch.equal(numapin.load_safetensors(idx)["a"].cpu(), torch.ones(3))

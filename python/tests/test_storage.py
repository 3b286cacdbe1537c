"""Checkpoints and file ranges without a GPU: numapin.load_safetensors(...,
device=None) against safetensors' own loader (every dtype, empty tensors,
odd sizes, offsets that are not page-aligned, indexes, rank shares),
read_to_device into CPU tensors, and hostile files (InputError, nothing
left allocated)."""

from __future__ import annotations

import gc
import json
import os
import struct

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def _tensor(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(torch.tensor(shape).prod().item()) * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).to(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)


def _same(a, b):
    """Equal dtype, shape and bytes (NaNs in random floats compare unequal)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _checkpoint():
    ts = {}
    for i, d in enumerate(DTYPES):
        ts[f"t{i}.{str(d).removeprefix('torch.')}"] = _tensor(d, (3, 5 + i), i)
    ts["empty"] = torch.empty((0, 7), dtype=torch.float32)
    ts["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    ts["odd"] = _tensor(torch.uint8, (4097,), 99)
    ts["big"] = _tensor(torch.bfloat16, (3, 700_001), 7)
    return ts


def _check(got, want):
    assert list(got) == sorted(want)
    for k, v in want.items():
        assert _same(got[k], v), k
        assert got[k].device.type == "cpu"


def test_every_dtype_loads_as_safetensors_loads_it(tmp_path, no_leak):
    ts = _checkpoint()
    p = tmp_path / "model.safetensors"
    st.save_file(ts, str(p))
    want = st.load_file(str(p))
    got = numapin.load_safetensors(p, device=None)
    _check(got, want)
    for io in ("buffered", "direct"):
        _check(numapin.load_safetensors(p, device=None, io=io, chunk_bytes=65536, threads=3), want)
    # The tensors live in numapin's arena, on a node.
    assert any(s["bytes_in_use"] > 0 for s in numapin.stats())
    got["big"].add_(1)  # writable
    del got
    gc.collect()


def test_the_chunk_is_numapins_pick_unless_given(tmp_path, no_leak):
    # Into pinned host memory there are no slots: numapin's pick is its
    # largest chunk, 4 MiB; a given chunk is used as given, and the report
    # says which.
    ts = _checkpoint()
    p = tmp_path / "model.safetensors"
    st.save_file(ts, str(p))
    for kw, chunk in ((dict(), 4 << 20), (dict(shard=(0, 4)), 4 << 20), (dict(chunk_bytes=65536), 65536)):
        stats = {}
        got = numapin.load_safetensors(p, device=None, stats=stats, **kw)
        assert stats["chunk_bytes"] == chunk, (kw, stats)
        del got
    gc.collect()


def test_the_readers_are_the_shards_ranks_on_this_machine(monkeypatch):
    # What numapin's chunk counts: the shard's world size, at most the
    # launcher's LOCAL_WORLD_SIZE (the other ranks are elsewhere); one
    # without a shard, and a bad LOCAL_WORLD_SIZE says nothing.
    readers = numapin._storage._readers
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert (readers(None), readers(8)) == (1, 8)
    for env, want in (("4", 4), ("16", 8), ("x", 8), ("0", 8)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", env)
        assert readers(8) == want, env


def _hand_written(path, pad):
    a = bytes(range(3))
    b = bytes((i * 7) % 256 for i in range(4 * 5000))
    c = bytes((i * 13) % 256 for i in range(2 * 333))
    header = json.dumps({
        "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
        "b": {"dtype": "F32", "shape": [5000], "data_offsets": [3, 20003]},
        "c": {"dtype": "F16", "shape": [333], "data_offsets": [20003, 20669]},
    }) + " " * pad
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + a + b + c)


@pytest.mark.parametrize("pad", [0, 1, 5, 4091])
def test_tensors_at_unaligned_offsets(tmp_path, pad, no_leak):
    p = tmp_path / f"hand{pad}.safetensors"
    _hand_written(p, pad)
    _check(numapin.load_safetensors(p, device=None), st.load_file(str(p)))
    gc.collect()


def _sharded(tmp_path, ts, n):
    names = sorted(ts)
    wmap = {}
    for k in range(n):
        part = {x: ts[x] for x in names[k::n]}
        fn = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        st.save_file(part, str(tmp_path / fn))
        wmap.update({x: fn for x in part})
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wmap}))
    return idx


def test_an_index_subsets_and_rank_shares(tmp_path, no_leak, monkeypatch):
    ts = _checkpoint()
    idx = _sharded(tmp_path, ts, 3)
    _check(numapin.load_safetensors(idx, device=None), ts)
    sub = numapin.load_safetensors(idx, device=None, names=["odd", "empty"])
    assert list(sub) == ["empty", "odd"]
    shares = numapin.safetensors_shards(idx, 4)
    flat = [n for s in shares for n in s]
    assert sorted(flat) == sorted(ts) and len(flat) == len(set(flat))
    for r in range(4):
        got = numapin.load_safetensors(idx, device=None, shard=(r, 4))
        assert sorted(got) == sorted(shares[r])
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert sorted(numapin.load_safetensors(idx, device=None, shard="local")) == sorted(shares[1])
    with pytest.raises(numapin.InputError):
        numapin.load_safetensors(idx, device=None, shard=(4, 4))
    with pytest.raises(numapin.InputError):
        numapin.load_safetensors(idx, device=None, names=["nope"])
    gc.collect()


def test_read_to_device_fills_cpu_tensors_at_any_offset(tmp_path):
    data = bytes((i * 31 + i // 7) % 256 for i in range(3 << 20))
    p = tmp_path / "data.bin"
    p.write_bytes(data)
    for off, n in [(0, 1), (1, 4095), (4096, 1 << 20), (12345, 2_000_001), (len(data) - 3, 3)]:
        out = torch.zeros(n + 10, dtype=torch.uint8)
        r = numapin.read_to_device(p, off, n, out)
        assert bytes(out[:n].tolist()) == data[off:off + n]
        assert bytes(out[n:].tolist()) == bytes(10)
        assert r["bytes"] == n
    with pytest.raises(numapin.InputError, match="past the end"):
        numapin.read_to_device(p, len(data) - 2, 3, torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(numapin.InputError):
        numapin.read_to_device(p, 0, 100, torch.zeros(3, dtype=torch.uint8))


def test_hostile_files_raise_input_error_and_leave_nothing(tmp_path, no_leak):
    good_path = tmp_path / "good.safetensors"
    st.save_file({"x": torch.arange(1000, dtype=torch.float32), "y": torch.ones(10)}, str(good_path))
    good = good_path.read_bytes()
    (n,) = struct.unpack("<Q", good[:8])

    def with_header(h: bytes, data: bytes) -> bytes:
        return struct.pack("<Q", len(h)) + h + data

    def t(o: str) -> bytes:
        return (
            '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            f'"y":{{"dtype":"F32","shape":[2],"data_offsets":{o}}}}}'
        ).encode()

    cases = {
        "empty": b"",
        "cut_len": good[:5],
        "cut_header": good[: 8 + n // 2],
        "cut_data": good[:-1],
        "huge_header": struct.pack("<Q", 1 << 63) + good[8:],
        "bad_json": with_header(b'{"x": [', b""),
        "offsets_past_end": with_header(t("[8,16]"), bytes(12)),
        "overlap": with_header(t("[4,12]"), bytes(12)),
        "trailing": good + b"\0",
    }
    for name, body in cases.items():
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(body)
        with pytest.raises(numapin.InputError) as e:
            numapin.load_safetensors(p, device=None)
        assert "fix:" in str(e.value) and e.value.fix, name
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(numapin.InputError, match="FIFO"):
        numapin.load_safetensors(fifo, device=None)
    with pytest.raises(numapin.InputError, match="directory"):
        numapin.load_safetensors(tmp_path, device=None)
    idx = tmp_path / "evil.index.json"
    idx.write_text(json.dumps({"weight_map": {"x": "../good.safetensors"}}))
    with pytest.raises(numapin.InputError, match="relative path"):
        numapin.load_safetensors(idx, device=None)
    with pytest.raises(numapin.InputError) as e:
        numapin.load_safetensors(good_path, device=None, io="sideways")
    assert 'io="sideways"' in str(e.value) and '"direct"' in e.value.fix, e.value
    with pytest.raises(TypeError, match="io=5 is not a string"):
        numapin.load_safetensors(good_path, device=None, io=5)
    gc.collect()


def test_locate_says_where_a_file_lives(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x")
    text, drives = numapin.locate(p)
    assert text
    for d in drives:
        assert set(d) == {"name", "pci_bus_id", "numa_node", "package", "kind"}

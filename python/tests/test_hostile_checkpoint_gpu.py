"""On a CUDA GPU: checkpoints from strangers loaded to the device. Every
dtype safetensors loads (F4, F8_E8M0, the FNUZ ones) equals
load_file(device="cuda"); an index of more shards than a load holds open
at once loads whole, also under a low open-file limit and with a
selection against the files' order; a sparse file
claiming a terabyte is refused before torch allocates anything. Skipped
without a GPU."""

from __future__ import annotations

import gc
import json
import struct

import pytest

from conftest import run_py, requires

pytestmark = requires("gpu")

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402


def _bytes_of(t):
    if t.numel() == 0:
        return b""
    return bytes(t.cpu().contiguous().view(-1).view(torch.uint8).tolist())


def test_gpu_every_dtype_safetensors_loads_equals_load_file(tmp_path, no_leak):
    def u8(n):
        # A buffer of its own each: safetensors refuses tensors sharing memory.
        return torch.arange(n, dtype=torch.uint8)

    ts = {
        "e8m0": u8(6).view(torch.float8_e8m0fnu).reshape(2, 3),
        "e4m3fnuz": u8(6).view(torch.float8_e4m3fnuz),
        "e5m2fnuz": u8(6).view(torch.float8_e5m2fnuz),
        "f4": u8(8).view(torch.float4_e2m1fn_x2).reshape(2, 4),
        "u16": u8(12).view(torch.uint16),
        "u64": u8(48).view(torch.uint64),
    }
    p = tmp_path / "all.safetensors"
    st.save_file(ts, str(p))
    want = st.load_file(str(p), device="cuda:0")
    got = numapin.load_safetensors(p, device="cuda:0")
    assert list(got) == sorted(want)
    for k, v in want.items():
        assert got[k].device == v.device and got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert _bytes_of(got[k]) == _bytes_of(v), k
    del got
    gc.collect()


def _index(tmp_path, n):
    wmap = {}
    for i in range(n):
        f = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        st.save_file({f"w{i}": torch.full((1000 + i,), i % 251, dtype=torch.uint8)}, str(tmp_path / f))
        wmap[f"w{i}"] = f
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return idx


def test_gpu_an_index_of_more_shards_than_a_turn_loads_whole(tmp_path, no_leak):
    idx = _index(tmp_path, 40)
    stats: dict = {}
    got = numapin.load_safetensors(idx, device="cuda", stats=stats)
    assert len(got) == 40
    for i in range(40):
        t = got[f"w{i}"]
        assert t.is_cuda and t.shape == (1000 + i,) and bool((t == i % 251).all()), i
    assert stats["bytes"] == sum(1000 + i for i in range(40))
    del got
    gc.collect()


def test_gpu_a_selection_against_file_order_over_turns_gives_each_tensor_its_bytes(tmp_path, no_leak):
    # The reader asks for the tensors a turn of files at a time, so not in
    # the selection's order: each must still come back in its place.
    from numapin import _storage

    idx = _index(tmp_path, 40)
    _ck, sel, infos, _dev, read, _alloc = _storage._open(idx, "cuda", None, None, None, None, 0, 0, "auto")
    part = sel[::-1]
    tensors, _report = read(part)
    for i, t in zip(part, tensors):
        k = int(infos[i][0][1:])
        assert t.shape == (1000 + k,) and bool((t == k % 251).all()), infos[i][0]
    del tensors
    gc.collect()


def test_gpu_six_hundred_shards_load_under_a_low_open_file_limit(tmp_path):
    idx = _index(tmp_path, 600)
    r = run_py(
        "import resource, torch, numapin\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
        f"sd = numapin.load_safetensors({str(idx)!r}, device='cuda')\n"
        "assert len(sd) == 600 and all(bool((t == i % 251).all()) for i, t in ((int(k[1:]), v) for k, v in sd.items()))\n"
        "print('ok')\n",
        timeout=300,
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_gpu_a_sparse_file_claiming_a_terabyte_is_refused_before_torch_allocates(tmp_path):
    tb = 1 << 40
    h = ('{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (tb, tb)).encode()
    p = tmp_path / "tb.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        try:
            f.truncate(8 + len(h) + tb)
        except OSError:
            pytest.skip("this filesystem holds no sparse terabyte")
    before = torch.cuda.memory_allocated()
    with pytest.raises(numapin.Error) as e:
        numapin.load_safetensors(p, device="cuda")
    assert not isinstance(e.value, RuntimeError)
    assert "GPU" in str(e.value) and "tb.safetensors" in str(e.value) and e.value.fix
    assert torch.cuda.memory_allocated() == before


def test_gpu_a_bad_make_stops_the_read_with_its_error(tmp_path, no_leak):
    # The compiled load_to_device asks make(k) for each tensor while it reads:
    # an exception, a non-address or an address that is no device memory of
    # the GPU ends the read with a clear error, the copies done, and no
    # tensor is asked for after it (20 files: two turns of files).
    from numapin import _numapin

    idx = _index(tmp_path, 20)
    ck = _numapin.open_safetensors(str(idx))
    sel = ck.select(None, None, None)
    infos = ck.tensors()
    host = torch.empty(4096, dtype=torch.uint8)
    stream = int(torch.cuda.current_stream().cuda_stream)
    dev = torch.cuda.current_device()
    cases = {
        "raises": (lambda k: (_ for _ in ()).throw(ValueError("no room here")), ValueError, "no room here"),
        "not a number": (lambda k: "0x1000", TypeError, ""),
        "host memory": (lambda k: host.data_ptr(), numapin.InputError, "not device memory"),
    }
    for what, (bad, kind, words) in cases.items():
        made: list = []
        asked: list[int] = []

        def make(k: int) -> int:
            asked.append(k)
            if k == 3:
                return bad(k)
            t = torch.empty(infos[sel[k]][3], dtype=torch.uint8, device="cuda")
            made.append(t)
            return t.data_ptr()

        with pytest.raises(kind) as e:
            ck.load_to_device(sel, make, dev, stream)
        assert words in str(e.value), (what, e.value)
        assert asked == [0, 1, 2, 3], (what, asked)
        del made
    del host
    gc.collect()

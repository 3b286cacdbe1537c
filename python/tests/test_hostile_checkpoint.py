"""Checkpoints from strangers, through numapin.load_safetensors: headers
that lie, compared case by case with safetensors' own loader (numapin
agrees, or refuses where safetensors would hand out something other than
the file says; it never loads what safetensors refuses), indexes pointing
outside their folder or at missing or doubled tensors, odd files, every
dtype safetensors loads, sizes and ranks from the caller (checked before a
file is opened), the cost of large indexes and the descriptors of many
shards. Every refusal is a numapin error naming the file (and the tensor);
nothing stays lent."""

from __future__ import annotations

import gc
import json
import os
import struct
import time

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402
from conftest import run_py  # noqa: E402


def _file(header: bytes | str, data: bytes) -> bytes:
    h = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(h)) + h + data


def _entry(name: str, dtype: str, shape: str, b: int, e: int) -> str:
    return f'"{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{b},{e}]}}'


def _xy(y: str) -> str:
    return "{" + _entry("x", "F32", "[2]", 0, 8) + "," + y + "}"


GOOD = _xy(_entry("y", "U8", "[4]", 8, 12))
BOTH, NEITHER, STRICTER = "both", "neither", "stricter"

# name: (file bytes, verdict, tensor the refusal must name)
CASES: dict[str, tuple[bytes, str, str | None]] = {
    "good": (_file(GOOD, bytes(12)), BOTH, None),
    "len_zero": (struct.pack("<Q", 0) + b"{}", NEITHER, None),
    "len_past_file": (struct.pack("<Q", 100) + b"{}", NEITHER, None),
    "len_max": (struct.pack("<Q", 2**64 - 1) + b"{}", NEITHER, None),
    "len_over_limit": (struct.pack("<Q", 100_000_001) + b"{}", NEITHER, None),
    "short": (b"\1\0\0", NEITHER, None),
    "not_json": (_file('{"x": [', b""), NEITHER, None),
    "not_utf8": (_file(b'{"\xff": 1}', b""), NEITHER, None),
    "array": (_file("[1, 2]", b""), NEITHER, None),
    "empty_object": (_file("{}", b""), BOTH, None),
    "trailing_chars": (_file(GOOD + "x", bytes(12)), NEITHER, None),
    "padded": (_file("  " + GOOD + "   ", bytes(12)), BOTH, None),
    "trailing_bytes": (_file(GOOD, bytes(13)), NEITHER, None),
    "dup": (_file("{" + _entry("x", "U8", "[2]", 0, 2) + "," + _entry("x", "U8", "[4]", 0, 4) + "}", bytes(4)),
            STRICTER, "x"),
    "no_dtype": (_file(_xy('"y":{"shape":[4],"data_offsets":[8,12]}'), bytes(12)), NEITHER, "y"),
    "unknown_field": (_file(_xy('"y":{"dtype":"U8","shape":[4],"data_offsets":[8,12],"z":[1]}'), bytes(12)),
                      BOTH, None),
    "dtype_unknown": (_file(_xy(_entry("y", "F128", "[4]", 8, 12)), bytes(12)), NEITHER, "y"),
    "dtype_as_map": (_file(_xy('"y":{"dtype":{"U8":null},"shape":[4],"data_offsets":[8,12]}'), bytes(12)),
                     STRICTER, "y"),
    "shape_negative": (_file(_xy(_entry("y", "U8", "[-4]", 8, 12)), bytes(12)), NEITHER, "y"),
    "shape_fraction": (_file(_xy(_entry("y", "U8", "[1.5]", 8, 12)), bytes(12)), NEITHER, "y"),
    "shape_overflow": (_file(_xy(_entry("y", "U8", "[4294967296,4294967296,2]", 8, 12)), bytes(12)), NEITHER, "y"),
    # safetensors fails in torch (a TypeError); numapin says why.
    "shape_dim_2_63": (_file(_xy(_entry("y", "U8", "[9223372036854775808,0]", 8, 8)), bytes(8)), NEITHER, "y"),
    "shape_dim_2_62": (_file(_xy(_entry("y", "U8", "[4611686018427387904,0]", 8, 8)), bytes(8)), BOTH, None),
    "shape_65_dims": (_file(_xy(_entry("y", "U8", "[" + "1," * 64 + "4]", 8, 12)), bytes(12)), STRICTER, "y"),
    "offsets_reversed": (_file(_xy(_entry("y", "U8", "[4]", 12, 8)), bytes(12)), NEITHER, "y"),
    "offsets_past_end": (_file(GOOD, bytes(10)), NEITHER, None),
    "offsets_overlap": (_file(_xy(_entry("y", "U8", "[8]", 4, 12)), bytes(12)), NEITHER, "y"),
    "offsets_gap": (_file(_xy(_entry("y", "U8", "[4]", 12, 16)), bytes(16)), NEITHER, "y"),
    "offsets_size": (_file(_xy(_entry("y", "U8", "[4]", 8, 13)), bytes(13)), NEITHER, "y"),
    "nesting_125": (_file(_xy('"y":{"dtype":"U8","shape":[4],"data_offsets":[8,12],"z":' + "[" * 125 + "]" * 125 + "}"),
                          bytes(12)), BOTH, None),
    "nesting_126": (_file(_xy('"y":{"dtype":"U8","shape":[4],"data_offsets":[8,12],"z":' + "[" * 126 + "]" * 126 + "}"),
                          bytes(12)), NEITHER, None),
    "meta_number": (_file('{"__metadata__":{"a":1},' + GOOD[1:], bytes(12)), NEITHER, None),
    "f4": (_file(_xy(_entry("y", "F4", "[2,4]", 8, 12)), bytes(range(12))), BOTH, None),
    "f4_odd_last_dim": (_file(_xy(_entry("y", "F4", "[4,1]", 8, 10)), bytes(10)), NEITHER, "y"),
    "f4_half_byte": (_file(_xy(_entry("y", "F4", "[3]", 8, 10)), bytes(10)), NEITHER, "y"),
    "f6": (_file(_xy(_entry("y", "F6_E2M3", "[4]", 8, 11)), bytes(11)), NEITHER, "y"),
    "f8_e8m0": (_file(_xy(_entry("y", "F8_E8M0", "[4]", 8, 12)), bytes(range(12))), BOTH, None),
    "f8_fnuz": (_file(_xy(_entry("y", "F8_E5M2FNUZ", "[4]", 8, 12)), bytes(range(12))), BOTH, None),
}


def _bytes_of(t):
    if t.numel() == 0:
        return b""
    return bytes(t.contiguous().view(-1).view(torch.uint8).tolist())


def test_headers_that_lie_get_the_verdict_of_safetensors_or_a_stricter_one(tmp_path, no_leak):
    for name in sorted(CASES):
        _check_case(tmp_path, name)
    gc.collect()


def _check_case(tmp_path, name):
    body, want, tensor = CASES[name]
    p = tmp_path / f"{name}.safetensors"
    p.write_bytes(body)
    try:
        theirs = st.load_file(str(p), device="cpu")
    except Exception:  # noqa: BLE001 - any failure of theirs is a refusal
        theirs = None
    try:
        ours = numapin.load_safetensors(p, device=None)
        err = None
    except numapin.Error as e:
        ours, err = None, e
    got = {(True, True): BOTH, (False, False): NEITHER, (False, True): STRICTER}.get(
        (ours is not None, theirs is not None)
    )
    assert got is not None, f"numapin loads what safetensors refuses: {name}"
    assert got == want, (name, err)
    if ours is not None:
        assert list(ours) == sorted(theirs)
        for k, v in theirs.items():
            assert ours[k].dtype == v.dtype and ours[k].shape == v.shape, k
            assert _bytes_of(ours[k]) == _bytes_of(v), k
        del ours
    else:
        assert isinstance(err, numapin.InputError), repr(err)
        assert f"{name}.safetensors" in str(err), str(err)
        assert err.fix, str(err)
        if tensor:
            assert repr(tensor) in str(err) or f'"{tensor}"' in str(err), str(err)


def _shard(path, names):
    h = "{" + ",".join(_entry(n, "U8", "[1]", i, i + 1) for i, n in enumerate(names)) + "}"
    path.write_bytes(_file(h, bytes(i % 256 for i in range(len(names)))))
    return path


def _index(path, wmap):
    path.write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return path


def test_indexes_naming_files_outside_their_folder_or_missing_or_doubled_tensors_are_refused(tmp_path, no_leak):
    d = tmp_path / "ck"
    d.mkdir()
    _shard(d / "a.safetensors", ["w1", "w2"])
    _shard(d / "b.safetensors", ["w3", "w2"])
    _shard(tmp_path / "outside.safetensors", ["w1"])
    os.symlink(tmp_path / "outside.safetensors", d / "out.safetensors")
    os.symlink("l2.safetensors", d / "l1.safetensors")
    os.symlink("l1.safetensors", d / "l2.safetensors")
    got = numapin.load_safetensors(_index(d / "ok.json", {"w1": "a.safetensors", "w3": "b.safetensors"}), device=None)
    assert list(got) == ["w1", "w3"] and got["w3"].tolist() == [0]
    del got
    cases = {
        "missing": ({"w1": "c.safetensors"}, "does not exist"),
        "up": ({"w1": "../outside.safetensors"}, "relative path"),
        "absolute": ({"w1": str(tmp_path / "outside.safetensors")}, "relative path"),
        "link_out": ({"w1": "out.safetensors"}, "leads out"),
        "loop": ({"w1": "l1.safetensors"}, "loop"),
        "absent": ({"w9": "a.safetensors"}, "'w9'"),
        "in_two": ({"w2": "a.safetensors", "w3": "b.safetensors"}, "'w2'"),
    }
    for name, (wmap, says) in cases.items():
        p = _index(d / f"{name}.json", wmap)
        with pytest.raises(numapin.InputError) as e:
            numapin.load_safetensors(p, device=None)
        text = str(e.value).replace('"', "'")
        assert f"{name}.json" in text and says in text, (name, text)
    raw = {
        "not_json.json": '{"weight_map": ',
        "not_object.json": "[1, 2]",
        "no_map.json": '{"metadata": {}}',
        "dup.json": '{"weight_map": {"w1": "a.safetensors", "w1": "b.safetensors"}}',
        "value.json": '{"weight_map": {"w1": 1}}',
    }
    for name, text in raw.items():
        (d / name).write_text(text)
        with pytest.raises(numapin.InputError, match=name):
            numapin.load_safetensors(d / name, device=None)
    huge = d / "huge.json"
    with open(huge, "wb") as f:
        f.truncate((64 << 20) + 1)
    with pytest.raises(numapin.InputError, match="too large"):
        numapin.load_safetensors(huge, device=None)
    gc.collect()


def test_odd_files_are_refused_without_waiting(tmp_path):
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    os.symlink("b.safetensors", tmp_path / "a.safetensors")
    os.symlink("a.safetensors", tmp_path / "b.safetensors")
    for p, says in [
        (fifo, "FIFO"),
        (tmp_path, "directory"),
        ("/dev/zero", "character device"),
        ("/proc/self/status", "shorter than"),
        (tmp_path / "a.safetensors", "symbolic links"),
    ]:
        with pytest.raises(numapin.InputError, match=says) as e:
            numapin.load_safetensors(p, device=None)
        assert str(p) in str(e.value)


def test_a_sparse_file_claiming_a_terabyte_is_refused_before_it_is_read(tmp_path, no_leak):
    tb = 1 << 40
    p = tmp_path / "tb.safetensors"
    h = "{" + _entry("w", "U8", f"[{tb}]", 0, tb) + "}"
    with open(p, "wb") as f:
        f.write(_file(h, b""))
        try:
            f.truncate(8 + len(h) + tb)
        except OSError:
            pytest.skip("this filesystem holds no sparse terabyte")
    with pytest.raises(numapin.BudgetError) as e:
        numapin.load_safetensors(p, device=None)
    assert "tb.safetensors" in str(e.value) and "'w'" in str(e.value).replace('"', "'"), str(e.value)
    assert e.value.fix, str(e.value)
    gc.collect()


@pytest.fixture
def ck(tmp_path):
    return _shard(tmp_path / "m.safetensors", ["a", "b", "c"])


ARGS = [
    (dict(shard=(0, 2**32)), numapin.InputError),
    (dict(shard=(2**64, 4)), numapin.InputError),
    (dict(shard=(-1, 4)), numapin.InputError),
    (dict(shard=(4, 4)), numapin.InputError),
    (dict(shard=(0, 0)), numapin.InputError),
    (dict(shard=("0", 4)), TypeError),
    (dict(shard=(0.5, 4)), TypeError),
    (dict(shard="global"), numapin.InputError),
    (dict(shard=(1, 2, 3)), numapin.InputError),
    (dict(threads=10**6), numapin.InputError),
    (dict(threads=-1), numapin.InputError),
    (dict(threads="4"), TypeError),
    (dict(chunk_bytes=-1), numapin.InputError),
    (dict(chunk_bytes=2**31), numapin.InputError),
    (dict(chunk_bytes=4.0), TypeError),
    (dict(names=[1, 2]), TypeError),
    (dict(names=5), TypeError),
    (dict(names=b"ab"), TypeError),
    (dict(names=["a", None]), TypeError),
    (dict(stats="x"), TypeError),
    (dict(stats=[]), TypeError),
    (dict(gpu=-1), numapin.InputError),
    (dict(io=3), TypeError),
]


def test_arguments_are_checked_before_a_file_is_opened(tmp_path, no_leak):
    for kwargs, exc in ARGS:
        # A path that does not exist: the argument's error comes first.
        with pytest.raises(exc) as e:
            numapin.load_safetensors(tmp_path / "absent.safetensors", device=None, **kwargs)
        assert "does not exist" not in str(e.value), kwargs
        assert "fix:" in str(e.value), kwargs


LOCAL = [
    ("99999999999999999999999", "4"),
    ("-1", "4"),
    ("abc", "4"),
    ("4", "4"),
    ("0", "0"),
    ("0", str(2**32)),
    ("", "4"),
    (None, "4"),
    ("1", None),
]


def test_local_ranks_from_the_environment_are_checked(ck, monkeypatch, no_leak):
    for rank, world in LOCAL:
        for var, value in [("LOCAL_RANK", rank), ("LOCAL_WORLD_SIZE", world)]:
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)
        with pytest.raises(numapin.InputError) as e:
            numapin.load_safetensors(ck, device=None, shard="local")
        assert "LOCAL_" in str(e.value) or "world size" in str(e.value), str(e.value)


def test_world_sizes_are_bounded_not_allocated(ck):
    t = time.monotonic()
    for w in [2**32, 2**21, 0, -1]:
        with pytest.raises(numapin.InputError):
            numapin.safetensors_shards(ck, w)
    with pytest.raises(TypeError):
        numapin.safetensors_shards(ck, "4")
    assert time.monotonic() - t < 5
    shares = numapin.safetensors_shards(ck, 4)
    assert len(shares) == 4 and sorted(n for s in shares for n in s) == ["a", "b", "c"]


def test_every_dtype_safetensors_loads_numapin_loads_alike_f6_is_refused_naming_file_and_tensor(tmp_path, no_leak):
    ts = {
        "e8m0": torch.arange(6, dtype=torch.uint8).view(torch.float8_e8m0fnu).reshape(2, 3),
        "e4m3fnuz": torch.arange(6, dtype=torch.uint8).view(torch.float8_e4m3fnuz),
        "e5m2fnuz": torch.arange(6, dtype=torch.uint8).view(torch.float8_e5m2fnuz),
        "f4": torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 4),
        "u16": torch.arange(12, dtype=torch.uint8).view(torch.uint16),
        "u32": torch.arange(24, dtype=torch.uint8).view(torch.uint32),
        "u64": torch.arange(48, dtype=torch.uint8).view(torch.uint64),
    }
    p = tmp_path / "all.safetensors"
    st.save_file(ts, str(p))
    want = st.load_file(str(p))
    got = numapin.load_safetensors(p, device=None)
    assert list(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert _bytes_of(got[k]) == _bytes_of(v), k
    del got
    # F6: torch has no type; the file and the tensor are named, the
    # others load.
    h = "{" + _entry("a", "U8", "[2]", 0, 2) + "," + _entry("six", "F6_E3M2", "[4]", 2, 5) + "}"
    p6 = tmp_path / "six.safetensors"
    p6.write_bytes(_file(h, bytes(5)))
    with pytest.raises(numapin.InputError) as e:
        numapin.load_safetensors(p6, device=None)
    assert "six.safetensors" in str(e.value) and "'six'" in str(e.value).replace('"', "'")
    assert list(numapin.load_safetensors(p6, device=None, names=["a"])) == ["a"]
    gc.collect()


def test_opening_an_index_costs_about_what_its_shard_costs(tmp_path):
    n = 60_000
    names = [f"model.layers.{i}.weight" for i in range(n)]
    s = _shard(tmp_path / "model-00001-of-00001.safetensors", names)
    idx = _index(tmp_path / "model.safetensors.index.json", {k: s.name for k in names})

    def took(p):
        t = time.monotonic()
        assert len(numapin.safetensors_shards(p, 1)[0]) == n
        return time.monotonic() - t

    shard_s, index_s = took(s), took(idx)
    # Linear: the index adds its parse and a lookup per tensor.
    assert index_s < 10 * shard_s + 0.5, (shard_s, index_s)


def test_six_hundred_shards_load_under_a_low_open_file_limit(tmp_path):
    wmap = {}
    for i in range(600):
        f = f"model-{i:05d}-of-00600.safetensors"
        _shard(tmp_path / f, [f"w{i}"])
        wmap[f"w{i}"] = f
    idx = _index(tmp_path / "model.safetensors.index.json", wmap)
    # The extension's checkpoint directly: load_safetensors adds torch
    # (seconds to import), not descriptors.
    r = run_py(
        "import resource\n"
        "from numapin import _numapin\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))\n"
        f"ck = _numapin.open_safetensors({str(idx)!r})\n"
        "bufs, report = ck.load_to_host(ck.select(None, None, None))\n"
        "assert len(bufs) == 600 and report['bytes'] == 600\n"
        "print('ok')\n"
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr

"""numapin.save_safetensors without a GPU: files that safetensors.torch
reads back bit for bit (and that it would have written byte for byte),
every dtype, 0-d and empty tensors, non-contiguous tensors, views sharing
storage, metadata, sharded saves with their index, numapin's loader both
ways; refusals naming the key; and faults (a directory, a FIFO, a link, a
full filesystem, ulimit -f, a read-only folder, a save killed mid-way,
two saves at once): the old file intact, no temporary file, nothing
allocated, mapped or open."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402
from conftest import run_py, skip  # noqa: E402
from test_storage import _checkpoint, _same, _tensor  # noqa: E402

#: Every dtype, an empty tensor, a scalar, odd sizes, one over several chunks.
_state = _checkpoint


def _open_under(d):
    """This process's descriptors naming files under folder ``d``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if t.startswith(str(d)):
            out.append(t)
    return out


def _check(got, want):
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert _same(got[k], v), k


def test_a_save_is_byte_for_byte_what_save_file_writes(tmp_path, nothing_left):
    ts = _state()
    for meta in (None, {"format": "pt"}):
        ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
        stats = {}
        files = numapin.save_safetensors(ts, ours, metadata=meta, stats=stats)
        st.save_file(ts, str(theirs), metadata=meta)
        assert files == [str(ours)]
        assert ours.read_bytes() == theirs.read_bytes()
        _check(st.load_file(str(ours)), ts)
        assert stats["bytes"] == ours.stat().st_size
        assert stats["direct_bytes"] + stats["buffered_bytes"] == stats["bytes"]
    from safetensors import safe_open

    with safe_open(str(ours), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert sorted(os.listdir(tmp_path)) == ["ours.safetensors", "theirs.safetensors"]


def test_every_mode_and_an_empty_dict(tmp_path, nothing_left):
    ts = _state()
    p = tmp_path / "m.safetensors"
    for io in ("auto", "buffered"):
        for fsync in (True, False):
            stats = {}
            numapin.save_safetensors(ts, p, io=io, fsync=fsync, chunk_bytes=1 << 16, threads=3, stats=stats)
            _check(st.load_file(str(p)), ts)
            if io == "buffered":
                assert stats["direct_bytes"] == 0
    numapin.save_safetensors({}, p)
    st.save_file({}, str(tmp_path / "e.safetensors"))
    assert p.read_bytes() == (tmp_path / "e.safetensors").read_bytes()


def test_non_contiguous_tensors_and_views_that_share_storage(tmp_path, nothing_left):
    base = _tensor(torch.float32, (64, 48), 3)
    ts = {
        "base": base,
        "transposed": base.t(),
        "stepped": base[::3, 1::2],
        "row": base[5],
        "narrow": base.narrow(1, 7, 9),
        "expanded": torch.arange(4, dtype=torch.int64).expand(3, 4),
        "conj": torch.randn(4, 3, dtype=torch.complex64).conj(),
        "neg": torch.randn(5, dtype=torch.complex64).conj().imag,
        "viewed_as_int": base.view(torch.int32)[2:4],
    }
    p = tmp_path / "views.safetensors"
    numapin.save_safetensors(ts, p)
    got = st.load_file(str(p))
    for k, v in ts.items():
        assert _same(got[k], v.resolve_conj().resolve_neg()), k
    # numapin's loader reads it too.
    _check(numapin.load_safetensors(p, device=None), {k: v.resolve_conj().resolve_neg() for k, v in ts.items()})


def test_both_ways_with_safetensors_and_numapins_loader(tmp_path, nothing_left):
    ts = _state()
    first = tmp_path / "first.safetensors"
    st.save_file(ts, str(first), metadata={"k": "v"})
    loaded = numapin.load_safetensors(first, device=None)
    second = tmp_path / "second.safetensors"
    numapin.save_safetensors(loaded, second, metadata={"k": "v"})
    assert first.read_bytes() == second.read_bytes()
    del loaded
    _check(numapin.load_safetensors(second, device=None), ts)


def test_sharded_saves_write_an_index_as_hugging_face_does(tmp_path, nothing_left):
    ts = _state()
    d = tmp_path / "ckpt"
    files = numapin.save_safetensors(ts, d, max_shard_size="4KB", metadata={"step": "7"})
    names = sorted(os.listdir(d))
    n = len(names) - 1
    assert "model.safetensors.index.json" in names
    assert files[-1] == str(d / "model.safetensors.index.json")
    assert f"model-00001-of-{n:05d}.safetensors" in names
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": sum(t.nbytes for t in ts.values()), "format": "pt", "step": "7"}
    assert sorted(index["weight_map"]) == sorted(ts)
    got = {}
    for f in set(index["weight_map"].values()):
        part = st.load_file(str(d / f))
        from safetensors import safe_open

        with safe_open(str(d / f), "pt") as h:
            assert h.metadata() == {"format": "pt", "step": "7"}
        got.update(part)
        assert sum(t.nbytes for t in part.values()) <= 4000 or len(part) == 1
    _check(got, ts)
    _check(numapin.load_safetensors(d / "model.safetensors.index.json", device=None), ts)
    # Split as huggingface_hub's split_state_dict_into_shards_factory does.
    assert index["weight_map"] == _hf_split({k: v.nbytes for k, v in ts.items()}, 4000)
    # One shard now: model.safetensors alone; the old shards and index go.
    (d / "notes.txt").write_text("kept")
    numapin.save_safetensors(ts, d, max_shard_size=1 << 30)
    assert sorted(os.listdir(d)) == ["model.safetensors", "notes.txt"]


def _hf_split(sizes, max_size):
    """huggingface_hub's split (without shared storages): tensor name to
    file name."""
    shards, cur, cur_size = [], {}, 0
    for k, n in sizes.items():
        if n > max_size:
            shards.append({k: n})
            continue
        if cur_size + n > max_size:
            shards.append(cur)
            cur, cur_size = {}, 0
        cur[k] = n
        cur_size += n
    if cur:
        shards.append(cur)
    if len(shards) == 1:
        return {k: "model.safetensors" for k in sizes}
    return {k: f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i, sh in enumerate(shards) for k in sh}


@pytest.mark.parametrize(
    "value, word",
    [
        (3, "int, not a tensor"),
        ("x", "str, not a tensor"),
        (torch.zeros(3).to_sparse(), "sparse"),
        (torch.empty(3, device="meta"), "meta"),
        (torch.zeros(2, dtype=torch.complex128), "complex128"),
        (torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.quint8), "quint8"),
    ],
)
def test_what_safetensors_cannot_hold_is_refused_up_front_naming_the_key(tmp_path, value, word, nothing_left):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"old")
    with pytest.raises(numapin.InputError) as e:
        numapin.save_safetensors({"fine": torch.zeros(2), "bad.key": value}, p)
    assert "'bad.key'" in str(e.value) and word in str(e.value), str(e.value)
    assert e.value.fix
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["x.safetensors"]


def test_bad_arguments_are_input_errors(tmp_path):
    p = tmp_path / "x.safetensors"
    for kwargs in (
        {"metadata": {"k": 1}},
        {"max_shard_size": "lots"},
        {"max_shard_size": 0},
        {"io": "sideways"},
        {"chunk_bytes": 0},
    ):
        with pytest.raises((numapin.InputError, TypeError)):
            numapin.save_safetensors({"a": torch.zeros(2)}, p, **kwargs)
    # The writer's chunk is its own (no automatic 0), and its fix says so.
    with pytest.raises(numapin.InputError, match="chunk size such as 8388608"):
        numapin.save_safetensors({"a": torch.zeros(2)}, p, chunk_bytes=0)
    with pytest.raises(numapin.InputError):
        numapin.save_safetensors([torch.zeros(2)], p)
    with pytest.raises(numapin.InputError):
        numapin.save_safetensors({1: torch.zeros(2)}, p)
    assert os.listdir(tmp_path) == []


def test_a_directory_and_a_fifo_are_refused_and_a_link_is_written_through(tmp_path, nothing_left):
    ts = {"w": torch.arange(10)}
    with pytest.raises(numapin.InputError, match="is a directory"):
        numapin.save_safetensors(ts, tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(numapin.InputError, match="FIFO"):
        numapin.save_safetensors(ts, fifo)
    real = tmp_path / "real.safetensors"
    real.write_bytes(b"old")
    link = tmp_path / "link.safetensors"
    link.symlink_to("real.safetensors")
    numapin.save_safetensors(ts, link)
    assert link.is_symlink()
    _check(st.load_file(str(real)), ts)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link.safetensors", "real.safetensors"]
    assert not _open_under(tmp_path)


def _mount_tmpfs(d, opts):
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        skip("root", f"cannot mount a tmpfs (needs root and mount): {r.stderr.decode().strip()}")


def _umount(d):
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_full_filesystem_leaves_the_old_file_and_nothing_behind(tmp_path, nothing_left):
    d = tmp_path / "small"
    _mount_tmpfs(d, "size=2m")
    try:
        p = d / "model.safetensors"
        p.write_bytes(b"the old file")
        with pytest.raises(numapin.Error) as e:
            numapin.save_safetensors(_state(), p)
        text = str(e.value)
        assert "model.safetensors" in text and "No space left" in text and "df -h" in e.value.fix, text
        assert p.read_bytes() == b"the old file"
        assert os.listdir(d) == ["model.safetensors"]
        assert not _open_under(d)
    finally:
        _umount(d)


def test_a_read_only_filesystem_is_a_limit_error(tmp_path, nothing_left):
    d = tmp_path / "ro"
    _mount_tmpfs(d, "size=1m,ro")
    try:
        with pytest.raises(numapin.LimitError) as e:
            numapin.save_safetensors({"w": torch.arange(4)}, d / "m.safetensors")
        assert "read-only" in e.value.fix
        assert os.listdir(d) == []
    finally:
        _umount(d)


def test_a_file_over_ulimit_f_is_refused_before_anything_is_written(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"the old file")
    r = run_py(
        f"""
        import resource, os, torch, numapin
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            numapin.save_safetensors({{"w": torch.zeros(1 << 20)}}, {str(p)!r})
        except numapin.Error as e:
            assert "ulimit -f" in e.fix, e
            print("refused:", e)
        assert sorted(os.listdir({str(tmp_path)!r})) == ["model.safetensors"]
        """
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused:" in r.stdout and "File too large" in r.stdout, r.stdout
    assert p.read_bytes() == b"the old file"


def test_a_folder_this_user_may_not_write_is_a_limit_error(tmp_path):
    if os.geteuid() != 0:
        skip("root", "needs root to run a child as user nobody")
    import shutil
    import tempfile

    # A folder nobody can reach but not write (pytest's are private to root).
    folder = tempfile.mkdtemp(prefix="numapin-save-", dir="/tmp")
    os.chmod(folder, 0o755)
    try:
        _nobody_cannot_write(folder)
    finally:
        shutil.rmtree(folder)


def _nobody_cannot_write(folder):
    from pathlib import Path

    tmp_path = Path(folder)
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"the old file")
    code = f"""
        import os, torch, numapin
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        try:
            numapin.save_safetensors({{"w": torch.zeros(4)}}, {str(p)!r})
        except numapin.LimitError as e:
            assert "may not create files" in e.fix, e
            print("refused:", e)
        """
    r = run_py(code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused:" in r.stdout and "Permission denied" in r.stdout, r.stdout
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    assert p.read_bytes() == b"the old file"


def test_a_save_killed_mid_way_leaves_its_temporary_file_which_the_next_save_removes(tmp_path, nothing_left):
    p = tmp_path / "ckpt.safetensors"
    p.write_bytes(b"the old file")
    code = f"""
        import torch, numapin
        sd = {{"w": torch.ones(1 << 28, dtype=torch.uint8), "v": torch.ones(1 << 28, dtype=torch.uint8)}}
        print("ready", flush=True)
        numapin.save_safetensors(sd, {str(p)!r})
        """
    import textwrap

    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        prefix = f".ckpt.safetensors.numapin-tmp-{child.pid}-"
        deadline = time.monotonic() + 60
        while not any(n.startswith(prefix) for n in os.listdir(tmp_path)):
            assert child.poll() is None, "the child ended before it was killed"
            assert time.monotonic() < deadline, "no temporary file appeared"
            time.sleep(0.001)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert p.read_bytes() == b"the old file"
    left = [n for n in os.listdir(tmp_path) if n.startswith(prefix)]
    assert len(left) == 1, os.listdir(tmp_path)
    ts = {"w": torch.arange(100)}
    stats = {}
    numapin.save_safetensors(ts, p, stats=stats)
    assert stats["removed_stale"] == 1
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    _check(st.load_file(str(p)), ts)


def test_two_saves_to_one_path_at_once_each_leave_a_whole_file(tmp_path, nothing_left):
    p = tmp_path / "m.safetensors"
    a = {"w": torch.full((3 << 20,), 1, dtype=torch.uint8)}
    b = {"w": torch.full((5 << 20,), 2, dtype=torch.uint8), "v": torch.arange(3)}
    errors = []

    def run(sd):
        try:
            numapin.save_safetensors(sd, p)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for _ in range(4):
        threads = [threading.Thread(target=run, args=(sd,)) for sd in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        got = st.load_file(str(p))
        assert sorted(got) in (["w"], ["v", "w"])
        _check(got, a if len(got) == 1 else b)
        assert os.listdir(tmp_path) == ["m.safetensors"]


def test_the_saved_file_keeps_the_old_files_permissions(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(b"old")
    os.chmod(p, 0o640)
    numapin.save_safetensors({"w": torch.arange(3)}, p)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640

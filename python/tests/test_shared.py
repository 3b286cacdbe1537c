"""numapin.SharedBuffer and numapin.place: shared pinned memory made once,
attached by name from another process, counted once, gone with its last
holder; and the one placement every part of the package asks."""

from __future__ import annotations

import gc
import os

import pytest

import numapin
from conftest import run_py


def shared_bytes() -> int:
    gc.collect()
    return sum(s["bytes_shared"] for s in numapin.stats())


def unique(tag: str) -> str:
    return f"pytest-{tag}-{os.getpid()}"


def test_place_answers_for_the_calling_thread_a_node_and_a_missing_gpu():
    s = numapin.place()
    assert s.cpus and s.node in [n.os_index for n in numapin.topology().numa_nodes]
    assert numapin.place(node=s.node).node == s.node
    with pytest.raises(numapin.InputError) as e:
        numapin.place(gpu=999)
    assert "999" in str(e.value) and e.value.fix
    with pytest.raises(numapin.InputError):
        numapin.place(node=4000)


def test_a_buffer_made_here_is_seen_by_another_process_and_counted_once():
    np = pytest.importorskip("numpy")
    name = unique("kv")
    before = shared_bytes()
    buf = numapin.SharedBuffer.create(name, 3 << 20)
    assert (buf.name, buf.nbytes, buf.owner) == (name, 3 << 20, True)
    assert shared_bytes() == before + (4 << 20), "whole 2 MiB, once"
    a = buf.view(np.int32, like="numpy")
    assert a.shape == ((3 << 20) // 4,)
    a[:] = 7
    r = run_py(
        f"""
        import numpy as np, numapin
        b = numapin.SharedBuffer.attach({name!r}, timeout=10)
        assert not b.owner and b.nbytes == {3 << 20}
        v = b.view(np.int32, (4,), offset=8, like="numpy")
        assert list(v) == [7, 7, 7, 7], list(v)
        v[0] = 42
        assert sum(s["bytes_shared"] for s in numapin.stats()) == 0, "not counted again"
        """
    )
    assert r.returncode == 0, r.stderr
    assert a[2] == 42, "the other process's write"
    del a, buf
    assert shared_bytes() == before
    with pytest.raises(numapin.InputError):
        numapin.SharedBuffer.attach(name, timeout=0.05)


def test_views_keep_the_memory_and_torch_views_work():
    torch = pytest.importorskip("torch")
    name = unique("torch")
    before = shared_bytes()
    buf = numapin.SharedBuffer.create(name, 1 << 20)
    t = buf.view(torch.float16, (256, 1024))
    assert t.shape == (256, 1024) and t.dtype == torch.float16
    t.fill_(1.5)
    del buf
    gc.collect()
    assert float(t.float().sum()) == 1.5 * 256 * 1024, "the view kept it"
    again = numapin.SharedBuffer.attach(name)
    assert float(again.view(torch.float16, (4,))[3]) == 1.5
    del t, again
    assert shared_bytes() == before


@pytest.mark.parametrize(
    "args, error",
    [
        (("", 1 << 20), numapin.InputError),
        (("a/b", 1 << 20), numapin.InputError),
        (("x" * 65, 1 << 20), numapin.InputError),
        (("ok-name", 0), numapin.InputError),
    ],
)
def test_bad_names_and_sizes_are_input_errors(args, error):
    with pytest.raises(error) as e:
        numapin.SharedBuffer.create(*args)
    assert e.value.fix


def test_views_past_the_end_and_bad_shapes_are_input_errors():
    buf = numapin.SharedBuffer.create(unique("bounds"), 4096)
    with pytest.raises(numapin.InputError):
        buf.view("uint8", (4097,))
    with pytest.raises(numapin.InputError):
        buf.view("uint8", (1,), offset=4096)
    with pytest.raises(numapin.InputError):
        buf.view("uint8", (-1,))
    with pytest.raises(numapin.InputError):
        buf.view("float32", (2,), offset=5000)
    assert buf.view("uint8", like="numpy").shape == (4096,)


def test_a_second_maker_of_a_live_name_is_refused():
    name = unique("twice")
    buf = numapin.SharedBuffer.create(name, 4096)
    with pytest.raises(numapin.InputError) as e:
        numapin.SharedBuffer.create(name, 4096)
    assert "in use" in str(e.value)
    del buf

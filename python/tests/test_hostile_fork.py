"""numapin's pinned memory in a dataset that forked DataLoader workers read.

The memory numapin lends (``empty``, ``pin``, ``load_safetensors(device=None)``,
``SharedBuffer`` views, pinned CPU batches) is ``MADV_DONTFORK``: a forked
child has no pages there, and a worker reading it would die with SIGSEGV.
``numapin.torch.DataLoader`` refuses such a dataset with an ``InputError``
naming where the tensor is, before any worker is forked; the same dataset
loads with ``num_workers=0``, with ``forkserver``, and once its data is in
ordinary memory (docs/python.md, "Processes")."""

from __future__ import annotations

import gc
import os

import pytest

from conftest import run_py

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
st = pytest.importorskip("safetensors.torch")

import numapin  # noqa: E402
import numapin.torch as nt  # noqa: E402
from torch.utils.data import Dataset, TensorDataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("nothing_left")


class Held(Dataset):
    """A dataset whose samples are rows of whatever ``data`` holds."""

    def __init__(self, data, rows=16):
        self.data, self.rows = data, rows

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        return torch.full((4,), float(i))


def refused(dataset, **kw):
    """The InputError a forked loader over ``dataset`` raises (None if it
    loads)."""
    loader = nt.DataLoader(dataset, batch_size=4, num_workers=2, **kw)
    try:
        for _ in loader:
            pass
    except numapin.InputError as e:
        return str(e)
    finally:
        loader.close()
    return None


def kinds(tmp_path):
    """Each kind of memory numapin lends, as a tensor or array."""
    x = numapin.empty((16, 4), torch.float32)
    x.fill_(1)
    path = tmp_path / "m.safetensors"
    st.save_file({"w": torch.ones(16, 4)}, str(path))
    sb = numapin.SharedBuffer.create(f"hostile-fork-{os.getpid()}", 1 << 16)
    return {
        "empty": (x, "numapin.empty() or numapin.pin()"),
        "pin": (numapin.pin(torch.ones(16, 4)), "numapin.empty() or numapin.pin()"),
        "numpy": (numapin.empty((16, 4), "float32", like="numpy"), "numapin.empty() or numapin.pin()"),
        "loaded": (numapin.load_safetensors(str(path), device=None)["w"], "load_safetensors(device=None)"),
        "shared": (sb.view("float32", (16, 4)), "SharedBuffer"),
        "view": (x[3:], "numapin.empty() or numapin.pin()"),
    }, sb


def test_a_dataset_over_each_kind_of_lent_memory_is_refused_before_any_worker_forks(tmp_path):
    held, sb = kinds(tmp_path)
    for name, (t, made_by) in held.items():
        msg = refused(TensorDataset(t) if isinstance(t, torch.Tensor) else Held(t))
        assert msg is not None, name
        where = "dataset.tensors[0]" if isinstance(t, torch.Tensor) else "dataset.data"
        assert msg.startswith(f"numapin.torch.DataLoader: {where} is over pinned memory made by"), msg
        assert made_by in msg and "SIGSEGV" in msg and "fix:" in msg, msg
        assert "forkserver" in msg and "clone()" in msg, msg
        assert ("SharedBuffer.attach" in msg) == (name == "shared"), msg
    del held, t
    del sb
    gc.collect()


def test_deep_and_odd_places_are_found_and_named():
    x = numapin.empty((8,), torch.float32)

    class Slotted:
        __slots__ = ("inner",)

        def __init__(self, inner):
            self.inner = inner

    ds = Held({"a": [1, "s", Slotted({"b": (None, x)})]})
    msg = refused(ds)
    assert msg is not None and "dataset.data['a'][2].inner['b'][1] is over" in msg, msg
    # A collate function that is an object holding one (workers run it).
    class Collate:
        def __init__(self, t):
            self.t = t

        def __call__(self, batch):
            return torch.stack(batch) + self.t[0]

    msg = refused(Held(None, rows=8), collate_fn=Collate(x))
    assert msg is not None and "collate_fn.t is over" in msg, msg
    del x


def test_what_a_worker_can_read_still_loads():
    x = numapin.empty((16, 4), torch.float32)
    x.copy_(torch.arange(64.0).reshape(16, 4))
    want = [b[0].tolist() for b in torch.utils.data.DataLoader(TensorDataset(x.clone()), batch_size=4)]
    # In ordinary memory, with workers.
    assert refused(TensorDataset(x.clone())) is None
    # Without workers, the pinned tensor itself.
    loader = nt.DataLoader(TensorDataset(x), batch_size=4, num_workers=0)
    assert [b[0].tolist() for b in loader] == want
    loader.close()
    # Empty tensors over numapin memory hold no bytes a worker could read.
    e = numapin.empty((0, 4), torch.float32)
    assert refused(Held([e, 1.0, "x"])) is None
    del x, e, loader
    gc.collect()


def test_forkserver_sends_the_dataset_and_loads_it():
    # Another start method (forkserver, spawn) pickles the dataset to each worker (torch moves
    # the tensor into shared memory): no refusal, the same batches.
    code = """
import torch, numapin, numapin.torch as nt
from torch.utils.data import TensorDataset
if __name__ == "__main__":
    x = numapin.empty((16, 4), torch.float32)
    x.copy_(torch.arange(64.0).reshape(16, 4))
    for ctx in ("forkserver",):
        dl = nt.DataLoader(TensorDataset(x), batch_size=4, num_workers=2, multiprocessing_context=ctx)
        print(ctx, sorted(float(b[0].sum()) for b in dl))
        dl.close()
"""
    r = run_py(code, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["forkserver [120.0, 376.0, 632.0, 888.0]"], r.stdout


def test_torchs_own_loader_would_have_lost_the_worker():
    # What the refusal prevents: torch's DataLoader forks, the worker reads
    # the pinned rows and dies with SIGSEGV (torch reports it).
    code = """
import torch, numapin
from torch.utils.data import DataLoader, TensorDataset
x = numapin.empty((16, 4), torch.float32)
x.fill_(1)
try:
    for b in DataLoader(TensorDataset(x), batch_size=4, num_workers=1):
        pass
    print("loaded")
except RuntimeError as e:
    print("worker lost:", "exited unexpectedly" in str(e) or "Segmentation fault" in str(e))
"""
    r = run_py(code, timeout=120)
    assert r.stdout.strip() == "worker lost: True", (r.stdout, r.stderr[-2000:])
    assert "segmentation fault" in r.stderr.lower(), r.stderr[-2000:]


def test_persistent_workers_are_checked_when_they_start_and_the_check_is_quick():
    import time

    ds = Held([f"file{i}.jpg" for i in range(200_000)], rows=8)
    x = numapin.empty((4,), torch.float32)  # something lent: the walk runs
    loader = nt.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    started = time.perf_counter()
    for _ in range(2):
        assert len(list(loader)) == 2
    took = time.perf_counter() - started
    loader.close()
    # A loose floor: two epochs with two workers and the walk over 200,000
    # names (it is linear; about 0.03 s here).
    assert took < 60, took
    ds.data.append(x)
    loader = nt.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    with pytest.raises(numapin.InputError, match=r"dataset\.data\[200000\] is over"):
        iter(loader)
    loader.close()
    del x, loader
    gc.collect()

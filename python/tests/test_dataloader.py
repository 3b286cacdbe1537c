"""numapin.torch.DataLoader against torch's DataLoader: the same batches in
the same order for the same seed, errors where torch gives them, and every
slot back after an epoch ends, breaks, fails or is deleted."""

from __future__ import annotations

import collections
import gc
import os
import signal
import warnings

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import numapin.torch as nt  # noqa: E402
from conftest import run_py  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

Point = collections.namedtuple("Point", ["x", "y"])


class Mixed(Dataset):
    """Samples of every shape collate handles: tensors of several dtypes,
    numpy arrays, numbers, strings, nested dicts, lists, tuples and
    namedtuples."""

    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return {
            "image": torch.randint(0, 255, (3, 8, 8), dtype=torch.uint8, generator=g),
            "feat": torch.randn(5, generator=g, dtype=torch.float32),
            "half": torch.randn(2, 2, generator=g).to(torch.bfloat16),
            "ids": np.arange(i, i + 4, dtype=np.int64),
            "label": i % 7,
            "weight": float(i) / 3,
            "name": f"sample-{i}",
            "nested": [torch.tensor([i, -i]), (torch.tensor(i * 2.0), Point(torch.tensor(i), i + 1))],
            "rand": torch.rand(3),  # uses the worker's seeded RNG
        }


def same(a, b, path="batch"):
    """Asserts two batches are equal, bit for bit and type for type."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a.cpu().view(torch.uint8) if a.dtype == torch.bfloat16 else a.cpu(), b.cpu().view(torch.uint8) if b.dtype == torch.bfloat16 else b.cpu()), path
    elif isinstance(a, dict):
        assert type(a) is type(b) and a.keys() == b.keys(), path
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def detached(x):
    """A batch with every tensor cloned to plain CPU memory (so collecting
    batches holds no slot, as a training loop holds none)."""
    if isinstance(x, torch.Tensor):
        return x.cpu().clone()
    if isinstance(x, dict):
        return type(x)({k: detached(v) for k, v in x.items()})
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[detached(v) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(detached(v) for v in x)
    return x


def compare_epochs(ref, ours, n=1):
    """Runs `n` epochs of each loader (the global RNG seeded alike before
    each, for samples drawn in the main process) and compares them."""
    for e in range(n):
        torch.manual_seed(100 + e)
        want = [detached(b) for b in ref]
        torch.manual_seed(100 + e)
        got = [detached(b) for b in ours]
        assert len(got) == len(want) == len(ours)
        same(want, got)


CASES = {
    "in-process": dict(batch_size=4, num_workers=0),
    "workers": dict(batch_size=5, num_workers=2, shuffle=True),
    "drop_last": dict(batch_size=8, num_workers=2, drop_last=True),
    "custom collate": dict(batch_size=3, num_workers=2, collate_fn=lambda b: [s["feat"] * 2 for s in b]),
    "sampler": dict(batch_size=4, num_workers=2, sampler=list(range(30, 0, -3))),
    "batch_sampler": dict(batch_sampler=[[1, 2], [9], [4, 5, 6], [36, 0]], num_workers=2),
    "persistent": dict(batch_size=6, num_workers=2, shuffle=True, persistent_workers=True, prefetch_factor=3),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_batches_equal_torchs_for_the_same_seed(case):
    kw = CASES[case]
    ds = Mixed()
    ref = TorchLoader(ds, generator=torch.Generator().manual_seed(3), **kw)
    ours = nt.DataLoader(ds, generator=torch.Generator().manual_seed(3), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning in the ordinary case
        compare_epochs(ref, ours, 2)
    s = ours.stats()
    assert s["slotted_batches"] > 0, s
    # The pool is made from the first batch: only batches collated before
    # it was ready took torch's path.
    assert set(s["plain_batches"]) <= {"unsized"}, s
    gc.collect()
    ours.close()
    s = ours.stats()
    assert s["free"] == s["nslots"] and s["leased"] == 0, s


@pytest.mark.parametrize("case", ["in-process", "workers", "drop_last"])
def test_batches_written_by_numapins_copy_equal_torchs(case, monkeypatch, tmp_path):
    """The default collate's streaming copy (forced on for these small
    batches, which the automatic rule writes through the cache with
    torch.stack) gives torch's batches, odd sizes, bfloat16, strided samples
    (which fall back to torch.stack) and numbers included, and the workers
    really took it (their timers count writes)."""
    from numapin import _dlprofile, _slotcopy

    monkeypatch.setattr(_slotcopy, "MODE", "stream")
    monkeypatch.setattr(_dlprofile, "DIR", str(tmp_path))
    monkeypatch.setattr(_dlprofile, "ENABLED", True)

    class Odd(Mixed):
        def __getitem__(self, i):
            d = super().__getitem__(i)
            d["odd"] = torch.arange(i, i + 13, dtype=torch.int16)
            d["strided"] = torch.arange(20.0)[::2] + i
            return d

    kw = CASES[case]
    ref = TorchLoader(Odd(), generator=torch.Generator().manual_seed(3), **kw)
    ours = nt.DataLoader(Odd(), generator=torch.Generator().manual_seed(3), **kw)
    compare_epochs(ref, ours, 1)
    _dlprofile.dump(force=True)
    ours.close()
    if kw["num_workers"]:
        writes = _dlprofile.read(str(tmp_path)).get("workers", {}).get("write", [0, 0])[1]
        assert writes > 0, "no batch went through numapin's copy"


def test_cpu_batches_are_pinned_views_of_slots_that_come_back():
    ds = Mixed(24)
    dl = nt.DataLoader(ds, batch_size=4, num_workers=2, slot_bytes=1 << 20)
    it = iter(dl)
    held = [next(it) for _ in range(3)]
    assert dl.stats()["leased"] >= 3
    del held
    gc.collect()
    for b in it:
        assert b["image"].shape == (4, 3, 8, 8)
    del b  # the loop variable holds the last batch
    gc.collect()
    s = dl.stats()
    assert s["free"] == s["nslots"] and s["leased"] == 0, s
    m = dl.memory_bound()
    assert m["pinned_bytes"] == s["max_slots"] * s["slot_bytes"]
    assert m["pinned_bytes_now"] == s["nslots"] * s["slot_bytes"] <= m["pinned_bytes"]


class Failing(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 17:
            raise ValueError(f"bad record {i}")
        return torch.full((4,), i)


def test_a_worker_exception_is_raised_at_its_batch_and_slots_come_back():
    dl = nt.DataLoader(Failing(), batch_size=2, num_workers=2, slot_bytes=1 << 20)
    seen = []
    with pytest.raises(ValueError, match="bad record 17"):
        for b in dl:
            seen.append(int(b[0, 0]))
    assert seen == list(range(0, 16, 2))
    del b
    gc.collect()
    dl.close()
    s = dl.stats()
    assert s["free"] == s["nslots"], s


class Killer(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 21:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((1024,), i)


def test_a_killed_worker_is_an_error_not_a_hang_and_slots_come_back():
    dl = nt.DataLoader(Killer(), batch_size=4, num_workers=2, slot_bytes=1 << 20, timeout=60)
    with pytest.raises(RuntimeError, match="(?i)worker"):
        for b in dl:
            del b
    dl.close()
    s = dl.stats()
    assert s["free"] == s["nslots"], s


def test_breaking_out_and_deleting_give_every_slot_back():
    dl = nt.DataLoader(Mixed(64), batch_size=2, num_workers=2, slot_bytes=1 << 20)
    for i, b in enumerate(dl):
        if i == 3:
            break
    del b
    gc.collect()
    # The loop's iterator is gone: its workers stopped, every slot is back.
    s = dl.stats()
    assert s["free"] == s["nslots"] and s["leased"] == 0, s
    # The next epoch starts clean: the abandoned epoch's slots are back.
    it = iter(dl)
    next(it)
    gc.collect()
    del it
    gc.collect()
    s = dl.stats()
    assert s["free"] == s["nslots"] and s["leased"] == 0, s
    pool = dl._pool
    del dl
    gc.collect()
    assert pool.stats()["free"] == pool.stats()["nslots"]


def test_persistent_workers_keep_the_pool_across_epochs_and_after_a_break():
    ds = Mixed(30)
    kw = dict(batch_size=4, num_workers=2, shuffle=True, persistent_workers=True)
    ours = nt.DataLoader(ds, generator=torch.Generator().manual_seed(1), **kw)
    ref = TorchLoader(ds, generator=torch.Generator().manual_seed(1), **kw)
    for i, _ in enumerate(ours):
        if i == 2:
            break
    for i, _ in enumerate(ref):
        if i == 2:
            break
    compare_epochs(ref, ours)
    gc.collect()
    s = ours.stats()
    assert s["free"] == s["nslots"], s
    ours.close()


def test_a_batch_larger_than_a_slot_takes_the_ordinary_path_once_warned():
    class Growing(Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return torch.full((1000 * (1 + (i >= 8) * 3000),), i, dtype=torch.uint8)

    dl = nt.DataLoader(Growing(), batch_size=4, num_workers=0, slot_bytes=1 << 20)
    with pytest.warns(RuntimeWarning, match="larger than a slot"):
        got = list(dl)
    want = list(TorchLoader(Growing(), batch_size=4))
    same(want, got)
    assert dl.stats()["plain_batches"] == {"large": 1}
    assert [type(k) for k in dl.stats()["plain_batches"]] == [str], "the reasons are plain strings"


def test_bad_arguments_are_input_errors():
    import numapin

    with pytest.raises(numapin.InputError):
        nt.DataLoader(Mixed(), batch_size=None)
    with pytest.raises(numapin.InputError):
        nt.DataLoader(Mixed(), device="cpu")
    with pytest.raises(numapin.InputError):
        nt.DataLoader(Mixed(), slots=0)


def test_workers_that_wait_for_the_pool_put_every_first_batch_in_a_slot(monkeypatch):
    # Many batches in flight before the main process sees the first one:
    # with FIRST_BATCH_WAITS, every worker's first batch waits for the pool
    # it asked for instead of taking torch's path.
    monkeypatch.setattr(nt, "FIRST_BATCH_WAITS", True)
    ds = Mixed(48)
    kw = dict(batch_size=4, num_workers=2, prefetch_factor=4)
    ours = nt.DataLoader(ds, **kw)
    compare_epochs(TorchLoader(ds, **kw), ours)
    s = ours.stats()
    assert s["plain_batches"] == {} and s["slotted_batches"] == 12, s
    # Every batch torch keeps in flight (4 x 2) can have a slot, and copies
    # 2 more; the pool starts with 2 x 2 + 2 and grows only as far as needed.
    assert s["max_slots"] == 10 and 6 <= s["nslots"] <= 10 and s["slot_bytes"] >= 1, s
    ours.close()


class Slow(Mixed):
    """Mixed samples that take `ms` milliseconds each (a worker's batches
    keep coming while the main process makes the pool)."""

    def __init__(self, n: int, ms: float) -> None:
        super().__init__(n)
        self.ms = ms

    def __getitem__(self, i: int):
        import time

        time.sleep(self.ms / 1e3)
        return super().__getitem__(i)


def test_only_the_first_batch_takes_torchs_path_while_the_pool_is_made():
    # The default: worker 0's first batch (the first the main process
    # takes) goes torch's way while the main process makes the pool the
    # first worker asked for; the other workers wait for it, so every
    # later batch is in a slot, with many batches in flight.
    ds = Mixed(96)
    kw = dict(batch_size=4, num_workers=2, prefetch_factor=4)
    ours = nt.DataLoader(ds, **kw)
    compare_epochs(TorchLoader(ds, **kw), ours)
    s = ours.stats()
    # (CPU batches the consumer holds may find no slot free: "busy"; the
    # pool may also be ready before worker 0's first batch, asked for by
    # the other worker: then none goes torch's way.)
    assert s["plain_batches"].get("unsized", 0) <= 1, s
    assert s["slotted_batches"] + sum(s["plain_batches"].values()) == 24, s
    ours.close()


def test_workers_that_do_not_wait_go_on_and_use_the_pool_once_it_is_made(monkeypatch):
    # POOL_WAIT 0: the batches collated before the pool is made take
    # torch's path; the rest use it.
    monkeypatch.setattr(nt, "POOL_WAIT", 0.0)
    ds = Slow(96, 5.0)
    kw = dict(batch_size=4, num_workers=2, prefetch_factor=2)
    ours = nt.DataLoader(ds, **kw)
    compare_epochs(TorchLoader(ds, **kw), ours)
    s = ours.stats()
    assert s["slotted_batches"] > 0, s
    assert set(s["plain_batches"]) <= {"unsized"}, s
    assert s["slotted_batches"] + sum(s["plain_batches"].values()) == 24, s
    ours.close()


def test_a_pool_that_cannot_be_made_on_request_lets_waiting_workers_go_on():
    from numapin import _numapin

    pool = _numapin.SlotPool.create()
    pool.provision_on_request(2, register=False)
    pool.request(1 << 62)  # no memfd grows to that
    assert pool.wait_ready(30.0) is False
    err = pool.provision_error()
    assert err is not None and "slot pool" in err, err
    assert not pool.ready
    pool.close()


def test_closing_a_pool_no_worker_asked_for_stops_its_thread():
    import time

    from numapin import _numapin

    def watchers():
        tasks = f"/proc/{os.getpid()}/task"
        names = []
        for n in os.listdir(tasks):
            try:
                with open(f"{tasks}/{n}/comm") as f:
                    names.append(f.read().strip())
            except FileNotFoundError:
                pass
        return names.count("numapin-slot-po")

    pool = _numapin.SlotPool.create()
    before = watchers()
    pool.provision_on_request(2, register=False)
    # The thread names itself once it runs.
    deadline = time.monotonic() + 10
    while watchers() != before + 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert watchers() == before + 1
    t = time.monotonic()
    pool.close()
    assert time.monotonic() - t < 5
    assert pool.wait_ready(0.0) is False and pool.provision_error() is None
    assert watchers() == before


def test_the_pool_grows_when_workers_find_no_slot_free(monkeypatch):
    # The consumer holds every CPU batch it gets: workers find no slot free
    # and the pool grows (each growth its own part), up to its bound. The
    # workers wait for the pool, so that every batch takes a slot.
    monkeypatch.setattr(nt, "FIRST_BATCH_WAITS", True)
    ds = Mixed(40)
    kw = dict(batch_size=2, num_workers=2, prefetch_factor=3)
    dl = nt.DataLoader(ds, generator=torch.Generator().manual_seed(5), slot_timeout=30.0, **kw)
    it = iter(dl)
    held = [next(it) for _ in range(6)]
    s = dl.stats()
    # It started with 6 slots, all held now: the workers filling the next
    # batches make it grow to its bound (8).
    assert s["max_slots"] == 8 and s["nslots"] >= 6, s
    import time

    deadline = time.monotonic() + 20
    while dl.stats()["nslots"] < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dl.stats()["nslots"] == 8, dl.stats()
    want = [detached(b) for b in TorchLoader(ds, generator=torch.Generator().manual_seed(5), **kw)][:6]
    same(want, [detached(b) for b in held])
    assert s["plain_batches"] == {}, s
    del held
    gc.collect()
    rest = [detached(b) for b in it]  # holding no slot
    assert len(rest) == 14
    gc.collect()
    s = dl.stats()
    assert s["free"] == s["nslots"] and s["leased"] == 0, s
    dl.close()


def test_a_collate_reaches_the_pool_made_in_its_process_and_attaches_anywhere_else():
    # The pool itself where it was made (num_workers=0 collates there), by
    # its path when pickled for a spawned worker, attached afresh in a
    # forked one (never the copy it inherited) and once the pool is closed.
    r = run_py(
        """
        import os, pickle, numapin
        from numapin._loader_worker import NoPool, PoolRef
        pool = numapin._numapin.SlotPool.create()
        ref = PoolRef(pool)
        assert ref.get() is pool
        sent = pickle.loads(pickle.dumps(ref))
        assert sent.path == pool.path
        got = sent.get()
        assert got is not pool and type(got) is type(pool), (got, pool)
        pid = os.fork()
        if pid == 0:
            got = ref.get()
            os._exit(0 if got is not pool and type(got) is type(pool) else 3)
        assert os.waitpid(pid, 0)[1] == 0, "a forked child used the pool it inherited"
        ref.forget()
        assert ref.get() is not pool
        assert isinstance(PoolRef(NoPool("none")).get(), NoPool)
        pool.close()
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok"], r.stdout


def test_the_module_s_tunables_apply_to_loaders_made_after_they_are_set(monkeypatch):
    # numapin.torch.POOL_WAIT = 0: no worker waits for the pool, so every
    # batch collated before it is ready takes torch's path ("unsized").
    monkeypatch.setattr(nt, "POOL_WAIT", 0.0)
    monkeypatch.setattr(nt, "FIRST_BATCH_WAITS", True)
    dl = nt.DataLoader(Mixed(8), batch_size=2, num_workers=1)
    assert dl._collate.wait == 0.0 and dl._collate.first_waits
    dl.close()

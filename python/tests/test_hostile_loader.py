"""numapin.torch.DataLoader under hostile use, against torch's DataLoader on
the same seed: failing datasets and workers, odd samples, custom collates
and samplers, iterable datasets, killed workers, early breaks, several
loaders and iterators, multiprocessing contexts, few descriptors, wrong
arguments. After each case nothing numapin made is left: no pinned bytes,
memfd, /dev/shm file or child process (the `nothing_left` fixture)."""

from __future__ import annotations

import gc
import os
import signal
import warnings

import pytest

from conftest import children, run_py, requires

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import numapin  # noqa: E402
import numapin.torch as nt  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402
from torch.utils.data import Dataset, IterableDataset, get_worker_info  # noqa: E402

pytestmark = pytest.mark.usefixtures("nothing_left")


def plain(x):
    """A batch as plain Python/CPU values, for comparing."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.is_quantized:
            return ("q", str(x.dtype), plain(x.int_repr()))
        if x.layout != torch.strided:
            return ("sparse", str(x.layout), plain(x.to_dense()))
        if x.dtype in (torch.bfloat16, torch.float16) or "float8" in str(x.dtype) or x.dtype == torch.complex32:
            return ("t", str(x.dtype), tuple(x.shape), x.contiguous().view(torch.uint8).flatten().tolist())
        return ("t", str(x.dtype), tuple(x.shape), x.tolist())
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [plain(v) for v in x])
    return x


def epochs(loader_cls, dataset, n=1, quiet=True, **kw):
    kw.setdefault("generator", torch.Generator().manual_seed(7))
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", RuntimeWarning)
        loader = loader_cls(dataset, **kw)
        out = [[plain(b) for b in loader] for _ in range(n)]
    if isinstance(loader, nt.DataLoader):
        loader.close()
    del loader
    gc.collect()
    return out


def both(dataset, **kw):
    """Same batches from both loaders (or the same exception type and the
    user's message in both)."""
    def run(cls):
        try:
            return epochs(cls, dataset, **kw), None
        except Exception as e:  # noqa: BLE001
            # The traceback holds the loaders' frames (and so the workers).
            e.__traceback__ = e.__context__ = e.__cause__ = None
            return None, e

    want, werr = run(TorchLoader)
    got, gerr = run(nt.DataLoader)
    if werr is not None:
        assert gerr is not None and type(gerr) is type(werr), (werr, gerr)
        return werr, gerr
    assert gerr is None, gerr
    assert got == want
    return want, got


class Seq(Dataset):
    def __init__(self, n=12, f=None):
        self.n, self.f = n, f

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.f(i) if self.f else torch.full((3,), float(i))


def _raise_at_5(i):
    if i == 5:
        raise KeyError(f"no sample {i}")
    return torch.tensor([i])


@pytest.mark.parametrize("workers", [0, 2])
def test_getitem_that_raises_gives_the_workers_traceback_as_torch(workers):
    werr, gerr = both(Seq(f=_raise_at_5), batch_size=2, num_workers=workers)
    assert "no sample 5" in str(gerr)
    if workers:
        assert "Caught KeyError in DataLoader worker process" in str(gerr)
        assert "Original Traceback" in str(gerr) and "_raise_at_5" in str(gerr)


def _varying(i):
    return torch.ones(i % 3 + 1)


def _strings(i):
    return {"name": f"s{i}", "none": None, "x": torch.tensor(i), "b": b"x" * i}


class Opaque:
    def __init__(self, i):
        self.i = i


def _opaque(i):
    return Opaque(i)


def _numpy_mix(i):
    return np.arange(i, i + 3, dtype=">f4"), np.float16(i), np.bool_(i % 2), np.int8(-i)


def _requires_grad(i):
    return torch.full((2,), float(i), requires_grad=True)


def _noncontig(i):
    return torch.arange(12.0).reshape(3, 4).t()[:, i % 3]


def _zero_size(i):
    return torch.empty(0, 4), torch.tensor([])


DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.uint16,
          torch.uint32, torch.uint64, torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2]


def _all_dtypes(i):
    return {str(d): torch.ones(2).mul(i).to(d) if not d.is_complex else torch.ones(2, dtype=d) for d in DTYPES}


@pytest.mark.parametrize("f", [_varying, _strings, _opaque, _numpy_mix, _requires_grad, _noncontig, _zero_size,
                               _all_dtypes])
@pytest.mark.parametrize("workers", [0, 2])
def test_odd_samples_give_torchs_batches_or_its_error(f, workers):
    if f is _requires_grad and workers:
        # torch's workers refuse samples that require grad (a stack with
        # out=); numapin's give the values, as torch's main process does.
        msg = None
        try:
            epochs(TorchLoader, Seq(n=9, f=f), batch_size=3, num_workers=workers, shuffle=True)
        except RuntimeError as e:
            msg = str(e)
            # The traceback holds torch's iterator (and so its workers).
            e.__traceback__ = e.__context__ = e.__cause__ = None
        gc.collect()
        assert msg is not None and "automatic differentiation" in msg, msg
        want = epochs(TorchLoader, Seq(n=9, f=f), batch_size=3, num_workers=0, shuffle=True)
        assert epochs(nt.DataLoader, Seq(n=9, f=f), batch_size=3, num_workers=workers, shuffle=True) == want
        return
    both(Seq(n=9, f=f), batch_size=3, num_workers=workers, shuffle=True)


def test_batches_larger_than_a_slot_come_whole():
    with pytest.warns(RuntimeWarning, match="larger than a slot"):
        want = epochs(TorchLoader, Seq(n=8, f=lambda i: torch.full((i * 200_000 + 1,), i)), batch_size=1)
        got = epochs(nt.DataLoader, Seq(n=8, f=lambda i: torch.full((i * 200_000 + 1,), i)), batch_size=1,
                     slot_bytes=1024, quiet=False)
    assert got == want


def _collate_odd(batch):
    t = torch.stack(batch)
    return {"t": t.t(), "n": len(batch), "s": "x", "g": (t * 2).requires_grad_(), "q": None,
            "sparse_free": [t[0], t.to(torch.bfloat16)], "set": {1, 2}}


def _collate_quantized(batch):
    return torch.quantize_per_tensor(torch.stack(batch), 0.5, 0, torch.qint8), torch.stack(batch).to_sparse()


class PairSampler:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter([[i, i + 1] for i in range(0, self.n - 1, 2)] + [[0], []])

    def __len__(self):
        return self.n // 2 + 2


@pytest.mark.parametrize("workers", [0, 2])
def test_custom_collate_and_batch_sampler(workers):
    both(Seq(), batch_size=4, num_workers=workers, collate_fn=_collate_odd)
    both(Seq(), batch_size=4, num_workers=workers, collate_fn=_collate_quantized)
    both(Seq(), batch_sampler=PairSampler(12), num_workers=workers, generator=None)
    both(Seq(), batch_sampler=[[3, 1], [2]], num_workers=workers, generator=None)


class Stream(IterableDataset):
    def __init__(self, n, shard):
        self.n, self.shard = n, shard

    def __iter__(self):
        info = get_worker_info()
        if self.shard and info is not None:
            return iter(torch.tensor([i]) for i in range(info.id, self.n, info.num_workers))
        return iter(torch.tensor([i]) for i in range(self.n))


@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_datasets_with_and_without_sharding(shard, workers):
    both(Stream(11, shard), batch_size=3, num_workers=workers, generator=None, n=2)


def _init_raises(worker_id):
    raise OSError(f"worker {worker_id} cannot start")


def test_worker_init_fn_that_raises_as_torch():
    werr, gerr = both(Seq(), batch_size=2, num_workers=2, worker_init_fn=_init_raises)
    assert "cannot start" in str(gerr)


def test_a_worker_killed_mid_epoch_is_an_error_not_a_hang():
    loader = nt.DataLoader(Seq(n=400), batch_size=2, num_workers=2, timeout=30)
    it = iter(loader)
    next(it)
    pids = [w.pid for w in it.it._workers]
    assert pids
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="(?i)worker"):
        for _ in it:
            pass
    del it
    loader.close()
    del loader


def test_early_break_reiteration_and_deletion_mid_epoch():
    loader = nt.DataLoader(Seq(n=40), batch_size=2, num_workers=2)
    for epoch in range(3):
        for k, b in enumerate(loader):
            if k == epoch + 1:
                break
        del b
    want = epochs(TorchLoader, Seq(n=40), batch_size=2, num_workers=2, generator=None)
    assert [[plain(b) for b in loader]] == want
    it = iter(loader)
    next(it)
    del loader  # the iterator keeps the loader; dropping both ends the epoch
    del it
    gc.collect()


def test_persistent_workers_break_and_reiterate():
    loader = nt.DataLoader(Seq(n=40), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in range(3):
        for k, _b in enumerate(loader):
            if k == 2:
                break
    assert len([b for b in loader]) == 20
    loader.close()


def test_several_loaders_at_once():
    loaders = [nt.DataLoader(Seq(n=10, f=lambda i, j=j: torch.tensor([i, j])), batch_size=2, num_workers=1)
               for j in range(3)]
    its = [iter(x) for x in loaders]
    got = [[plain(next(it)) for it in its] for _ in range(5)]
    for j in range(3):
        assert [g[j] for g in got] == [plain(torch.tensor([[2 * k, j], [2 * k + 1, j]])) for k in range(5)]
    del its
    for x in loaders:
        x.close()


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_two_iterators_of_one_loader_alive_at_once_as_torch(workers, persistent):
    if persistent and workers == 0:
        pytest.skip("persistent workers need workers")

    def run(cls):
        loader = cls(Seq(n=8), batch_size=2, num_workers=workers, persistent_workers=persistent)
        a = iter(loader)
        out = [("a", plain(next(a)))]
        b = iter(loader)
        try:
            for _ in range(6):
                for name, it in (("b", b), ("a", a)):
                    out.append((name, plain(next(it, "END"))))
        except Exception as e:  # noqa: BLE001
            out.append(("error", type(e).__name__))
        del a, b
        if isinstance(loader, nt.DataLoader):
            loader.close()
        return out

    assert run(nt.DataLoader) == run(TorchLoader)


def test_multiprocessing_contexts():
    # In a child interpreter: spawn and forkserver leave multiprocessing's
    # own helpers (the resource tracker, the fork server) running.
    code = """
import os, gc, torch, numapin, numapin.torch as nt
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(12.0).reshape(6, 2))
for ctx in ("fork", "spawn", "forkserver"):
    want = [b[0].tolist() for b in DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context=ctx)]
    dl = nt.DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context=ctx)
    got = [b[0].tolist() for b in dl]
    dl.close(); del dl; gc.collect()
    print(ctx, got == want)
def link(f):
    try:
        return os.readlink(f"/proc/self/fd/{f}")
    except OSError:
        return ""
fds = [link(f) for f in os.listdir("/proc/self/fd")]
print("slots", sum("numapin-slots" in f for f in fds), "pinned", sum(s["bytes_in_use"] for s in numapin.stats()))
"""
    r = run_py(code, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:4] == ["fork True", "spawn True", "forkserver True", "slots 0 pinned 0"], r.stdout


def test_few_file_descriptors_eight_workers():
    code = """
import resource, torch, numapin.torch as nt
from torch.utils.data import DataLoader, TensorDataset
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
ds = TensorDataset(torch.arange(64.0).reshape(32, 2))
def run(cls):
    try:
        # numapin's batches are pinned (registered with CUDA where torch
        # sees a device): against torch's pin_memory=True there.
        pin = {"pin_memory": torch.cuda.is_available()} if cls is DataLoader else {}
        return [b[0].sum().item() for b in cls(ds, batch_size=2, num_workers=8, **pin)]
    except Exception as e:
        return type(e).__name__ + ": " + str(e).splitlines()[0]
t = run(DataLoader); n = run(nt.DataLoader)
print("torch", t if isinstance(t, str) else len(t))
print("numapin", n if isinstance(n, str) else len(n))
print("same", t == n or isinstance(t, str))
if isinstance(n, str): print(n)
"""
    r = run_py(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "same True" in r.stdout, r.stdout


TORCH_ARGS = [
    {"num_workers": -1}, {"batch_size": 0}, {"batch_size": -2}, {"timeout": -1}, {"prefetch_factor": 2},
    {"num_workers": 2, "prefetch_factor": 0}, {"shuffle": True, "sampler": [0, 1]},
    {"batch_sampler": [[0]], "batch_size": 3}, {"num_workers": 1, "multiprocessing_context": "bogus"},
    {"persistent_workers": True}, {"batch_sampler": [[0]], "drop_last": True},
]


@pytest.mark.parametrize("kw", TORCH_ARGS)
def test_wrong_torch_arguments_fail_as_torchs_and_leave_nothing(kw):
    try:
        TorchLoader(Seq(), **kw)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            nt.DataLoader(Seq(), **kw)
    else:
        nt.DataLoader(Seq(), **kw).close()
    gc.collect()


@pytest.mark.parametrize("kw, exc", [
    ({"slots": 0}, numapin.InputError), ({"slots": 10**6}, numapin.InputError),
    ({"slot_bytes": 0}, numapin.InputError), ({"slot_bytes": -5}, numapin.InputError),
    ({"slot_bytes": 2**70}, numapin.InputError), ({"slot_bytes": 1 << 46}, numapin.BudgetError),
    ({"slot_timeout": -1}, numapin.InputError), ({"slot_timeout": float("nan")}, numapin.InputError),
    ({"device": "cpu"}, numapin.InputError), ({"device": "nonsense"}, numapin.InputError),
    ({"device": 3.5}, TypeError), ({"batch_size": None}, numapin.InputError), ({"slots": "4"}, TypeError),
    ({"slot_bytes": True}, TypeError), ({"num_workers": 2, "slots": 1}, None),
])
def test_wrong_numapin_arguments_fail_and_leave_nothing(kw, exc):
    if exc is None:
        dl = nt.DataLoader(Seq(), **kw)
        assert len([b for b in dl]) == 12
        dl.close()
        return
    with pytest.raises(exc) as info:
        nt.DataLoader(Seq(), **kw)
    assert "fix:" in str(info.value)
    gc.collect()


def test_a_failure_after_the_pool_is_made_leaves_nothing(monkeypatch):
    def boom(self):
        raise numapin.InputError("no CPUs\n  fix: test")

    monkeypatch.setattr(nt.DataLoader, "_worker_cpus", boom)
    with pytest.raises(numapin.InputError):
        nt.DataLoader(Seq(), num_workers=2)
    gc.collect()


def test_device_cuda_without_a_gpu_gives_pinned_cpu_batches_with_a_warning():
    if torch.cuda.is_available():
        pytest.skip("runs only where torch sees no device (the fallback it tests)")
    with pytest.warns(RuntimeWarning, match="(?i)no CUDA"):
        loader = nt.DataLoader(Seq(n=4), batch_size=2, device="cuda")
    got = [b for b in loader]
    assert [plain(b) for b in got] == epochs(TorchLoader, Seq(n=4), batch_size=2, generator=None)[0]
    assert all(b.device.type == "cpu" for b in got)
    del got
    loader.close()


def _no_memfd(*args, **kwargs):
    raise numapin.LimitError("memfd_create: Too many open files (os error 24)\n  fix: raise ulimit -n")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pool_that_cannot_be_made_gives_torchs_batches_with_a_warning(monkeypatch, workers):
    # No descriptor left for the pool's memfd: torch's path, said once.
    monkeypatch.setattr(nt._numapin.SlotPool, "create", staticmethod(_no_memfd))
    with pytest.warns(RuntimeWarning, match="slot pool could not be made .*Too many open files"):
        loader = nt.DataLoader(Seq(n=16), batch_size=4, num_workers=workers)
    got = [plain(b) for b in loader]
    assert got == epochs(TorchLoader, Seq(n=16), batch_size=4, num_workers=workers, generator=None)[0]
    s = loader.stats()
    assert s["plain_batches"] == {"unmapped": 4} and s["nslots"] == 0, s
    loader.close()


def test_workers_that_cannot_map_the_pool_send_torchs_batches(monkeypatch):
    # Forked workers inherit the failing attach: each batch goes torch's
    # way, with one warning in the main process; the pool itself is fine.
    monkeypatch.setattr(nt._numapin.SlotPool, "attach", staticmethod(_no_memfd))
    loader = nt.DataLoader(Seq(n=16), batch_size=4, num_workers=2, multiprocessing_context="fork")
    with pytest.warns(RuntimeWarning, match="a worker could not map the slot pool"):
        got = [plain(b) for b in loader]
    assert got == epochs(TorchLoader, Seq(n=16), batch_size=4, num_workers=2, generator=None)[0]
    assert loader.stats()["plain_batches"] == {"unmapped": 4}, loader.stats()
    loader.close()


def test_no_child_is_left_after_the_loaders_above():
    assert children() == []


FEW_FDS = """
import os, resource, warnings, torch, numapin.torch as nt
from torch.utils.data import DataLoader, TensorDataset
warnings.simplefilter("ignore", RuntimeWarning)
ds = TensorDataset(torch.arange(64.0).reshape(32, 2))

def attempt(which, limit):
    # In a forked child: a loader that fails at its limit may leave
    # descriptors behind (torch's does), which would count against the next.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        try:
            if which == "numapin":
                dl = nt.DataLoader(ds, batch_size=2, num_workers=2, timeout=20)
            else:
                # numapin's batches are pinned (registered with CUDA where
                # torch sees a device): against torch's pin_memory=True there.
                dl = DataLoader(ds, batch_size=2, num_workers=2, timeout=20, pin_memory=torch.cuda.is_available())
            out = repr([b[0].sum().item() for b in dl])
        except Exception as e:
            out = type(e).__name__ + ": " + str(e).replace(chr(10), " | ")
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while (c := os.read(r, 65536)):
        chunks.append(c)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()

ok = lambda got: got.startswith("[")
lo, hi = 8, 64
want = attempt("torch", hi)
assert ok(want), want
while hi - lo > 1:
    mid = (lo + hi) // 2
    got = attempt("torch", mid)
    if ok(got):
        hi, want = mid, got
    else:
        lo = mid
print("torch works at", hi)
print("numapin 3 above", attempt("numapin", hi + 3) == want)
print("numapin at 8", attempt("numapin", 8))
"""


def test_at_the_fewest_descriptors_torchs_loader_needs_numapins_works_too():
    # Find the fewest descriptors (RLIMIT_NOFILE) torch's loader (2
    # workers) works with; 3 above that, numapin's gives the same batches
    # (its pool and stats files take 2 more in the main process, 3 in each
    # worker: docs/python.md), never an error; far below, a
    # numapin.LimitError naming ulimit -n (torch's raises OSError or
    # RuntimeError there). The fallbacks at the very edge (no pool made, or
    # not mapped) are tested deterministically above.
    r = run_py(FEW_FDS, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[1] == "numapin 3 above True", r.stdout
    assert lines[2].startswith("numapin at 8 LimitError: ") and "ulimit -n" in lines[2], r.stdout


LITTLE_ADDRESS_SPACE = """
import os, resource, warnings, torch, numapin, numapin.torch as nt
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(64 * 8 * 1024.0).reshape(64, 8 * 1024))
want = [float(b[0].sum()) for b in DataLoader(ds, batch_size=8)]

LIMIT, FIELD, FLAG, MARGINS = {args}

def limit(margin):
    # The limit `margin` MiB above what it counts now (every mapping for
    # RLIMIT_AS, private writable ones for RLIMIT_DATA); returns the old.
    vm = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith(FIELD))
    old = resource.getrlimit(getattr(resource, LIMIT))
    resource.setrlimit(getattr(resource, LIMIT), (vm + (margin << 20), old[1]))
    return old

def children():
    me, out = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(l.split()[1:] == [me] for l in open(f"/proc/{pid}/status") if l.startswith("PPid:")):
                out.add(pid)
        except OSError:
            pass
    return out

def said(e):
    return "LimitError" if f"ulimit {FLAG}" in str(e) and LIMIT in str(e) else "LimitError without the fix: " + str(e)

# numapin's first use (its runtime, a 256 MiB region) under the limit, then
# with the limit lifted.
old = limit(8)
try:
    numapin.empty((1024,), "float32", like="numpy")
    print("runtime|made")
except numapin.LimitError as e:
    print("runtime|" + said(e))
except BaseException as e:
    print("runtime|" + type(e).__name__ + ": " + str(e).splitlines()[0][:200])
finally:
    resource.setrlimit(getattr(resource, LIMIT), old)
print("after|" + str(numapin.empty((1024,), "float32", like="numpy").shape))

def attempt(kind, margin, workers):
    before = children()
    old = limit(margin)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "torch":
                dl = DataLoader(ds, batch_size=8, num_workers=workers)
            else:
                dl = nt.DataLoader(ds, batch_size=8, num_workers=workers)
            got = [float(b[0].sum()) for b in dl]
            if kind != "torch":
                dl.close()
            del dl
        return "same" if got == want else "WRONG"
    except numapin.LimitError as e:
        return said(e)
    except BaseException as e:
        return type(e).__name__ + ": " + str(e).splitlines()[0][:120]
    finally:
        resource.setrlimit(getattr(resource, LIMIT), old)
        # What numapin's attempt started it has stopped and waited for.
        if kind != "torch" and children() - before:
            print("left|" + " ".join(sorted(children() - before)))

for workers in (2, 0):
    for margin in MARGINS:
        print(workers, margin, attempt("torch", margin, workers), attempt("numapin", margin, workers), sep="|")
"""


def test_under_little_address_space_numapins_loader_works_where_torchs_does_or_says_which_limit():
    # RLIMIT_AS a few MiB above what the process maps: where torch's loader
    # delivers its batches, numapin's does too (its slots or, where they
    # cannot be made, torch's path); where it cannot (a worker's queue
    # thread refused: torch raises OSError or RuntimeError), numapin's raises
    # a LimitError naming the limit and ulimit -v (-d), with the workers
    # torch started stopped and waited for. numapin's own first use (its
    # runtime) under the limit is a LimitError too, and works once it is
    # lifted. (RLIMIT_DATA is not tried with workers: there, a thread whose
    # stack comes from glibc's cache starts and then fails its first
    # allocation, and CPython's Thread.start() waits for it forever, in
    # torch's loader and numapin's alike.)
    args = ("RLIMIT_AS", "VmSize:", "-v", (0, 8, 256))
    r = run_py(LITTLE_ADDRESS_SPACE.replace("{args}", repr(args)), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[:2] == ["runtime|LimitError", "after|(1024,)"], r.stdout
    rows = [line.split("|") for line in lines[2:]]
    assert len(rows) == 6 and all(len(row) == 4 for row in rows), r.stdout
    for workers, margin, theirs, ours in rows:
        assert ours in ("same", "LimitError"), r.stdout
        if workers == "0" and theirs == "same":
            assert ours == "same", r.stdout
    # With (almost) no room, two workers' queues cannot start for either.
    assert rows[0][2] != "same" and rows[0][3] == "LimitError", r.stdout
    # Well above the edge both load.
    assert rows[2][2:] == ["same", "same"] and rows[5][2:] == ["same", "same"], r.stdout


def test_under_a_data_limit_the_pool_is_not_made_and_says_so_or_batches_take_torchs_path():
    # RLIMIT_DATA 8 MiB above what the process holds: less than a slot pool
    # needs (its thread's stack and thread-local data would abort the
    # process in glibc). With slot_bytes asked for, a LimitError naming the
    # limit and ulimit -d, before any thread starts; without, one warning
    # and torch's path, batch for batch.
    r = run_py("""
        import resource, warnings, torch, numapin, numapin.torch as nt
        from torch.utils.data import DataLoader, TensorDataset
        ds = TensorDataset(torch.arange(64 * 1024.0).reshape(64, 1024))
        want = [float(b[0].sum()) for b in DataLoader(ds, batch_size=8)]
        data = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmData:"))
        resource.setrlimit(resource.RLIMIT_DATA, (data + (8 << 20), resource.RLIM_INFINITY))
        try:
            nt.DataLoader(ds, batch_size=8, slot_bytes=1 << 20)
            print("made")
        except numapin.LimitError as e:
            print("LimitError" if "RLIMIT_DATA" in str(e) and "ulimit -d" in str(e) else str(e))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            dl = nt.DataLoader(ds, batch_size=8)
            got = [float(b[0].sum()) for b in dl]
            dl.close()
        print("same" if got == want else "WRONG")
        print(sum("the slot pool could not be made (RLIMIT_DATA" in str(x.message) for x in w))
    """, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["LimitError", "same", "1"], r.stdout + r.stderr[-2000:]


@requires("tool", "prlimit setpriv")
def test_a_64k_memlock_limit_gives_torchs_batches_with_a_warning():
    # Without CAP_IPC_LOCK, with the 64 KiB limit many containers set and
    # no CUDA: nothing can be pinned. Torch's loader works; numapin's gives
    # the same batches on torch's path and says why once.
    code = """
import warnings, torch, numapin, numapin.torch as nt
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(512.0).reshape(64, 8))
t = [b[0].tolist() for b in DataLoader(ds, batch_size=4, num_workers=2)]
for workers in (0, 2):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        dl = nt.DataLoader(ds, batch_size=4, num_workers=workers)
        n = [b[0].tolist() for b in dl]
        dl.close()
    why = [str(x.message) for x in w if "ordinary path" in str(x.message)]
    print(workers, "same", n == t, "warned", len(why) >= 1, "memlock" in " ".join(why).lower())
print("pinned", sum(s["bytes_in_use"] for s in numapin.stats()))
"""
    prefix = ["prlimit", "--memlock=65536:65536", "setpriv", "--bounding-set", "-ipc_lock",
              "--inh-caps", "-ipc_lock"]
    r = run_py(code, prefix=prefix, env={"NUMAPIN_NO_CUDA": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [
        "0 same True warned True True", "2 same True warned True True", "pinned 0"], r.stdout

"""``numapin.torch.DataLoader``: torch's DataLoader, with workers that write
each batch straight into pinned memory on the GPU's NUMA node.

It takes torch's arguments (``dataset``, ``batch_size``, ``shuffle``,
``sampler``, ``batch_sampler``, ``num_workers``, ``collate_fn``,
``drop_last``, ``timeout``, ``worker_init_fn``, ``multiprocessing_context``,
``generator``, ``prefetch_factor``, ``persistent_workers``) plus ``device``:
a CUDA device (batches arrive on it) or ``None`` (pinned CPU batches), and
the pool's ``slot_bytes`` (default: the first batch's bytes plus an eighth),
``slots`` (default ``prefetch_factor * num_workers + 4``: the batches torch
keeps in flight, and copies; with workers the pool starts with
``2 * num_workers + 2`` of them and grows when a worker finds none free),
``keep_worker_heap`` (default
true: workers keep freed memory for their next samples instead of faulting
in fresh pages every batch) and
``slot_timeout`` (how long a worker waits for a free slot before the batch
takes torch's path; default 5 s for a device, 50 ms for CPU batches, whose
consumer may hold them all). It
yields the same batches, in the same order for the same seed, as
``torch.utils.data.DataLoader`` with the same arguments: it *is* one inside,
with its samplers, worker seeding, ordering and error handling; only the
data's path changes:

* a pool of slots in shared memory (one memfd) on the device's node, faulted
  in once and registered with CUDA in the main process; workers start bound
  to the device's local CPUs and attach to the pool;
* a worker stacks the batch straight into a free slot (the default collate),
  or copies a user ``collate_fn``'s result into one; only a small descriptor
  (slot, offsets, shapes, dtypes, the nested structure) crosses the queue;
* the main process copies the used part of the slot to the device on a side
  stream, hands out CUDA tensors the consumer's current stream waits on (an
  event; the host does not wait), frees the slot once the copy has
  completed, and lets torch's caching allocator reuse the device memory
  stream-ordered (``record_stream``).

Sizing: unless ``slot_bytes`` is given, the first worker to collate asks
for slots of its batch's size plus an eighth, and the main process makes
the pool on a thread of its own. The first batch (worker 0's first) takes
torch's ordinary path meanwhile, so it arrives as soon as torch's would;
the other workers wait for the pool (up to ``POOL_WAIT`` seconds), so the
batches after it are in slots (with ``num_workers=0`` the main process
makes the pool from its first batch). A
batch larger than a slot takes torch's ordinary path, with one warning.
Memory held: ``memory_bound()``.
"""

from __future__ import annotations

import collections
import errno
import os
import resource
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader as _TorchLoader
from torch.utils.data._utils.collate import collate as _torch_collate
from torch.utils.data._utils.collate import default_collate, default_collate_fn_map

import numapin
from numapin import _dlprofile, _numapin, _slotcopy

__all__ = ["DataLoader"]

#: Offsets of tensors in a slot are multiples of this (DMA- and cache-friendly).
ALIGN = 512
#: Slot size headroom over the first batch's bytes (later batches larger
#: than a slot take torch's path, with a warning that says to give
#: ``slot_bytes``).
HEADROOM = 1.125
#: Seconds a worker waits for the main process to provision the pool it
#: asked for (a few hundred ms per GiB of slots) before its batch takes
#: torch's path. 0: never wait (every batch collated before the pool is
#: ready takes torch's path: with many workers, most of a short run).
POOL_WAIT = 60.0
#: Whether the first batch (worker 0's first) waits for the pool too. False:
#: it takes torch's path while the pool is made, so it arrives as soon as
#: torch's would (docs/BENCHMARKS.md, "first batch"); the others wait.
FIRST_BATCH_WAITS = False

# Pools made in this process, by path, with the pid that made them
# (num_workers=0 collates in the main process, which keeps its own mapping;
# a forked worker attaches afresh instead of using the copy it inherited,
# whose locks another thread of the parent may have held at the fork).
_MAIN_POOLS: dict[str, tuple[int, Any]] = {}


class _NoRoom(Exception):
    """The batch does not fit its slot."""


class _Foreign(_NoRoom):
    """The batch holds a tensor a slot cannot: sparse, quantized, or of a
    dtype numapin does not hand out (it takes torch's path, unwarned)."""


_SLOT_DTYPES = frozenset(_numapin.dtypes())


def _slottable(t: torch.Tensor) -> bool:
    """Whether tensor ``t`` can be written into a slot and rebuilt from it."""
    return (
        t.layout == torch.strided
        and not t.is_quantized
        and t.device.type == "cpu"
        and _dtype_name(t.dtype) in _SLOT_DTYPES
    )


class _Leaf:
    """Where one tensor of a batch lies in its slot."""

    __slots__ = ("offset", "nbytes", "dtype", "shape")

    def __init__(self, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...]) -> None:
        self.offset, self.nbytes, self.dtype, self.shape = offset, nbytes, dtype, shape


class _SlotBatch:
    """A batch written into slot ``slot``: the nested structure with
    :class:`_Leaf` where its tensors were."""

    __slots__ = ("slot", "used", "tree")

    def __init__(self, slot: int, used: int, tree: Any) -> None:
        self.slot, self.used, self.tree = slot, used, tree


class _Plain:
    """A batch that took torch's ordinary path, and why: ``"unsized"``
    before the pool exists, ``"large"`` (more than a slot), ``"busy"`` (no
    slot came free in time), ``"foreign"`` (tensors a slot cannot hold:
    sparse, quantized), ``"unmapped"`` (no pool could be made or mapped)."""

    __slots__ = ("data", "why", "nbytes")

    def __init__(self, data: Any, why: str, nbytes: int) -> None:
        self.data, self.why, self.nbytes = data, why, nbytes


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_bytes(tree: Any) -> int:
    """Bytes the tensors of a batch take in a slot (aligned)."""
    total = 0

    def visit(x: Any) -> None:
        nonlocal total
        if isinstance(x, torch.Tensor):
            total += -(-x.numel() * x.element_size() // ALIGN) * ALIGN
        elif isinstance(x, Mapping):
            for v in x.values():
                visit(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v)

    visit(tree)
    return total


def _rebuild(x: Any, items: list[Any]) -> Any:
    """``x``'s container type with ``items`` (dicts keep their type when it
    can be built from a dict; namedtuples are rebuilt field by field)."""
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*items)
    if isinstance(x, tuple):
        return tuple(items)
    return list(items)


def _map(x: Any, f: Callable[[Any], Any]) -> Any:
    """Applies ``f`` to every leaf of a nested batch, keeping its structure."""
    if isinstance(x, (torch.Tensor, _Leaf)):
        return f(x)
    if isinstance(x, Mapping):
        out = {k: _map(v, f) for k, v in x.items()}
        try:
            return type(x)(out)
        except TypeError:
            return out
    if isinstance(x, (list, tuple)):
        return _rebuild(x, [_map(v, f) for v in x])
    return x


class _Writer:
    """Places tensors one after another in a slot (in a worker)."""

    def __init__(self, pool: Any, slot: int) -> None:
        self.pool, self.slot, self.used = pool, slot, 0
        self.size = pool.slot_bytes

    def place(self, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, _Leaf]:
        if _dtype_name(dtype) not in _SLOT_DTYPES:
            raise _Foreign
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        if self.used + nbytes > self.size:
            raise _NoRoom
        leaf = _Leaf(self.used, nbytes, _dtype_name(dtype), tuple(shape))
        view = torch.from_dlpack(self.pool.view(self.slot, self.used, nbytes, leaf.dtype, list(shape)))
        self.used += -(-nbytes // ALIGN) * ALIGN
        return view, leaf

    def copy(self, t: torch.Tensor) -> _Leaf:
        if not _slottable(t):
            raise _Foreign
        view, leaf = self.place(t.dtype, tuple(t.shape))
        with torch.no_grad():
            view.copy_(t.resolve_conj().resolve_neg())
        return leaf


def _estimate(samples: list[Any]) -> int:
    """Bytes a default-collated batch of ``samples`` takes in a slot, at
    most: each sample's tensors (aligned) and numbers (8 bytes), and one
    alignment per leaf of a sample."""
    numbers = 0
    leaves = 0

    def visit(x: Any, first: bool) -> None:
        nonlocal numbers, leaves
        if isinstance(x, (bool, int, float)):
            numbers += 1
            leaves += first
        elif isinstance(x, torch.Tensor):
            leaves += first
        elif isinstance(x, Mapping):
            for v in x.values():
                visit(v, first)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v, first)

    for i, x in enumerate(samples):
        visit(x, i == 0)
    return _tensor_bytes(samples) + 8 * numbers + ALIGN * leaves


def _worker_id() -> int:
    """This DataLoader worker's id (0 outside a worker)."""
    info = torch.utils.data.get_worker_info()
    return 0 if info is None else info.id


class _SlotCollate:
    """The collate function the workers run: collates into a slot and
    returns a :class:`_SlotBatch` (or a :class:`_Plain` batch).

    ``wait``: seconds a worker that finds the pool not provisioned yet
    waits for it, after asking for slots of its batch's size (the main
    process provisions on request); 0 to send the batch down torch's path
    at once (the main process then sizes the pool by it). ``first_waits``:
    whether worker 0's first batch (the first the main process takes) waits
    too; when not, it takes torch's path while the pool is made."""

    def __init__(
        self,
        path: str,
        user: Callable[[list[Any]], Any] | None,
        timeout: float,
        wait: float = 0.0,
        ask: bool = False,
        first_waits: bool = True,
    ) -> None:
        self.path, self.user, self.timeout, self.wait, self.ask = path, user, timeout, wait, ask
        self.first_waits = first_waits
        self._called = False
        self._pool: Any = None
        # num_workers=0: collate runs in the main process, which sizes and
        # makes the pool itself from the first batch.
        self.provision_here: Callable[[int], None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "user": self.user,
            "timeout": self.timeout,
            "wait": self.wait,
            "ask": self.ask,
            "first_waits": self.first_waits,
            "_called": False,
            "_pool": None,
            "provision_here": None,
        }

    def _attached(self) -> Any:
        if self._pool is None:
            mine = _MAIN_POOLS.get(self.path)
            if mine is not None and mine[0] == os.getpid():
                self._pool = mine[1]
            elif not self.path:
                self._pool = _NoPool("no slot pool")
            else:
                try:
                    self._pool = _numapin.SlotPool.attach(self.path)
                    if _dlprofile.ENABLED:
                        self._pool = _dlprofile.pool(self._pool)
                except numapin.Error as e:
                    # A worker that cannot map the pool (few descriptors
                    # left) sends its batches down torch's path.
                    self._pool = _NoPool(str(e).splitlines()[0])
        return self._pool

    def _ordinary(self, samples: list[Any]) -> Any:
        if self.user is not None:
            return self.user(samples)
        # Without grad, as the slots are filled: torch's workers refuse
        # samples that require grad (their stack into shared memory is an
        # out= call), and whether a batch took this path or a slot must not
        # decide whether it fails.
        with torch.no_grad():
            return default_collate(samples)

    def __call__(self, samples: list[Any]) -> Any:
        if _dlprofile.ENABLED:
            return _dlprofile.collate(self._call, samples)
        return self._call(samples)

    def _call(self, samples: list[Any]) -> Any:
        pool = self._attached()
        # A user collate runs once, here or below; its result is copied in.
        data: Any = None
        first, self._called = not self._called, True
        if isinstance(pool, _NoPool):
            data = self._ordinary(samples)
            return _Plain(data, "unmapped", _tensor_bytes(data))
        if not pool.ready:
            wait = self.wait if self.first_waits or not first or _worker_id() != 0 else 0.0
            if wait <= 0 and self.provision_here is None:
                # Not waiting: this batch takes torch's path while the main
                # process makes the pool it is asked for (when asking).
                data = self._ordinary(samples)
                nbytes = _tensor_bytes(data)
                if self.ask:
                    pool.request(int(max(nbytes, 1) * HEADROOM))
                return _Plain(data, "unsized", nbytes)
            if self.user is None:
                need = _estimate(samples)
            else:
                data = self.user(samples)
                need = _tensor_bytes(data)
            if self.provision_here is not None:
                self.provision_here(int(max(need, 1) * HEADROOM))
            else:
                pool.request(int(max(need, 1) * HEADROOM))
            if not pool.wait_ready(wait):
                if data is None:
                    data = self._ordinary(samples)
                return _Plain(data, "unsized", _tensor_bytes(data))
        slot = pool.acquire(self.timeout)
        if slot is None:
            if data is None:
                data = self._ordinary(samples)
            return _Plain(data, "busy", _tensor_bytes(data))
        try:
            w = _Writer(pool, slot)
            if self.user is None:
                tree = self._collate_into(samples, w)
            else:
                if data is None:
                    data = self.user(samples)
                try:
                    tree = _map(data, w.copy)
                except _NoRoom as e:
                    pool.release(slot)
                    return _Plain(data, "foreign" if isinstance(e, _Foreign) else "large", _tensor_bytes(data))
            return _SlotBatch(slot, w.used, tree)
        except _NoRoom as e:
            pool.release(slot)
            data = self._ordinary(samples)
            return _Plain(data, "foreign" if isinstance(e, _Foreign) else "large", _tensor_bytes(data))
        except BaseException:
            pool.release(slot)
            raise

    @staticmethod
    def _collate_into(samples: list[Any], w: _Writer) -> Any:
        def stack(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> _Leaf:
            elem = batch[0]
            if not all(_slottable(t) for t in batch):
                raise _Foreign
            fast = _slotcopy.stack(w, batch, _Leaf, ALIGN)
            if fast is not None:
                return fast
            view, leaf = w.place(elem.dtype, (len(batch),) + tuple(elem.shape))
            with torch.no_grad():
                torch.stack([t.resolve_conj().resolve_neg() for t in batch], 0, out=view)
            return leaf

        fmap = dict(default_collate_fn_map)
        fmap[torch.Tensor] = stack
        tree = _torch_collate(samples, collate_fn_map=fmap)
        # Numbers become small tensors in torch's collate: into the slot too.
        return _map(tree, lambda x: w.copy(x) if isinstance(x, torch.Tensor) else x)


class _WorkerInit:
    """Binds a worker to the device's CPUs, keeps its heap (see
    ``keep_worker_heap``), then runs the user's init."""

    def __init__(self, cpus: list[int], keep_heap: bool, user: Callable[[int], None] | None) -> None:
        self.cpus, self.keep_heap, self.user = cpus, keep_heap, user

    def __call__(self, worker_id: int) -> None:
        if self.cpus:
            try:
                os.sched_setaffinity(0, self.cpus)
            except OSError:
                pass  # a cpuset narrower than the topology's: stay where allowed
        if self.keep_heap:
            _keep_heap()
        if self.user is not None:
            self.user(worker_id)


def _keep_heap() -> None:
    """Makes glibc keep freed memory in this process for reuse: blocks up to
    32 MiB come from the heap (not fresh mappings) and the heap is not
    trimmed, so a worker's samples land in pages already faulted in instead
    of new zeroed pages every batch (the page faults, not the copies, bound
    a worker that builds large samples)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)
    libc.mallopt(m_trim_threshold, 1 << 30)


def _count(value: Any, what: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo..hi`` (``TypeError`` for a bool or a
    non-integer, :class:`numapin.InputError` out of range)."""
    return numapin._int(value, what, lo=lo, hi=hi, fix=f"pass {what} as a whole number from {lo} to {hi}")


def _seconds(value: Any, what: str) -> float:
    if numapin._is_bool(value) or not isinstance(value, (int, float)):
        raise TypeError(f"{what}={value!r} is not a number of seconds\n  fix: pass seconds, e.g. 5.0")
    v = float(value)
    if not 0.0 <= v <= 3600.0:
        raise numapin.InputError(f"{what}={value!r} is not 0 to 3600 seconds\n  fix: pass seconds, e.g. 5.0")
    return v


def _device(device: Any) -> torch.device | None:
    """``device`` as a CUDA ``torch.device`` with an index, or ``None`` for
    pinned CPU batches (also, with a warning, for a CUDA device on a
    machine where torch sees none)."""
    if device is None:
        return None
    if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
        raise TypeError(
            f"device={device!r} is not a device\n  fix: pass a CUDA device (\"cuda\", \"cuda:1\", 1, a torch.device) or None"
        )
    try:
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise numapin.InputError(
            f"device={device!r} is not a device torch knows ({str(e).splitlines()[0]})\n"
            "  fix: pass a CUDA device (\"cuda\", \"cuda:1\") or None for pinned CPU batches"
        ) from None
    if d.type != "cuda":
        raise numapin.InputError(
            f"device={device!r} is not a CUDA device\n  fix: pass a CUDA device, or None for pinned CPU batches"
        )
    if not torch.cuda.is_available():
        warnings.warn(
            f"numapin.torch.DataLoader: device={device!r}, but torch sees no CUDA device here; "
            "batches are pinned CPU tensors (pass device=None to say so)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    count = torch.cuda.device_count()
    index = d.index if d.index is not None else torch.cuda.current_device()
    if index >= count:
        raise numapin.InputError(
            f"device={device!r}: this process sees {count} CUDA device(s)\n"
            "  fix: pass one of cuda:0 .. cuda:{count - 1} (check CUDA_VISIBLE_DEVICES)"
        )
    return torch.device("cuda", index)


class _NoPool:
    """Stands in for a slot pool that could not be made (main process) or
    mapped (a worker), for a descriptor or memory limit: never ready, so
    every batch takes torch's ordinary path, as torch's own loader works
    under that limit. ``why``: the error, said once in a warning."""

    path = ""
    ready = False
    nslots = max_slots = slot_bytes = 0

    def __init__(self, why: str) -> None:
        self.why = why

    def request(self, nbytes: int) -> None:
        pass

    def wait_ready(self, timeout: float) -> bool:
        return False

    def provision_error(self) -> str:
        return self.why

    def provision_on_request(self, *args: Any, **kwargs: Any) -> None:
        pass

    def provision(self, *args: Any, **kwargs: Any) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"nslots": 0, "max_slots": 0, "slot_bytes": 0, "free": 0, "leased": 0, "registered": False}

    def begin_generation(self) -> int:
        return 0

    def reclaim_before(self, generation: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Slots:
    """A slot pool and the collate function its workers run: one per loader,
    and one more for each iterator started while another of the same
    loader (without persistent workers) is still alive, as torch lets two
    epochs run at once."""

    def __init__(self, loader: DataLoader, collate_fn: Any, slot_timeout: float, num_workers: int) -> None:
        self.loader = loader
        self.failed: str | None = None
        try:
            self.pool: Any = _numapin.SlotPool.create()
        except numapin.Error as e:
            if loader._slot_bytes is not None:
                raise
            # Torch's own loader works where no memfd can be made (few
            # descriptors left): so does this one, on torch's path.
            self.pool = _NoPool(str(e).splitlines()[0])
            warnings.warn(
                f"numapin.torch.DataLoader: the slot pool could not be made ({self.pool.why}); "
                "batches take torch's ordinary path\n  fix: raise the limit named (ulimit -n for "
                "descriptors), or use fewer workers",
                RuntimeWarning,
                stacklevel=4,
            )
        _MAIN_POOLS[self.pool.path] = (os.getpid(), self.pool)
        try:
            self.collate = _SlotCollate(
                self.pool.path,
                collate_fn,
                slot_timeout,
                POOL_WAIT if loader._on_request else 0.0,
                ask=loader._on_request,
                first_waits=FIRST_BATCH_WAITS,
            )
            if num_workers == 0 and loader._slot_bytes is None:
                self.collate.provision_here = self.provision
            if loader._on_request:
                # Two slots per worker and two more first (what a consumer as
                # fast as the workers needs: one being filled and one done per
                # worker), more when workers find none free, up to the bound.
                self.pool.provision_on_request(
                    loader._nslots,
                    first=min(loader._nslots, 2 * num_workers + 2),
                    grow_by=max(2, num_workers),
                    gpu=loader._gpu,
                    register=loader._register(),
                )
            if loader._slot_bytes is not None:
                self.provision(loader._slot_bytes)
        except BaseException:
            self.close()
            raise

    def provision(self, nbytes: int) -> None:
        """Makes the pool's slots of ``nbytes`` (main process). Where that
        fails (a memory or memlock limit) and no ``slot_bytes`` was asked
        for, says so once and leaves the pool unmade: batches take torch's
        path, as torch's own loader works under that limit."""
        if self.failed is not None:
            return
        l = self.loader
        try:
            self.pool.provision(l._nslots, max(nbytes, 1), gpu=l._gpu, register=l._register())
        except numapin.Error as e:
            if l._slot_bytes is not None:
                raise
            self.failed = str(e).splitlines()[0]
            fix = getattr(e, "fix", None)
            warnings.warn(
                f"numapin.torch.DataLoader: the slot pool could not be made ({self.failed}); "
                "batches take torch's ordinary path" + (f"\n  fix: {fix}" if fix else ""),
                RuntimeWarning,
                stacklevel=4,
            )

    def close(self) -> None:
        self.pool.close()
        _MAIN_POOLS.pop(self.pool.path, None)


class DataLoader:
    """torch's DataLoader with batches written straight into pinned memory
    on ``device``'s node (see the module docs). Without CUDA, or with
    ``device=None``, batches are pinned CPU tensors (a CUDA ``device`` on a
    machine where torch sees no GPU gives a ``RuntimeWarning`` and pinned
    CPU batches).

    Wrong arguments raise what torch raises for torch's (``ValueError``,
    ``TypeError``) and :class:`numapin.InputError` / ``TypeError`` for
    numapin's (``device``, ``slots``, ``slot_bytes``, ``slot_timeout``);
    a pool that cannot be made for ``slot_bytes`` raises
    :class:`numapin.BudgetError` or :class:`numapin.LimitError`. A failed
    constructor leaves nothing behind."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        device: Any = None,
        slot_bytes: int | None = None,
        slots: int | None = None,
        slot_timeout: float | None = None,
        keep_worker_heap: bool = True,
    ) -> None:
        self._slots: _Slots | None = None
        self._iters: weakref.WeakSet[_Iter] = weakref.WeakSet()
        if batch_size is None and batch_sampler is None:
            raise numapin.InputError(
                "batch_size=None (no batching) has no batch to place in a slot\n"
                "  fix: use torch.utils.data.DataLoader for unbatched loading, or give a batch_size"
            )
        self.device = _device(device)
        self._gpu = self.device.index if self.device is not None else None
        # A slot is held from the start of a batch's collate to the end of
        # its copy: the workers' batches in progress and a few done ahead.
        # torch keeps prefetch_factor x num_workers batches in flight: with
        # fewer slots, workers ahead of the batch the main process waits for
        # could hold them all while its worker waits for one (a stall until
        # slot_timeout). A few more cover copies still running.
        workers = num_workers if isinstance(num_workers, int) and num_workers > 0 else 0
        pf = prefetch_factor if isinstance(prefetch_factor, int) and prefetch_factor > 0 else 2
        in_flight = pf * workers if workers > 0 else 1
        self._nslots = _count(slots, "slots", 1, 4096) if slots is not None else min(4096, max(4, in_flight + 4))
        self._slot_bytes = None if slot_bytes is None else _count(slot_bytes, "slot_bytes", 1, 2**62)
        if slot_timeout is None:
            # In the main process no one else frees a slot while collate
            # waits; for CPU batches the consumer may hold them all (a
            # short wait, then torch's path); copies to a device free
            # their slots within milliseconds.
            slot_timeout = 0.0 if workers == 0 else (5.0 if self.device is not None else 0.05)
        self._slot_timeout = _seconds(slot_timeout, "slot_timeout")
        self._user_collate = collate_fn
        self._warned = False
        self.stats_plain = collections.Counter()
        self.stats_slotted = 0
        # With workers and no slot_bytes, the first worker to collate asks
        # for slots of its batch's size and the main process provisions them
        # on a thread of its own while the workers wait (their first batches
        # would otherwise take torch's path until the main process received
        # the first of them: up to prefetch_factor x num_workers batches),
        # all but worker 0's first batch, which takes torch's path so that
        # the first batch comes as soon as torch's (FIRST_BATCH_WAITS).
        self._on_request = workers > 0 and slot_bytes is None
        self._failed_warned = False
        self._pin_failed = False
        self._iter: weakref.ref[_Iter] | None = None
        self.dataset = dataset
        self.num_workers = num_workers
        self.persistent_workers = bool(persistent_workers) and workers > 0
        # torch checks its own arguments first (nothing of numapin's is
        # made yet), with a collate function that is replaced below.
        self._loader = _TorchLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=default_collate,
            pin_memory=False,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
        )
        self._cpus = self._worker_cpus()
        if workers > 0:
            self._loader.worker_init_fn = _WorkerInit(self._cpus, keep_worker_heap, worker_init_fn)
        self._slots = _Slots(self, collate_fn, self._slot_timeout, workers)
        self._loader.collate_fn = self._slots.collate

    @property
    def _pool(self) -> Any:
        return self._slots.pool if self._slots is not None else None

    @property
    def _collate(self) -> _SlotCollate:
        assert self._slots is not None
        return self._slots.collate

    def _worker_cpus(self) -> list[int]:
        """The CPUs numapin places the device's work on (:func:`numapin.place`:
        the same CPUs that fault the slots in); all allowed CPUs without a
        device."""
        return numapin.place(self._gpu).cpus

    def _register(self) -> bool:
        return self.device is not None or torch.cuda.is_available()

    def _provision(self, nbytes: int) -> None:
        assert self._slots is not None
        self._slots.provision(nbytes)

    def memory_bound(self) -> dict[str, int]:
        """Pinned host bytes the slot pool may hold (``slots`` x slot size)
        and holds now (it grows to that bound as workers need slots); 0
        before it is sized."""
        return {
            "pinned_bytes": self._pool.max_slots * self._pool.slot_bytes,
            "pinned_bytes_now": self._pool.nslots * self._pool.slot_bytes,
        }

    def stats(self) -> dict[str, Any]:
        """The pool (slots, size, free, leased) and how many batches took
        each path."""
        s = dict(self._pool.stats())
        s["slotted_batches"] = self.stats_slotted
        s["plain_batches"] = dict(self.stats_plain)
        return s

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> _Iter:
        assert self._slots is not None, "the loader is closed"
        busy = any(not i.done and i.slots is self._slots for i in list(self._iters))
        if busy and not self.persistent_workers:
            # torch runs both epochs: this one gets a pool of its own (made
            # as the loader's was), closed when the iterator ends.
            slots = _Slots(self, self._user_collate, self._slot_timeout,
                           self.num_workers if self.num_workers > 0 else 0)
            it = _Iter(self, slots, own=True)
        else:
            it = _Iter(self, self._slots, own=False)
        self._iter = weakref.ref(it)
        self._iters.add(it)
        return it

    def close(self) -> None:
        """Stops the workers and gives every slot back (also on deletion)."""
        for it in list(getattr(self, "_iters", ())):
            it.close(shutdown=True)
        self._iter = None
        # torch keeps the iterator of persistent workers on its loader.
        persistent = getattr(getattr(self, "_loader", None), "_iterator", None)
        if persistent is not None:
            stop = getattr(persistent, "_shutdown_workers", None)
            if stop is not None:
                stop()
            self._loader._iterator = None
        slots = getattr(self, "_slots", None)
        if slots is not None:
            slots.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # Main-process side of a batch.

    def _warn(self, why: str, nbytes: int, pool: Any) -> None:
        if self._warned:
            return
        self._warned = True
        reason = {
            "large": f"a batch of {nbytes} bytes is larger than a slot ({pool.slot_bytes} bytes)",
            "busy": "no slot came free in time (the consumer holds many batches, or slots= is too small)",
        }[why]
        warnings.warn(
            f"numapin.torch.DataLoader: {reason}; such batches take torch's ordinary path "
            "(give slot_bytes= or slots= to avoid it)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _plain(self, b: _Plain, slots: _Slots) -> Any:
        self.stats_plain[b.why] += 1
        pool = slots.pool
        if b.why == "unsized" and not pool.ready:
            if not self._on_request:
                slots.provision(int(max(b.nbytes, 1) * HEADROOM))
            elif (err := pool.provision_error()) is not None and not self._failed_warned:
                self._failed_warned = True
                warnings.warn(
                    f"numapin.torch.DataLoader: the slot pool could not be made ({err}); "
                    "batches take torch's ordinary path",
                    RuntimeWarning,
                    stacklevel=3,
                )
        elif b.why in ("large", "busy"):
            self._warn(b.why, b.nbytes, pool)
        elif b.why == "unmapped" and not isinstance(pool, _NoPool) and not self._failed_warned:
            # (A pool that could not be made was said at construction.)
            self._failed_warned = True
            warnings.warn(
                "numapin.torch.DataLoader: a worker could not map the slot pool (few descriptors "
                "left?); its batches take torch's ordinary path\n  fix: raise the descriptor "
                "limit (ulimit -n), or use fewer workers",
                RuntimeWarning,
                stacklevel=3,
            )
        if self.device is not None:
            return _map(b.data, lambda t: t.to(self.device, non_blocking=True))
        return _map(b.data, self._pinned_or_kept)

    def _pinned_or_kept(self, t: Any) -> Any:
        """A CPU batch's tensor pinned (as a slot's would be), or kept as it
        is where nothing can be pinned (a memlock or memory limit: said
        once)."""
        if not (isinstance(t, torch.Tensor) and t.numel() and _slottable(t)) or self._pin_failed:
            return t
        try:
            return numapin.pin(t, node=None)
        except numapin.Error as e:
            self._pin_failed = True
            warnings.warn(
                f"numapin.torch.DataLoader: batches on torch's ordinary path cannot be pinned "
                f"({str(e).splitlines()[0]}); they stay in pageable memory",
                RuntimeWarning,
                stacklevel=4,
            )
            return t


def _out_of_descriptors(e: BaseException) -> numapin.LimitError | None:
    """The error to raise for `e` when it says the process ran out of file
    descriptors (torch's workers and queues take several each), else None."""
    if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
        why = str(e)
    elif isinstance(e, RuntimeError) and str(e).startswith("Too many open files"):
        why = str(e).split(".")[0]
    else:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return numapin.LimitError(
        f"the DataLoader ran out of file descriptors ({why}; RLIMIT_NOFILE is {soft})\n"
        "  fix: raise the descriptor limit (ulimit -n), or use fewer workers"
    )


class _Iter:
    """One epoch's iterator (over ``slots``, the loader's pool, or with
    ``own`` one of its own that it closes when it ends)."""

    def __init__(self, loader: DataLoader, slots: _Slots, own: bool) -> None:
        self.l, self.slots, self.own = loader, slots, own
        self.done = False
        self.pending: collections.deque[tuple[Any, Any]] = collections.deque()
        pool = slots.pool
        generation = pool.begin_generation()
        saved = loader._loader.collate_fn
        try:
            # torch's iterator takes the collate function it is made with.
            loader._loader.collate_fn = slots.collate
            self.it = iter(loader._loader)
            if _dlprofile.ENABLED:
                self.it = _dlprofile.iterator(self.it)
        except BaseException as e:
            if own:
                slots.close()
            if (limit := _out_of_descriptors(e)) is not None:
                raise limit from e
            raise
        finally:
            loader._loader.collate_fn = saved
        # torch has drained an abandoned epoch of persistent workers by now:
        # the slots its undelivered batches took come back; the new epoch's
        # (taken in this generation, maybe being filled) are left alone.
        pool.reclaim_before(generation)
        self.side = torch.cuda.Stream(loader.device) if loader.device is not None else None

    def __iter__(self) -> _Iter:
        return self

    def _retire(self) -> None:
        """Frees the slots whose copies have completed (never waits)."""
        while self.pending and self.pending[0][0].query():
            self.pending.popleft()

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        self._retire()
        try:
            item = next(self.it)
        except StopIteration:
            self.close()
            raise
        except BaseException as e:
            self.close(shutdown=True)
            if (limit := _out_of_descriptors(e)) is not None:
                raise limit from e
            raise
        if isinstance(item, _Plain):
            return self.l._plain(item, self.slots)
        self.l.stats_slotted += 1
        lease = self.slots.pool.lease(item.slot)
        if self.l.device is None:
            # Pinned CPU batches: the slot comes back when the last tensor goes.
            return _map(
                item.tree,
                lambda leaf: torch.from_dlpack(lease.view(leaf.offset, leaf.nbytes, leaf.dtype, list(leaf.shape))),
            )
        return self._to_device(item, lease)

    def _to_device(self, item: _SlotBatch, lease: Any) -> Any:
        dev = self.l.device
        src = torch.from_dlpack(lease.view(0, item.used, "uint8", [item.used]))
        consumer = torch.cuda.current_stream(dev)
        with torch.cuda.stream(self.side):
            buf = torch.empty(item.used, dtype=torch.uint8, device=dev)
            buf.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        consumer.wait_event(done)
        buf.record_stream(consumer)
        # The slot (held by `src`) comes back once the copy has completed.
        self.pending.append((done, src))
        if len(self.pending) > 8:
            self.pending[0][0].synchronize()
            self._retire()

        def leaf_view(leaf: _Leaf) -> torch.Tensor:
            t = buf[leaf.offset : leaf.offset + leaf.nbytes]
            dtype = getattr(torch, leaf.dtype)
            return t.view(dtype).view(leaf.shape)

        return _map(item.tree, leaf_view)

    def close(self, shutdown: bool = False) -> None:
        """Ends the epoch: waits for copies in flight, stops the workers
        (unless persistent, and not shutting down), gives back every slot no
        batch the consumer holds still uses."""
        if self.done and not shutdown:
            return
        self.done = True
        for ev, _ in getattr(self, "pending", ()):
            ev.synchronize()
        if hasattr(self, "pending"):
            self.pending.clear()
        it = getattr(self, "it", None)
        stop = getattr(it, "_shutdown_workers", None)
        if stop is not None and (shutdown or not self.l.persistent_workers):
            stop()
        if self.own:
            # Its own pool: slots batches still hold stay mapped until they go.
            self.slots.close()
        elif self.slots.pool.ready and (shutdown or not self.l.persistent_workers):
            self.slots.pool.reset()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

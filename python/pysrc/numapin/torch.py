"""``numapin.torch.DataLoader``: torch's DataLoader, with workers that write
each batch straight into pinned memory on the GPU's NUMA node.

It takes torch's arguments (``dataset``, ``batch_size``, ``shuffle``,
``sampler``, ``batch_sampler``, ``num_workers``, ``collate_fn``,
``drop_last``, ``timeout``, ``worker_init_fn``, ``multiprocessing_context``,
``generator``, ``prefetch_factor``, ``persistent_workers``) plus ``device``:
a CUDA device (batches arrive on it) or ``None`` (pinned CPU batches), and
the pool's ``slot_bytes`` (default: the first batch's bytes plus a
thirty-second), ``slots`` (default ``prefetch_factor * num_workers + 2``:
the batches torch keeps in flight, and copies; with workers the pool starts with
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
for slots of its batch's size plus a thirty-second, and the main process makes
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
import resource
import types
import warnings
import weakref
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader as _TorchLoader
from torch.utils.data._utils.collate import default_collate

import numapin
from numapin import _dlprofile
from numapin import _numapin  # noqa: F401 (numapin.torch._numapin, as before the split)
from numapin._loader_collate import ALIGN  # noqa: F401 (numapin.torch.ALIGN, as before the split)
from numapin._loader_collate import HEADROOM, Fallback, Leaf, Plain, SlotBatch, SlotCollate, slottable, tree_map
from numapin._loader_fork import check_before_fork, start_method
from numapin._loader_pool import PoolSpec, Slots, memory_limits
from numapin._loader_worker import NoPool, WorkerInit
from numapin._stager import CheckpointStager as CheckpointStager

__all__ = ["DataLoader"]

# The parts, split as torch.utils.data splits its DataLoader: this module
# is the loader (argument checks, the iterator, the main process's side of
# each batch); the collate the workers run is numapin._loader_collate
# (ALIGN and HEADROOM, named here too, are its), their start and their way
# to the pool numapin._loader_worker, and the pool as the main process holds
# it numapin._loader_pool.

#: Seconds a worker waits for the main process to provision the pool it
#: asked for (a few hundred ms per GiB of slots) before its batch takes
#: torch's path. 0: never wait (every batch collated before the pool is
#: ready takes torch's path: with many workers, most of a short run). Read
#: when a loader (or an iterator with a pool of its own) is made.
POOL_WAIT = 60.0
#: Whether the first batch (worker 0's first) waits for the pool too. False:
#: it takes torch's path while the pool is made, so it arrives as soon as
#: torch's would (docs/BENCHMARKS.md, "first batch"); the others wait.
FIRST_BATCH_WAITS = False


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
            f"  fix: pass one of cuda:0 .. cuda:{count - 1} (check CUDA_VISIBLE_DEVICES)"
        )
    return torch.device("cuda", index)


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
    constructor leaves nothing behind.

    Pinned CPU batches are numapin's memory, not mapped in a forked child
    (``MADV_DONTFORK``). Before it forks workers, the loader looks through
    the dataset (and a ``collate_fn`` or ``worker_init_fn`` that is an
    object) for tensors and arrays over such memory (from
    :func:`numapin.empty`, :func:`numapin.pin`,
    ``load_safetensors(device=None)``, a ``SharedBuffer``, such batches),
    which would end a worker with ``SIGSEGV``, and raises
    :class:`numapin.InputError` naming the first, with the fixes (ordinary
    memory, ``multiprocessing_context="forkserver"``, or no workers)."""

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
        self._slots: Slots | None = None
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
        # slot_timeout). Two more cover copies still running (a slot is
        # freed once its copy has completed); with four, the pool held more
        # host memory than torch's loader.
        workers = num_workers if isinstance(num_workers, int) and num_workers > 0 else 0
        pf = prefetch_factor if isinstance(prefetch_factor, int) and prefetch_factor > 0 else 2
        in_flight = pf * workers if workers > 0 else 1
        self._nslots = _count(slots, "slots", 1, 4096) if slots is not None else min(4096, max(4, in_flight + 2))
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
        # Batches that took torch's path, by why (a Fallback: a str).
        self.stats_plain: collections.Counter[Fallback] = collections.Counter()
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
        self._init_fn = worker_init_fn
        self._cpus = self._worker_cpus()
        if workers > 0:
            self._loader.worker_init_fn = WorkerInit(self._cpus, keep_worker_heap, worker_init_fn)
        self._slots = Slots(self._spec(), collate_fn, self._slot_timeout, workers)
        self._loader.collate_fn = self._slots.collate

    @property
    def _pool(self) -> Any:
        return self._slots.pool if self._slots is not None else None

    @property
    def _collate(self) -> SlotCollate:
        assert self._slots is not None
        return self._slots.collate

    def _worker_cpus(self) -> list[int]:
        """The CPUs numapin places the device's work on (:func:`numapin.place`:
        the same CPUs that fault the slots in); all allowed CPUs without a
        device."""
        return numapin.place(self._gpu).cpus

    def _register(self) -> bool:
        return self.device is not None or torch.cuda.is_available()

    def _spec(self) -> PoolSpec:
        """How this loader's pools are made (with the module's ``POOL_WAIT``
        and ``FIRST_BATCH_WAITS`` as they are now)."""
        return PoolSpec(
            nslots=self._nslots,
            slot_bytes=self._slot_bytes,
            gpu=self._gpu,
            register=self._register(),
            on_request=self._on_request,
            wait=POOL_WAIT,
            first_waits=FIRST_BATCH_WAITS,
        )

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
        s["plain_batches"] = {str(why): n for why, n in self.stats_plain.items()}
        return s

    def __len__(self) -> int:
        return len(self._loader)

    def _check_fork(self) -> None:
        """Refuses (an :class:`numapin.InputError`) what forked workers,
        about to start, would die reading: numapin's pinned memory in the
        dataset (see :mod:`numapin._loader_fork`)."""
        tl = self._loader
        if not (isinstance(self.num_workers, int) and self.num_workers > 0):
            return
        if self.persistent_workers and getattr(tl, "_iterator", None) is not None:
            return  # forked already, with the dataset as it was then
        if start_method(tl.multiprocessing_context) != "fork":
            return
        roots = {"dataset": self.dataset}
        for name, fn in (("collate_fn", self._user_collate), ("worker_init_fn", getattr(self, "_init_fn", None))):
            if fn is not None and not isinstance(fn, types.FunctionType):
                roots[name] = fn
        check_before_fork(roots)

    def __iter__(self) -> _Iter:
        assert self._slots is not None, "the loader is closed"
        self._check_fork()
        busy = any(not i.done and i.slots is self._slots for i in list(self._iters))
        if busy and not self.persistent_workers:
            # torch runs both epochs: this one gets a pool of its own (made
            # as the loader's was), closed when the iterator ends.
            slots = Slots(self._spec(), self._user_collate, self._slot_timeout,
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

    def _warn(self, why: Fallback, nbytes: int, pool: Any) -> None:
        if self._warned:
            return
        self._warned = True
        reason = {
            Fallback.LARGE: f"a batch of {nbytes} bytes is larger than a slot ({pool.slot_bytes} bytes)",
            Fallback.BUSY: "no slot came free in time (the consumer holds many batches, or slots= is too small)",
        }[why]
        warnings.warn(
            f"numapin.torch.DataLoader: {reason}; such batches take torch's ordinary path "
            "(give slot_bytes= or slots= to avoid it)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _plain(self, b: Plain, slots: Slots) -> Any:
        self.stats_plain[b.why] += 1
        pool = slots.pool
        if b.why == Fallback.UNSIZED and not pool.ready:
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
        elif b.why in (Fallback.LARGE, Fallback.BUSY):
            self._warn(b.why, b.nbytes, pool)
        elif b.why == Fallback.UNMAPPED and not isinstance(pool, NoPool) and not self._failed_warned:
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
            return tree_map(b.data, lambda t: t.to(self.device, non_blocking=True))
        return tree_map(b.data, self._pinned_or_kept)

    def _pinned_or_kept(self, t: Any) -> Any:
        """A CPU batch's tensor pinned (as a slot's would be), or kept as it
        is where nothing can be pinned (a memlock or memory limit: said
        once)."""
        if not (isinstance(t, torch.Tensor) and t.numel() and slottable(t)) or self._pin_failed:
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


def _stop_half_made(e: BaseException) -> None:
    """Stops the workers of torch's iterator whose making `e` cut short
    (a queue's thread refused under a memory limit, say): torch leaves them
    running until the half-made object is collected, maybe in a later
    worker's fork."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    tb = e.__traceback__
    while tb is not None:
        it = tb.tb_frame.f_locals.get("self")
        if isinstance(it, _MultiProcessingDataLoaderIter):
            break
        tb = tb.tb_next
    else:
        return
    if not hasattr(it, "_shutdown"):
        # Cut short before torch started any worker: nothing to stop, and
        # its __del__ would fail on the missing attribute.
        it._shutdown = True
        return
    try:
        it._shutdown_workers()
    except BaseException:  # noqa: BLE001 - it ends by terminating the workers
        pass
    for w in getattr(it, "_workers", []):
        try:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
                w.join()
        except BaseException:  # noqa: BLE001 - best effort, as torch's own
            pass


def _limit_error(e: BaseException) -> numapin.LimitError | None:
    """The error to raise for `e` when it says a limit of the process was
    reached (descriptors, or address space under ``ulimit -v``), else None."""
    return _out_of_descriptors(e) or _out_of_memory(e)


# What running out of memory looks like from below: Python (a thread's
# stack, fork), torch's CPU allocator and shared memory, a worker's error
# as torch re-raises it.
_NO_MEMORY = ("can't start new thread", "can't allocate memory", "Cannot allocate memory",
              "not enough memory", "out of memory")


# Room under a limit below which an allocation that failed is put down to
# the limit: a batch, a thread's stack or a queue's buffers fit in less.
LIMIT_NEAR = 1 << 30


def _out_of_memory(e: BaseException) -> numapin.LimitError | None:
    """A :class:`numapin.LimitError` naming the limit for `e` when `e` says
    host memory ran out and an address-space or data limit (``ulimit -v``,
    ``-d``) leaves the process less than :data:`LIMIT_NEAR`, else None
    (with more room, or no limit, running out is the machine's; a GPU's
    out-of-memory is the GPU's)."""
    if not (isinstance(e, (MemoryError, RuntimeError)) or (isinstance(e, OSError) and e.errno == errno.ENOMEM)):
        return None
    text = str(e)
    if isinstance(e, torch.cuda.OutOfMemoryError) or "CUDA" in text:
        return None
    if not isinstance(e, MemoryError) and not any(w in text for w in _NO_MEMORY):
        return None
    for name, soft, room, flag in memory_limits():
        if room < LIMIT_NEAR:
            why = text.strip().splitlines()[0][:200] if text.strip() else type(e).__name__
            return numapin.LimitError(
                f"the DataLoader ran out of memory under the process's limit ({why}; {name} is "
                f"{soft >> 20} MiB, {max(room, 0) >> 20} MiB of it left)\n  fix: raise the limit "
                f"(ulimit {flag}), or use fewer workers or smaller batches"
            )
    return None


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

    def __init__(self, loader: DataLoader, slots: Slots, own: bool) -> None:
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
            _stop_half_made(e)
            if own:
                slots.close()
            if (limit := _limit_error(e)) is not None:
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
            if (limit := _limit_error(e)) is not None:
                raise limit from e
            raise
        if isinstance(item, Plain):
            return self.l._plain(item, self.slots)
        self.l.stats_slotted += 1
        lease = self.slots.pool.lease(item.slot)
        if self.l.device is None:
            # Pinned CPU batches: the slot comes back when the last tensor goes.
            return tree_map(
                item.tree,
                lambda leaf: torch.from_dlpack(lease.view(leaf.offset, leaf.nbytes, leaf.dtype, list(leaf.shape))),
            )
        return self._to_device(item, lease)

    def _to_device(self, item: SlotBatch, lease: Any) -> Any:
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

        def leaf_view(leaf: Leaf) -> torch.Tensor:
            t = buf[leaf.offset : leaf.offset + leaf.nbytes]
            dtype = getattr(torch, leaf.dtype)
            return t.view(dtype).view(leaf.shape)

        return tree_map(item.tree, leaf_view)

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

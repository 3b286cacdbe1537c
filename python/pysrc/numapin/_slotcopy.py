"""The default collate's way into a slot. Where the slots a loader cycles
through fit in half the last-level cache, ``torch.stack(..., out=slot_view)``
writes them through the cache, and the copy to the GPU reads them from
there. Larger slots (a batch of 4 MiB samples is 64 MiB) are written by
numapin instead, for a batch of same-shaped, contiguous CPU tensors (the
common case): with streaming stores (no read of each destination line
first, nothing left in the cache) and the GIL released, a batch of 4 MiB or
more on a few threads bound to this worker's share of the device's CPUs.
docs/BENCHMARKS.md ("the DataLoader's steady state") has the measurements
that chose this.

``NUMAPIN_DATALOADER_COPY``: ``auto`` (the default, the rule above),
``stream`` (numapin's copy for every such batch) or ``torch``
(``torch.stack`` for every batch); ``NUMAPIN_DATALOADER_COPY_THREADS=N``
sets the threads a worker's copy uses (default: the device's CPUs shared
evenly among the workers).
"""

from __future__ import annotations

import os
from typing import Any, Callable

MODE = os.environ.get("NUMAPIN_DATALOADER_COPY", "auto")
try:
    THREADS = max(0, min(64, int(os.environ.get("NUMAPIN_DATALOADER_COPY_THREADS", "0") or 0)))
except ValueError:
    THREADS = 0

# This process's CPUs for its copies, by pid (a forked worker works its own
# out).
_share: dict[int, list[int]] = {}


def _cpus() -> list[int]:
    """This worker's share of the CPUs it may run on: ``len / workers`` of
    them (at least one), worker i's from the i-th share on."""
    pid = os.getpid()
    got = _share.get(pid)
    if got is None:
        import torch.utils.data

        cpus = sorted(os.sched_getaffinity(0))
        info = torch.utils.data.get_worker_info()
        workers, me = (info.num_workers, info.id) if info is not None else (1, 0)
        per = min(len(cpus), THREADS or max(1, len(cpus) // max(1, workers)))
        start = (me * per) % len(cpus)
        got = _share[pid] = [cpus[(start + k) % len(cpus)] for k in range(per)]
    return got


def last_level_cache_bytes() -> int:
    """The last-level cache of CPU 0 (sysfs, else ``sysconf``; 32 MiB when
    neither says)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in os.listdir(base):
            try:
                with open(os.path.join(base, d, "level")) as f:
                    level = int(f.read())
                with open(os.path.join(base, d, "size")) as f:
                    text = f.read().strip()
            except (OSError, ValueError):
                continue
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG") or 0) * unit
            best = max(best, size) if level >= 2 else best
    except OSError:
        pass
    if not best:
        try:
            best = int(os.sysconf("SC_LEVEL3_CACHE_SIZE"))
        except (ValueError, OSError):
            best = 0
    return best if best > 0 else 32 << 20


_cached: dict[tuple[int, int], bool] = {}


def _through_cache(slot_bytes: int) -> bool:
    """Whether slots of ``slot_bytes`` are written through the cache: the
    slots a pool starts with (``2 x workers + 2``) fit in half the
    last-level cache."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    workers = info.num_workers if info is not None else 0
    key = (slot_bytes, workers)
    if key not in _cached:
        _cached[key] = slot_bytes * (2 * workers + 2) <= last_level_cache_bytes() // 2
    return _cached[key]


def stack(w: Any, batch: Any, leaf: Callable[..., Any], align: int) -> Any:
    """Stacks ``batch`` (tensors a slot can hold) into ``w``'s slot with
    numapin's copy and returns its leaf (``leaf(offset, nbytes, dtype,
    shape)``), or ``None`` where ``torch.stack`` must do it: another mode,
    tensors of different shapes or dtypes, strided or conjugate ones, or no
    room (the caller then finds the batch too large)."""
    if MODE == "torch" or not batch or (MODE != "stream" and _through_cache(w.size)):
        return None
    elem = batch[0]
    shape, dtype = tuple(elem.shape), elem.dtype
    for t in batch:
        if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.is_conj() or t.is_neg():
            return None
    each = elem.numel() * elem.element_size()
    total = each * len(batch)
    if w.used + total > w.size:
        return None
    offset = w.used
    w.pool.write(w.slot, offset, [t.data_ptr() for t in batch], [each] * len(batch), 1, _cpus())
    w.used += -(-total // align) * align
    return leaf(offset, total, str(dtype).removeprefix("torch."), (len(batch),) + shape)

"""What runs in ``numapin.torch.DataLoader``'s workers besides the collate:
their start (:class:`WorkerInit`: bound to the device's CPUs, the heap kept)
and their way to the slot pool (:class:`PoolRef`; :class:`NoPool` where it
cannot be mapped). With ``num_workers=0`` the collate runs in the main
process, and reaches the pool the same way.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

import numapin
from numapin import _dlprofile, _numapin


def worker_id() -> int:
    """This DataLoader worker's id (0 outside a worker)."""
    info = torch.utils.data.get_worker_info()
    return 0 if info is None else info.id


class WorkerInit:
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
            keep_heap()
        if self.user is not None:
            self.user(worker_id)


def keep_heap() -> None:
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


class NoPool:
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


class PoolRef:
    """How a collate reaches its slot pool: in the process that made the
    pool, that pool itself (``num_workers=0`` collates in the main
    process); in any other, the pool attached afresh by its path. A forked
    worker does not use the copy it inherited, whose locks another thread
    of the parent may have held at the fork. Pickled (for a spawned
    worker), it is the path alone."""

    def __init__(self, pool: Any) -> None:
        self.path: str = pool.path
        self._made: tuple[int, Any] | None = (os.getpid(), pool)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_made": None}

    def forget(self) -> None:
        """The pool is closed: from now on it is attached by its path, in
        this process too."""
        self._made = None

    def get(self) -> Any:
        """The pool, or a :class:`NoPool` where it cannot be mapped."""
        made = self._made
        if made is not None and made[0] == os.getpid():
            return made[1]
        if not self.path:
            return NoPool("no slot pool")
        try:
            pool = _numapin.SlotPool.attach(self.path)
            return _dlprofile.pool(pool) if _dlprofile.ENABLED else pool
        except numapin.Error as e:
            # A worker that cannot map the pool (few descriptors left)
            # sends its batches down torch's path.
            return NoPool(str(e).splitlines()[0])

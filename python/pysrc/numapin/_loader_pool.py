"""The slot pool of ``numapin.torch.DataLoader``, as the main process holds
it: made (one memfd), provisioned on the device's node (at the size given,
at the size a worker asks for, or at the first batch's), and closed; with
the collate function its workers run (:mod:`numapin._loader_collate`), which
reaches it through a :class:`~numapin._loader_worker.PoolRef`.
"""

from __future__ import annotations

import resource
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numapin
from numapin import _numapin
from numapin._loader_collate import SlotCollate
from numapin._loader_worker import NoPool, PoolRef


# Room a slot pool needs under an address-space or data limit: its thread's
# stack and thread-local data, a malloc arena, its first slots. With less,
# the pool is not made and batches take torch's path (which works with less
# where torch's own loader does).
POOL_ROOM = 32 << 20


def memory_limits() -> list[tuple[str, int, int, str]]:
    """``(name, soft limit, room left, ulimit flag)`` of each of
    ``RLIMIT_AS`` and ``RLIMIT_DATA`` that caps this process, room judged
    from what the limit counts (``VmSize``: every mapping; ``VmData``:
    private writable ones)."""
    status: dict[str, list[str]] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                status[k] = v.split()
    except OSError:
        return []
    out = []
    for name, limit, field, flag in (
        ("RLIMIT_AS", resource.RLIMIT_AS, "VmSize", "-v"),
        ("RLIMIT_DATA", resource.RLIMIT_DATA, "VmData", "-d"),
    ):
        soft = resource.getrlimit(limit)[0]
        used = status.get(field)
        if soft == resource.RLIM_INFINITY or not used or not used[0].isdigit():
            continue
        out.append((name, soft, soft - (int(used[0]) << 10), flag))
    return out


def _short_of_memory() -> tuple[str, str] | None:
    """``(why, fix)`` when ``RLIMIT_AS`` or ``RLIMIT_DATA`` leaves this
    process less than :data:`POOL_ROOM`, else None."""
    for name, soft, room, flag in memory_limits():
        if room < POOL_ROOM:
            return (
                f"{name} ({soft >> 20} MiB) leaves {max(room, 0) >> 20} MiB, less than the "
                f"{POOL_ROOM >> 20} MiB the pool needs",
                f"raise the limit (ulimit {flag}), or pass num_workers=0 (no pool is made then)",
            )
    return None


def _fell_back(why: str, fix: str, stacklevel: int) -> None:
    """Says once that batches take torch's path, why, and the fix."""
    warnings.warn(
        f"numapin.torch.DataLoader: the slot pool could not be made ({why}); "
        f"batches take torch's ordinary path\n  fix: {fix}",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


@dataclass(frozen=True)
class PoolSpec:
    """How a loader's pools are made."""

    nslots: int
    """Slots the pool may grow to."""
    slot_bytes: int | None
    """Bytes per slot the user gave: the pool is made at once, and a pool
    that cannot be made is an error. ``None``: sized by the batches, and a
    pool that cannot be made sends every batch down torch's path."""
    gpu: int | None
    """The CUDA device whose node the slots are on (``None``: the calling
    thread's node)."""
    register: bool
    """Whether the slots are registered with CUDA."""
    on_request: bool
    """Whether a worker asks for slots of its batch's size, which the main
    process makes on a thread of its own."""
    wait: float
    """Seconds a worker waits for the pool it asked for."""
    first_waits: bool
    """Whether worker 0's first batch waits for it too."""


class Slots:
    """A slot pool and the collate function its workers run: one per loader,
    and one more for each iterator started while another of the same
    loader (without persistent workers) is still alive, as torch lets two
    epochs run at once."""

    def __init__(
        self,
        spec: PoolSpec,
        collate_fn: Callable[[list[Any]], Any] | None,
        slot_timeout: float,
        num_workers: int,
    ) -> None:
        self.spec = spec
        self.failed: str | None = None
        short = _short_of_memory()
        if short is not None and spec.slot_bytes is not None:
            raise numapin.LimitError(
                f"numapin.torch.DataLoader: no room for the slot pool: {short[0]}\n  fix: {short[1]}"
            )
        try:
            if short is not None:
                # Its thread could not start, or would abort the process
                # (glibc cannot allocate a new thread's thread-local data).
                self.pool: Any = NoPool(short[0])
            else:
                self.pool = _numapin.SlotPool.create()
        except numapin.Error as e:
            if spec.slot_bytes is not None:
                raise
            # Torch's own loader works where no memfd can be made (few
            # descriptors left): so does this one, on torch's path.
            self.pool = NoPool(str(e).splitlines()[0])
        if isinstance(self.pool, NoPool):
            fix = short[1] if short else "raise the limit named (ulimit -n for descriptors), or use fewer workers"
            _fell_back(self.pool.why, fix, 5)
        if spec.on_request and not isinstance(self.pool, NoPool):
            self._on_request(num_workers)
        self.ref = PoolRef(self.pool)
        try:
            self.collate = SlotCollate(
                self.ref,
                collate_fn,
                slot_timeout,
                spec.wait if spec.on_request else 0.0,
                ask=spec.on_request,
                first_waits=spec.first_waits,
            )
            if num_workers == 0 and spec.slot_bytes is None:
                self.collate.provision_here = self.provision
            if spec.slot_bytes is not None:
                self.provision(spec.slot_bytes)
        except BaseException:
            self.close()
            raise

    def _on_request(self, num_workers: int) -> None:
        """Starts the thread that makes slots as workers ask (two per
        worker and two more first: what a consumer as fast as the workers
        needs, one being filled and one done per worker; more when workers
        find none free, up to the bound). Where it cannot start (a memory
        or thread limit), batches take torch's path, as above."""
        spec = self.spec
        try:
            self.pool.provision_on_request(
                spec.nslots,
                first=min(spec.nslots, 2 * num_workers + 2),
                grow_by=max(2, num_workers),
                gpu=spec.gpu,
                register=spec.register,
            )
        except numapin.Error as e:
            # (on_request means no slot_bytes was given: torch's path it is.)
            self.pool.close()
            self.pool = NoPool(str(e).splitlines()[0])
            _fell_back(self.pool.why, getattr(e, "fix", None) or "raise the limit named, or use fewer workers", 6)
        except BaseException:
            self.pool.close()  # nothing of the pool outlives an error
            raise

    def provision(self, nbytes: int) -> None:
        """Makes the pool's slots of ``nbytes`` (main process). Where that
        fails (a memory or memlock limit) and no ``slot_bytes`` was asked
        for, says so once and leaves the pool unmade: batches take torch's
        path, as torch's own loader works under that limit."""
        if self.failed is not None:
            return
        spec = self.spec
        try:
            self.pool.provision(spec.nslots, max(nbytes, 1), gpu=spec.gpu, register=spec.register)
        except numapin.Error as e:
            if spec.slot_bytes is not None:
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
        self.ref.forget()

"""The collate of ``numapin.torch.DataLoader``: the function its workers run
on each batch's samples (:class:`SlotCollate`), which stacks them straight
into a free slot of the pool, or copies a user ``collate_fn``'s result into
one. What crosses the worker's queue is a :class:`SlotBatch`: the slot and
the batch's structure with a :class:`Leaf` (offset, size, dtype, shape)
where each tensor was. A batch that cannot have a slot takes torch's
ordinary path as a :class:`Plain` batch, with the :class:`Fallback` that
says why.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch.utils.data._utils.collate import collate as _torch_collate
from torch.utils.data._utils.collate import default_collate, default_collate_fn_map

from numapin import _dlprofile, _numapin, _slotcopy
from numapin._loader_worker import NoPool, PoolRef, worker_id

#: Offsets of tensors in a slot are multiples of this (DMA- and cache-friendly).
ALIGN = 512
#: Slot size headroom over the first batch's bytes, a thirty-second (later
#: batches larger than a slot take torch's path, with a warning that says
#: to give ``slot_bytes``). Every slot pays it: with an eighth, the pool of
#: a 64 MiB batch held 9% more host memory than torch's loader.
HEADROOM = 1.03125


class Fallback(enum.StrEnum):
    """Why a batch took torch's ordinary path (the keys of the loader's
    ``stats()["plain_batches"]``)."""

    UNSIZED = "unsized"
    """Collated before the pool existed."""
    LARGE = "large"
    """More bytes than a slot."""
    BUSY = "busy"
    """No slot came free in time."""
    FOREIGN = "foreign"
    """Tensors a slot cannot hold: sparse, quantized, or of a dtype numapin
    does not hand out (not warned about)."""
    UNMAPPED = "unmapped"
    """No pool could be made or mapped."""


class NoRoom(Exception):
    """The batch does not fit its slot."""


class Foreign(NoRoom):
    """The batch holds a tensor a slot cannot (:attr:`Fallback.FOREIGN`)."""


SLOT_DTYPES = frozenset(_numapin.dtypes())


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def slottable(t: torch.Tensor) -> bool:
    """Whether tensor ``t`` can be written into a slot and rebuilt from it."""
    return (
        t.layout == torch.strided
        and not t.is_quantized
        and t.device.type == "cpu"
        and dtype_name(t.dtype) in SLOT_DTYPES
    )


class Leaf:
    """Where one tensor of a batch lies in its slot."""

    __slots__ = ("offset", "nbytes", "dtype", "shape")

    def __init__(self, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...]) -> None:
        self.offset, self.nbytes, self.dtype, self.shape = offset, nbytes, dtype, shape


class SlotBatch:
    """A batch written into slot ``slot``: the nested structure with
    :class:`Leaf` where its tensors were."""

    __slots__ = ("slot", "used", "tree")

    def __init__(self, slot: int, used: int, tree: Any) -> None:
        self.slot, self.used, self.tree = slot, used, tree


class Plain:
    """A batch that took torch's ordinary path, and why."""

    __slots__ = ("data", "why", "nbytes")

    def __init__(self, data: Any, why: Fallback, nbytes: int) -> None:
        self.data, self.why, self.nbytes = data, why, nbytes


def tensor_bytes(tree: Any) -> int:
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


def tree_map(x: Any, f: Callable[[Any], Any]) -> Any:
    """Applies ``f`` to every leaf of a nested batch, keeping its structure."""
    if isinstance(x, (torch.Tensor, Leaf)):
        return f(x)
    if isinstance(x, Mapping):
        out = {k: tree_map(v, f) for k, v in x.items()}
        try:
            return type(x)(out)
        except TypeError:
            return out
    if isinstance(x, (list, tuple)):
        return _rebuild(x, [tree_map(v, f) for v in x])
    return x


class Writer:
    """Places tensors one after another in a slot (in a worker)."""

    def __init__(self, pool: Any, slot: int) -> None:
        self.pool, self.slot, self.used = pool, slot, 0
        self.size = pool.slot_bytes

    def place(self, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, Leaf]:
        if dtype_name(dtype) not in SLOT_DTYPES:
            raise Foreign
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        if self.used + nbytes > self.size:
            raise NoRoom
        leaf = Leaf(self.used, nbytes, dtype_name(dtype), tuple(shape))
        view = torch.from_dlpack(self.pool.view(self.slot, self.used, nbytes, leaf.dtype, list(shape)))
        self.used += -(-nbytes // ALIGN) * ALIGN
        return view, leaf

    def copy(self, t: torch.Tensor) -> Leaf:
        if not slottable(t):
            raise Foreign
        view, leaf = self.place(t.dtype, tuple(t.shape))
        with torch.no_grad():
            view.copy_(t.resolve_conj().resolve_neg())
        return leaf


def estimate(samples: list[Any]) -> int:
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
    return tensor_bytes(samples) + 8 * numbers + ALIGN * leaves


def collate_into(samples: list[Any], w: Writer) -> Any:
    """torch's default collate of ``samples``, each stack written into the
    slot of ``w``: the batch's structure with a :class:`Leaf` per tensor."""

    def stack(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> Leaf:
        elem = batch[0]
        if not all(slottable(t) for t in batch):
            raise Foreign
        fast = _slotcopy.stack(w, batch, Leaf, ALIGN)
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
    return tree_map(tree, lambda x: w.copy(x) if isinstance(x, torch.Tensor) else x)


def _no_room(e: NoRoom) -> Fallback:
    return Fallback.FOREIGN if isinstance(e, Foreign) else Fallback.LARGE


class SlotCollate:
    """The collate function the workers run: collates into a slot and
    returns a :class:`SlotBatch` (or a :class:`Plain` batch).

    ``ref``: the way to the pool (its path, when pickled for a worker).
    ``wait``: seconds a worker that finds the pool not provisioned yet
    waits for it, after asking for slots of its batch's size (the main
    process provisions on request); 0 to send the batch down torch's path
    at once (the main process then sizes the pool by it). ``first_waits``:
    whether worker 0's first batch (the first the main process takes) waits
    too; when not, it takes torch's path while the pool is made."""

    def __init__(
        self,
        ref: PoolRef,
        user: Callable[[list[Any]], Any] | None,
        timeout: float,
        wait: float = 0.0,
        ask: bool = False,
        first_waits: bool = True,
    ) -> None:
        self.ref, self.user, self.timeout, self.wait, self.ask = ref, user, timeout, wait, ask
        self.first_waits = first_waits
        self._called = False
        self._pool: Any = None
        # num_workers=0: collate runs in the main process, which sizes and
        # makes the pool itself from the first batch.
        self.provision_here: Callable[[int], None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
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
            self._pool = self.ref.get()
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
        if isinstance(pool, NoPool):
            data = self._ordinary(samples)
            return Plain(data, Fallback.UNMAPPED, tensor_bytes(data))
        if not pool.ready:
            wait = self.wait if self.first_waits or not first or worker_id() != 0 else 0.0
            if wait <= 0 and self.provision_here is None:
                # Not waiting: this batch takes torch's path while the main
                # process makes the pool it is asked for (when asking).
                data = self._ordinary(samples)
                nbytes = tensor_bytes(data)
                if self.ask:
                    pool.request(int(max(nbytes, 1) * HEADROOM))
                return Plain(data, Fallback.UNSIZED, nbytes)
            if self.user is None:
                need = estimate(samples)
            else:
                data = self.user(samples)
                need = tensor_bytes(data)
            if self.provision_here is not None:
                self.provision_here(int(max(need, 1) * HEADROOM))
            else:
                pool.request(int(max(need, 1) * HEADROOM))
            if not pool.wait_ready(wait):
                if data is None:
                    data = self._ordinary(samples)
                return Plain(data, Fallback.UNSIZED, tensor_bytes(data))
        slot = pool.acquire(self.timeout)
        if slot is None:
            if data is None:
                data = self._ordinary(samples)
            return Plain(data, Fallback.BUSY, tensor_bytes(data))
        try:
            w = Writer(pool, slot)
            if self.user is None:
                tree = collate_into(samples, w)
            else:
                if data is None:
                    data = self.user(samples)
                try:
                    tree = tree_map(data, w.copy)
                except NoRoom as e:
                    pool.release(slot)
                    return Plain(data, _no_room(e), tensor_bytes(data))
            return SlotBatch(slot, w.used, tree)
        except NoRoom as e:
            pool.release(slot)
            data = self._ordinary(samples)
            return Plain(data, _no_room(e), tensor_bytes(data))
        except BaseException:
            pool.release(slot)
            raise

"""``numapin.torch.CheckpointStager``: a stager for
``torch.distributed.checkpoint.async_save`` (its ``AsyncStager`` protocol)
that copies each rank's state dict into pinned memory on its GPU's NUMA
node, made once and reused, counted in numapin's budget."""

from __future__ import annotations

import copy
import io
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

import numapin
from numapin import _numapin
from numapin._errors import BudgetError, InputError
from numapin._save import check_dense

__all__ = ["CheckpointStager"]

#: Leaves DCP keeps as they are (the rest of the non-tensors are deep-copied
#: at each stage, as DCP's own stagers do).
_IMMUTABLE = (int, float, str, bytes, type(None), bool)


def _dtensor_class() -> Any:
    import sys

    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def _sharded_tensor_class() -> Any:
    import sys

    mod = sys.modules.get("torch.distributed._shard.sharded_tensor")
    return getattr(mod, "ShardedTensor", None) if mod is not None else None


def _local(value: Any, dtensor: Any) -> Any:
    """The tensor a leaf stages: a DTensor's local shard, or the tensor."""
    return value._local_tensor if dtensor is not None and isinstance(value, dtensor) else value


def _walk(obj: Any, path: str, out: list[tuple[str, Any]], dtensor: Any, sharded: Any) -> None:
    """The tensor leaves of ``obj`` (a state dict: dicts, lists and tuples
    of tensors, DTensors and other values), in order, with their paths."""
    if sharded is not None and isinstance(obj, sharded):
        raise InputError(
            f"{path or 'the state dict'} is a ShardedTensor\n"
            "  fix: use DTensor state dicts (torch.distributed.checkpoint.state_dict), or DCP's default stager"
        )
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _walk(v, f"{path}.{k}" if path else str(k), out, dtensor, sharded)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}.{i}" if path else str(i), out, dtensor, sharded)


def _signature(leaves: list[tuple[str, Any]], dtensor: Any) -> list[tuple[str, Any, tuple[int, ...]]]:
    out = []
    for path, v in leaves:
        t = _local(v, dtensor)
        out.append((path, t.dtype, tuple(t.shape)))
    return out


class CheckpointStager:
    """Stages a state dict for ``torch.distributed.checkpoint.async_save``
    (``async_stager=``): a training-safe copy of every tensor in pinned
    memory on the node of the rank's GPU, from numapin's arena (counted in
    that node's budget; a :class:`numapin.BudgetError` names what is short
    when it does not fit), made on the first stage (or ahead, with
    :meth:`prepare`, say at start-up on a thread of its own) and reused by
    every later stage of a state dict of the same tensors (names, dtypes,
    shapes; another state dict makes it anew).

    Each stage copies the GPU's tensors on a side stream of each device,
    after the work already queued on its current stream, at the
    device-to-host link's rate (the memory is pinned and registered: no
    bounce, no page faults); tensors on the CPU are copied too. With
    ``async_staging=False`` (the default) :meth:`stage` returns the staged
    dict once the copies are done, so when ``async_save`` returns the GPU
    tensors may change; :meth:`synchronize_staging` has nothing left to
    wait for. With ``async_staging=True``, :meth:`stage` returns a
    ``Future`` at once (``async_save`` then returns an ``AsyncSaveResponse``
    whose ``staging_completion`` is done when the copies are) and training
    may overlap them, as long as it waits (``staging_completion.result()``
    or :meth:`synchronize_staging`) before it changes the tensors.

    Works with DCP's ``FileSystemWriter`` unchanged: each staged tensor is
    a CPU tensor with a storage of its own size (DCP's writer does not copy
    it again). Since the staged copy is reused, the previous save must have
    been written (its future's ``result()``) before the next
    ``async_save`` stages again, as with DCP's caching stagers.

    For one file per rank (Hugging Face style) instead of DCP's format,
    :meth:`save_safetensors` stages and writes with
    :func:`numapin.save_safetensors` on a thread of its own (O_DIRECT,
    several writes in flight), returning a future of the files written.

    ``device``: the GPU whose node the copy goes on (default: the CUDA
    device holding most of the state dict's bytes; torch's current device;
    else the calling thread's node); ``node``: a NUMA node instead.
    """

    _synchronize_after_execute: bool = False

    def __init__(self, device: Any = None, *, node: int | None = None, async_staging: bool = False) -> None:
        self._gpu: int | None = None
        if device is not None:
            d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
            if d.type != "cuda":
                raise InputError(f"device={device!r} is not a CUDA device\n  fix: pass a CUDA device, or node=")
            self._gpu = d.index if d.index is not None else torch.cuda.current_device()
        _, self._node = numapin._gpu_node(None, node)
        self._async = bool(async_staging)
        self._lock = threading.Lock()
        self._signature: list[tuple[str, Any, tuple[int, ...]]] | None = None
        self._staged: list[Any] = []
        self._shells: list[Any] = []
        self._bytes = 0
        self._streams: dict[int, Any] = {}
        self._pending: Future[Any] | None = None
        self._writes: Future[list[str]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    # -- the AsyncStager protocol -------------------------------------

    @property
    def should_synchronize_after_execute(self) -> bool:
        """Whether ``async_save`` calls :meth:`synchronize_staging` itself
        (false: a blocking stage is done when it returns; an asynchronous
        one returns a future that ``async_save`` hands back)."""
        return self._synchronize_after_execute

    def stage(self, state_dict: Any) -> Any:
        """The staged copy of ``state_dict`` (or, with ``async_staging``, a
        ``Future`` of it): the same structure, each tensor replaced by its
        pinned CPU copy, other values as DCP's stagers keep them. The copy
        is numapin's pinned memory: not mapped in a forked child (a process
        forked from this one dies with ``SIGSEGV`` reading it)."""
        self._check_open()
        dtensor, sharded = _dtensor_class(), _sharded_tensor_class()
        leaves: list[tuple[str, Any]] = []
        _walk(state_dict, "", leaves, dtensor, sharded)
        with self._lock:
            self.synchronize_staging()
            self._ensure(leaves, dtensor)
            events, held = self._copy(leaves, dtensor)
            staged = self._rebuild(state_dict, iter(self._shells), dtensor, sharded)
            if not self._async:
                for e in events:
                    e.synchronize()
                return staged
            fut: Future[Any] = Future()
            self._pending = fut
            self._pool().submit(self._finish, events, held, staged, fut)
            return fut

    def synchronize_staging(self) -> None:
        """Waits until the last :meth:`stage`'s copies are done (nothing to
        wait for after a blocking stage)."""
        p = self._pending
        if p is not None:
            p.result()
            self._pending = None

    def close(self) -> None:
        """Waits for the last stage and write, then gives the pinned memory
        back to numapin's arena. The stager may not stage again."""
        if self._closed:
            return
        try:
            self.synchronize_staging()
            if self._writes is not None:
                self._writes.result()
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._drop()

    def __enter__(self) -> CheckpointStager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- more ---------------------------------------------------------

    def prepare(self, state_dict: Any) -> None:
        """Makes the pinned copy for ``state_dict``'s tensors now (what the
        first :meth:`stage` would do), without copying: at start-up, on a
        thread of its own, so that the first save stalls training no
        longer than the later ones."""
        self._check_open()
        dtensor, sharded = _dtensor_class(), _sharded_tensor_class()
        leaves: list[tuple[str, Any]] = []
        _walk(state_dict, "", leaves, dtensor, sharded)
        with self._lock:
            self._ensure(leaves, dtensor)
            self._warm(leaves, dtensor)

    @property
    def staged_bytes(self) -> int:
        """Bytes of tensors the staged copy holds (pinned on its node,
        rounded up to 256 bytes each and to 2 MiB in all)."""
        return self._bytes

    def save_safetensors(
        self, state_dict: Mapping[str, Any], path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Future[list[str]]:
        """Stages ``state_dict`` (names to tensors; the call returns once the
        GPU's tensors may change) and writes the staged copy with
        :func:`numapin.save_safetensors` (``metadata`` and ``kwargs`` are
        its own) on a thread of its own; returns a future of the files
        written. A later call first waits for this write."""
        self._check_open()
        if not isinstance(state_dict, Mapping):
            raise InputError(
                f"state_dict is a {type(state_dict).__name__}\n  fix: pass a dict of names to tensors"
            )
        if self._writes is not None:
            self._writes.result()
        staged = self.stage(state_dict)
        if isinstance(staged, Future):
            staged = staged.result()
        where = {"gpu": self._gpu_of_copy, "node": self._node} if self._node is not None else {"gpu": self._gpu_of_copy}
        kwargs = {**where, **kwargs}
        fut = self._pool().submit(numapin.save_safetensors, staged, path, metadata, **kwargs)
        self._writes = fut
        return fut

    # -- inside -------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InputError("this CheckpointStager was closed\n  fix: make a new one")

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="numapin-stager")
        return self._executor

    def _drop(self) -> None:
        self._staged, self._shells, self._signature, self._bytes = [], [], None, 0

    @property
    def _gpu_of_copy(self) -> int | None:
        return self._gpu

    def _ensure(self, leaves: list[tuple[str, Any]], dtensor: Any) -> None:
        """Makes the staged copy for ``leaves`` unless it is made already."""
        sig = _signature(leaves, dtensor)
        if sig == self._signature:
            return
        self._drop()
        tensors = [_local(v, dtensor) for _, v in leaves]
        for (path, _), t in zip(leaves, tensors):
            check_dense(path, t, torch)
        if self._gpu is None:
            by: dict[int, int] = {}
            for t in tensors:
                if t.is_cuda:
                    by[t.device.index] = by.get(t.device.index, 0) + t.nbytes
            self._gpu = max(by, key=lambda g: by[g]) if by else numapin._storage._default_gpu(None, None)
        parts = [("uint8", [t.nbytes]) for t in tensors]
        total = sum(-(-n // 256) * 256 for _, (n,) in parts)
        try:
            bufs = _numapin.staging_buffers(parts, gpu=None if self._node is not None else self._gpu, node=self._node)
        except BudgetError as e:
            where = f"node {self._node}" if self._node is not None else f"the node of GPU {self._gpu}"
            raise BudgetError(
                f"the checkpoint stager needs {total} bytes of pinned memory on {where} for "
                f"{len(tensors)} tensors, and the node's budget does not have them: {e}"
            ) from e
        staged = []
        for b, t in zip(bufs, tensors):
            raw = numapin._wrap(b, "torch")
            staged.append(raw.view(t.dtype).view(t.shape))
        self._staged = staged
        self._shells = [self._shell(v, s, dtensor) for (_, v), s in zip(leaves, staged)]
        self._signature = sig
        self._bytes = total

    @staticmethod
    def _shell(value: Any, staged: Any, dtensor: Any) -> Any:
        """What the staged dict holds for ``value``: its staged tensor, or
        for a DTensor a CPU DTensor of the same spec over it."""
        if dtensor is not None and isinstance(value, dtensor):
            shell = value.detach().to("cpu") if value.device.type != "cpu" else copy.deepcopy(value.detach())
            shell._local_tensor = staged
            return shell
        return staged

    def _stream(self, dev: int) -> Any:
        s = self._streams.get(dev)
        if s is None:
            s = self._streams[dev] = torch.cuda.Stream(device=dev)
        return s

    def _warm(self, leaves: list[tuple[str, Any]], dtensor: Any) -> None:
        """Makes each device's side stream and copies a byte of its first
        tensor through it: what a first copy sets up is set up ahead."""
        seen = set()
        for (_, v), dst in zip(leaves, self._staged):
            src = _local(v, dtensor)
            if not src.is_cuda or src.numel() == 0 or src.device.index in seen:
                continue
            seen.add(src.device.index)
            s = self._stream(src.device.index)
            s.wait_stream(torch.cuda.current_stream(src.device.index))
            with torch.cuda.stream(s):
                dst.reshape(-1)[:1].copy_(src.detach().reshape(-1)[:1], non_blocking=True)
            s.synchronize()

    def _copy(self, leaves: list[tuple[str, Any]], dtensor: Any) -> tuple[list[Any], list[Any]]:
        """Queues every tensor's copy into its staged place; returns the
        events marking their end (one per device) and the sources to hold
        until then."""
        by_dev: dict[int, list[tuple[Any, Any]]] = {}
        held = []
        for (_, v), dst in zip(leaves, self._staged):
            src = _local(v, dtensor).detach()
            held.append(src)
            if src.is_cuda:
                by_dev.setdefault(src.device.index, []).append((dst, src))
            else:
                dst.copy_(src)
        events = []
        for dev, pairs in by_dev.items():
            s = self._stream(dev)
            s.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(s):
                for dst, src in pairs:
                    dst.copy_(src, non_blocking=True)
                e = torch.cuda.Event()
                e.record(s)
            events.append(e)
        return events, held

    @staticmethod
    def _finish(events: list[Any], held: list[Any], staged: Any, fut: Future[Any]) -> None:
        try:
            for e in events:
                e.synchronize()
            fut.set_result(staged)
        except BaseException as e:  # noqa: BLE001 - handed to the future
            fut.set_exception(e)
        finally:
            held.clear()

    def _rebuild(self, obj: Any, shells: Any, dtensor: Any, sharded: Any) -> Any:
        """``obj`` with each tensor leaf replaced by the next staged shell."""
        if isinstance(obj, torch.Tensor):
            return next(shells)
        if isinstance(obj, Mapping):
            return {k: self._rebuild(v, shells, dtensor, sharded) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._rebuild(v, shells, dtensor, sharded) for v in obj]
            return tuple(items) if isinstance(obj, tuple) else items
        if isinstance(obj, _IMMUTABLE) or isinstance(obj, io.BytesIO):
            return obj
        return copy.deepcopy(obj)

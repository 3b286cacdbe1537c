"""What a forked DataLoader worker cannot read: tensors and arrays over
memory numapin lent (``numapin.empty``, ``numapin.pin``,
``load_safetensors(device=None)``, a ``SharedBuffer``'s views, a
``CheckpointStager``'s copy, pinned CPU batches), which is
``MADV_DONTFORK`` and so not mapped in a forked child, where reading it
ends the worker with ``SIGSEGV`` (docs/python.md, "Processes").

:func:`check_before_fork` looks through what the workers get (the dataset,
a collate function or worker_init_fn that is an object) before torch forks
them, and raises :class:`numapin.InputError` naming the first such tensor
and the fixes. Torch-free: tensors and arrays are recognised through
``sys.modules``.
"""

from __future__ import annotations

import functools
import multiprocessing
import sys
import types
from collections import deque
from typing import Any, Iterator

import numapin
from numapin import _numapin

#: Objects looked at, at most, per check (past this, the rest is not looked
#: at; a list of a million file names takes about 0.1 s).
MAX_OBJECTS = 2_000_000

# Values that hold no tensor (nothing to look into).
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice,
           types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
           types.CodeType, memoryview)


def start_method(context: Any) -> str:
    """The start method torch's workers will use: ``context``'s (a
    multiprocessing context or its name), else the default context's, as
    torch takes it."""
    if context is None:
        return multiprocessing.get_context().get_start_method()
    if isinstance(context, str):
        return context
    return str(context.get_start_method())


def _nothing_lent() -> bool:
    """Whether this process has lent no memory at all (the usual case: the
    check is then one call)."""
    return _numapin._lent_at([(0, sys.maxsize * 2 + 1)]) is None


def _children(obj: Any) -> Iterator[tuple[Any, Any]]:
    """``(key, value)`` for what ``obj`` holds that may hold a tensor (not
    strings, numbers, ...): items of containers (key: the index, or the
    dict's key), attributes of objects (key: ``".name"``), a partial's
    arguments, a method's object."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(v, _LEAVES):
                yield k, v
    elif isinstance(obj, (list, tuple, deque)):
        for i, v in enumerate(obj):
            if not isinstance(v, _LEAVES):
                yield i, v
    elif isinstance(obj, (set, frozenset)):
        for v in obj:
            if not isinstance(v, _LEAVES):
                yield ..., v
    elif isinstance(obj, functools.partial):
        yield ".func", obj.func
        yield ".args", obj.args
        yield ".keywords", obj.keywords or {}
    elif isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
    else:
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            for k, v in d.items():
                if not isinstance(v, _LEAVES):
                    yield f".{k}", v
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if isinstance(name, str) and name not in ("__dict__", "__weakref__"):
                    try:
                        yield f".{name}", object.__getattribute__(obj, name)
                    except AttributeError:
                        pass


def _path(trail: tuple[Any, ...] | None) -> str:
    """``dataset.data[3]['x']`` from a trail of keys (innermost last,
    nested as ``(outer, key)`` pairs)."""
    keys: list[Any] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    out = ""
    for key in reversed(keys):
        if isinstance(key, str) and key.startswith("."):
            out += key
        elif key is ...:
            out += "[...]"
        elif out:
            out += f"[{key!r}]"
        else:
            out = str(key)
    return out


def _span(obj: Any, torch: Any, np: Any) -> tuple[int, int] | None:
    """The host memory a CPU tensor or array is over: (address, bytes)."""
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu" or obj.layout != torch.strided:
            return None
        try:
            st = obj.untyped_storage()
            return int(st.data_ptr()), int(st.nbytes())
        except (RuntimeError, NotImplementedError):
            return None
    if np is not None and isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            return None
        return int(obj.__array_interface__["data"][0]), int(obj.nbytes)
    return None


def _spans(roots: dict[str, Any]) -> tuple[list[tuple[int, int]], list[Any]]:
    """The tensors and arrays reachable from ``roots`` (name -> object),
    each once: their spans and the trails to them (:func:`_path`)."""
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    arrays = tuple(t for t in (getattr(torch, "Tensor", None), getattr(np, "ndarray", None)) if t is not None)
    spans: list[tuple[int, int]] = []
    trails: list[Any] = []
    seen: set[int] = set()
    todo: list[tuple[Any, Any]] = [((None, name), obj) for name, obj in reversed(roots.items())]
    looked = 0
    while todo and looked < MAX_OBJECTS:
        trail, obj = todo.pop()
        looked += 1
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if arrays and isinstance(obj, arrays):
            span = _span(obj, torch, np)
            if span is not None and span[1] > 0:
                spans.append(span)
                trails.append(trail)
            continue
        try:
            kids = list(_children(obj))
        except Exception:  # an object whose attributes raise: not looked into
            continue
        looked += len(kids)
        todo.extend(((trail, key), v) for key, v in reversed(kids))
    return spans, trails


def check_before_fork(roots: dict[str, Any]) -> None:
    """Raises :class:`numapin.InputError` when something reachable from
    ``roots`` (name -> object: the dataset, ...) is a tensor or array over
    memory numapin lent, which a forked worker does not have."""
    if _nothing_lent():
        return
    spans, trails = _spans(roots)
    found = _numapin._lent_at(spans) if spans else None
    if found is None:
        return
    index, made_by = found
    shared = "SharedBuffer" in made_by
    raise numapin.InputError(
        f"numapin.torch.DataLoader: {_path(trails[index])} is over pinned memory made by {made_by}, which a "
        "forked worker does not have (numapin's pinned memory is MADV_DONTFORK, so that a fork "
        "never copies it: reading it would end the worker with SIGSEGV)\n"
        "  fix: keep the dataset's data in ordinary memory (tensor.clone(), numpy.array(a)): the "
        "loader pins each batch itself; or pass multiprocessing_context=\"forkserver\" (or "
        "\"spawn\"): the dataset is then sent to each worker (torch moves its tensors into "
        "shared memory, unpinned)"
        + (", or attach the SharedBuffer by name in the worker (SharedBuffer.attach)" if shared else "")
        + "; or num_workers=0"
    )

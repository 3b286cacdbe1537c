"""Per-stage timers of ``numapin.torch.DataLoader``, for finding where a
loader's time goes (``python/bench/dataloader.py``; docs/BENCHMARKS.md).

Off unless ``NUMAPIN_DATALOADER_PROFILE_DIR`` names a folder: then every
process of a loader (the main process and each worker) adds up the time of
its stages and writes them, at most once a second, to
``<folder>/<pid>.json`` as ``{"role": ..., "stages": {name: [seconds,
count]}}``; :func:`read` sums a folder's files by role.

Worker stages: ``collate`` (a batch into its slot, from the samples),
``between`` (from one collate's end to the next one's start: the dataset
making the samples, the result queue, waiting for an index), ``acquire``
(waiting for a free slot), ``write`` (numapin's copy of the samples into the
slot), ``view`` (making a slot view). Main-process stages: ``next`` (torch's
iterator handing over a descriptor: waiting for workers, the queue,
unpickling) and ``deliver`` (numapin's copy to the device and the tensors
over it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

DIR = os.environ.get("NUMAPIN_DATALOADER_PROFILE_DIR", "")
ENABLED = bool(DIR)

_stages: dict[str, list[float]] = {}
_role = "main"
_last_dump = 0.0
_last_end = [0.0]


def _reset() -> None:
    """A forked worker starts with timers of its own."""
    global _role, _last_dump
    _stages.clear()
    _role, _last_dump = "main", 0.0
    _last_end[0] = 0.0


os.register_at_fork(after_in_child=_reset)


def add(name: str, seconds: float) -> None:
    s = _stages.setdefault(name, [0.0, 0])
    s[0] += seconds
    s[1] += 1


def dump(force: bool = False) -> None:
    """Writes this process's stages (at most once a second unless ``force``)."""
    global _last_dump
    now = time.perf_counter()
    if not ENABLED or (not force and now - _last_dump < 1.0):
        return
    _last_dump = now
    path = os.path.join(DIR, f"{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"role": _role, "stages": _stages}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


class _Timed:
    """A slot pool whose ``acquire``, ``write`` and ``view`` are timed."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        f = getattr(self._pool, name)
        if name not in ("acquire", "write", "view"):
            return f

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                add(name, time.perf_counter() - t)

        return timed


def pool(p: Any) -> Any:
    """``p`` with its worker-side calls timed (a worker's pool)."""
    global _role
    _role = "worker"
    return _Timed(p)


def collate(call: Callable[[Any], Any], samples: Any) -> Any:
    """Runs a worker's collate ``call(samples)``, timed, with the time since
    the last one ended."""
    t = time.perf_counter()
    if _last_end[0]:
        add("between", t - _last_end[0])
    try:
        return call(samples)
    finally:
        _last_end[0] = time.perf_counter()
        add("collate", _last_end[0] - t)
        dump()


class _TimedIter:
    """torch's iterator, each ``next`` timed (the main process)."""

    def __init__(self, it: Any) -> None:
        self._it = it

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)

    def __iter__(self) -> "_TimedIter":
        return self

    def __next__(self) -> Any:
        t = time.perf_counter()
        try:
            return next(self._it)
        finally:
            add("next", time.perf_counter() - t)
            dump()


def iterator(it: Any) -> Any:
    """torch's iterator ``it`` with its ``next`` timed."""
    return _TimedIter(it)


def read(folder: str) -> dict[str, dict[str, list[float]]]:
    """The stages of every process that wrote to ``folder``, summed by role."""
    out: dict[str, dict[str, list[float]]] = {}
    for name in os.listdir(folder):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        role = out.setdefault(d["role"] + "s" if d["role"] == "worker" else d["role"], {})
        for k, (s, n) in d["stages"].items():
            acc = role.setdefault(k, [0.0, 0])
            acc[0] += s
            acc[1] += n
    return out

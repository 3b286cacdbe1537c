"""Shared helpers for numapin's Python tests.

The arenas live in one process-wide runtime, made on first use, so tests
that configure it or change the process (bind, limits) run in a child
interpreter (`run_py`).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "topology"


def in_use() -> int:
    """Bytes of arena buffers handed out and not yet given back, all nodes."""
    import numapin

    gc.collect()
    return sum(s["bytes_in_use"] for s in numapin.stats())


@pytest.fixture
def no_leak():
    """Fails the test if it leaves arena buffers in use."""
    before = in_use()
    yield
    assert in_use() == before, "the test left numapin buffers in use"


LAUNCHER_VARS = [
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PMI_LOCAL_RANK",
]


def run_py(code: str, *, env: dict[str, str | None] | None = None, prefix: list[str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a child interpreter (same Python, this environment
    without the launchers' rank variables, plus `env`; a `None` value
    removes a variable), behind `prefix` (a command such as `taskset -c 0`)."""
    e = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    cmd = list(prefix or []) + [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)


def cuda_ok() -> bool:
    """Whether torch sees a CUDA device (GPU tests skip otherwise)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# NUMAPIN_REQUIRE (a comma list of needs, or "all"): tests skipped for
# want of a listed need fail instead, on a machine where they must run (as
# the Rust tests' `common::skip(Need, why)`). A skip says what it needs by
# `requires(need)` (a mark, checked before the test) or `skip(need, why)`
# (in its body); a plain `pytest.skip` needs nothing that NUMAPIN_REQUIRE
# names (a test that runs only where CUDA is *not* there, say), whatever
# words its reason uses.
NEEDS = {
    "gpu": "a CUDA GPU and torch with CUDA",
    "root": "root",
    "shared": "../shared/topologies, the real machines' data",
    "tool": "a program the test drives",
    "wheel": "the wheel ./dev.sh test builds (NUMAPIN_WHEEL)",
}


class NeedSkip(pytest.skip.Exception):  # type: ignore[misc,name-defined]
    """A skip for want of ``need`` (one of NEEDS)."""

    def __init__(self, need: str, why: str, at_test: bool = False) -> None:
        assert need in NEEDS, need
        super().__init__(why, _use_item_location=at_test)
        self.need = need


# Reported as pytest reports its own skips ("SKIPPED ...: why").
NeedSkip.__module__, NeedSkip.__qualname__ = "builtins", "Skipped"


def skip(need: str, why: str) -> None:
    """Skips the calling test for want of ``need`` (NUMAPIN_REQUIRE can make
    that a failure)."""
    raise NeedSkip(need, why)


def _met(need: str, arg: str | None) -> str | None:
    """Why ``need`` (with ``arg``: the program, for "tool") is not met here,
    or None when it is."""
    import shutil

    if need == "gpu":
        return None if cuda_ok() else "needs a CUDA GPU and torch with CUDA"
    if need == "root":
        return None if os.geteuid() == 0 else "needs root"
    if need == "shared":
        return None if (ROOT.parent / "shared" / "topologies").is_dir() else "../shared/topologies is not there"
    if need == "tool":
        missing = [t for t in (arg or "").split() if shutil.which(t) is None]
        return f"{', '.join(missing)} not installed" if missing else None
    if need == "wheel":
        return None if os.environ.get("NUMAPIN_WHEEL") else "NUMAPIN_WHEEL unset: ./dev.sh test builds the wheel and names it"
    raise AssertionError(need)


def requires(need: str, arg: str | None = None, why: str | None = None):
    """A mark: the test (or, as ``pytestmark``, the module) runs only where
    ``need`` is met (``"tool"``: every program in ``arg``, space-separated),
    and is a ``NeedSkip`` otherwise."""
    assert need in NEEDS, need
    return pytest.mark.numapin_requires(need, arg, why)


def pytest_configure(config):
    config.addinivalue_line("markers", "numapin_requires(need, arg, why): runs only where the need is met")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("numapin_requires"):
        need, arg, why = mark.args
        missing = _met(need, arg)
        if missing is not None:
            raise NeedSkip(need, why or missing, at_test=True)


def _required(need: str) -> bool:
    want = {n.strip() for n in os.environ.get("NUMAPIN_REQUIRE", "").split(",") if n.strip()}
    return "all" in want or need in want


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    exc = call.excinfo.value if call.excinfo is not None else None
    if report.skipped and isinstance(exc, NeedSkip) and _required(exc.need):
        report.outcome = "failed"
        report.longrepr = f"NUMAPIN_REQUIRE asks for {exc.need}, and this test was skipped: {exc.msg}"


def _machine_budget_file(name: str) -> bool:
    """The machine budget's state file (docs/arena.md): it records the
    regions a process keeps for reuse, which outlive a test by design, and
    goes with them (``numapin.trim()``, or the process's end)."""
    return os.path.basename(name).startswith("numapin-budget-")


def numapin_fds() -> list[str]:
    """This process's open memfds and files that numapin named (not the
    machine budget's state file)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "numapin" in target and not _machine_budget_file(target):
            out.append(target)
    return out


def _resource_tracker() -> int | None:
    """The pid of multiprocessing's resource tracker, if one was started: a
    spawn-context test (test_replica.py) starts it once and it lives as long
    as this process, by design, so it is not a child left behind."""
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    return getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)


def children() -> list[int]:
    """Live child processes of this process (zombies not yet reaped
    included), multiprocessing's resource tracker left out."""
    kids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                kids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    tracker = _resource_tracker()
    return [k for k in kids if k != tracker]


def shm_files() -> list[str]:
    """numapin's files in /dev/shm (it should make none that outlive it)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if "numapin" in n and not _machine_budget_file(n))
    except OSError:
        return []


@pytest.fixture
def nothing_left():
    """Fails the test if it leaves pinned bytes, numapin memfds or /dev/shm
    files, or child processes behind."""
    before = (in_use(), sorted(numapin_fds()), shm_files())
    yield
    import time

    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        now = (in_use(), sorted(numapin_fds()), shm_files())
        kids = children()
        if (now == before and not kids) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert now == before, f"left behind: {before} -> {now}"
    assert not kids, f"child processes left: {kids}"

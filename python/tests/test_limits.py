"""Running where users run: without CAP_IPC_LOCK and with the 64 KiB memlock
limit many distributions and containers set."""

from __future__ import annotations

import sys

import pytest

from conftest import run_py, requires

CODE = """
import numapin
try:
    a = numapin.empty(64 << 20, "uint8", like="numpy")
    print("made", a.nbytes, numapin.stats()[0]["registration"])
except numapin.LimitError as e:
    print("LimitError", isinstance(e, PermissionError))
    print(e)
"""


def limited(prefix_user: list[str]) -> list[str]:
    """`prlimit` to a 64 KiB memlock limit, then drop CAP_IPC_LOCK (which
    lets root ignore the limit), then whatever `prefix_user` adds."""
    return ["prlimit", "--memlock=65536:65536", "setpriv", "--bounding-set", "-ipc_lock",
            "--inh-caps", "-ipc_lock", *prefix_user]


@requires("tool", "prlimit setpriv")
def test_a_64k_memlock_limit_without_cuda_is_a_limit_error_with_the_fix():
    r = run_py(CODE, prefix=limited([]), env={"NUMAPIN_NO_CUDA": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "LimitError True", r.stdout
    text = r.stdout
    assert "RLIMIT_MEMLOCK is 64 KiB" in text, text
    assert "ulimit -l" in text and "--ulimit memlock=-1" in text, text


@requires("root", why="needs root to become nobody")
@requires("tool", "setpriv")
def test_as_nobody_too_when_the_interpreter_is_reachable():
    probe = run_py("import numapin; print('ok')",
                   prefix=["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"])
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run {sys.executable} with numapin here: {probe.stderr.strip()[-200:]}")
    r = run_py(CODE, prefix=limited(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]),
               env={"NUMAPIN_NO_CUDA": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("LimitError True"), r.stdout

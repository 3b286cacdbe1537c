"""The compiled module's type stubs (`_numapin.pyi`) against the module
itself, with mypy's stubtest: every name, signature, class and constant the
stub declares exists at run time with that shape, and nothing public is
missing from it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile

import pytest

from conftest import skip


def test_the_stubs_match_the_compiled_module():
    if importlib.util.find_spec("mypy") is None:
        skip("tool", "mypy not installed (./dev.sh test installs it)")
    with tempfile.TemporaryDirectory() as cwd:
        # From an empty folder: the installed package, not the source tree.
        r = subprocess.run(
            [sys.executable, "-m", "mypy.stubtest", "numapin._numapin"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout, r.stdout

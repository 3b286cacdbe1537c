"""The test switch NUMAPIN_REQUIRE: a skip for want of a need it lists
fails instead; a skip that needs nothing it names stays a skip, whatever
words its reason uses (a test that runs only where CUDA is *not* there
mentions CUDA)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

TESTS = '''
import pytest
from conftest import requires, skip

def test_plain():
    pytest.skip("CUDA is available: the GPU tests cover pinning")

def test_needs_gpu():
    skip("gpu", "no GPU here")

@requires("tool", "surely-no-such-program-here")
def test_needs_tool():
    pass

@requires("root")
def test_needs_root():
    pass
'''


def outcomes(tmp: Path, require: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMAPIN_REQUIRE"}
    if require is not None:
        env["NUMAPIN_REQUIRE"] = require
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(tmp)],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    out = {}
    for line in r.stdout.splitlines():
        test, _, rest = line.partition(" ")
        word = rest.split()[0] if rest.split() else ""
        if "::test_" in test and word in ("PASSED", "FAILED", "ERROR", "SKIPPED"):
            # A mark's need is checked at set-up: failing there is an ERROR.
            out[test.split("_")[-1]] = "FAILED" if word == "ERROR" else word
    return out


def test_skips_fail_by_their_need_not_by_the_words_of_their_reason(tmp_path):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs.py").write_text(TESTS)
    root = "PASSED" if os.geteuid() == 0 else "SKIPPED"
    assert outcomes(tmp_path, None) == {"plain": "SKIPPED", "gpu": "SKIPPED", "tool": "SKIPPED", "root": root}
    assert outcomes(tmp_path, "gpu") == {"plain": "SKIPPED", "gpu": "FAILED", "tool": "SKIPPED", "root": root}
    want_all = {"plain": "SKIPPED", "gpu": "FAILED", "tool": "FAILED", "root": "PASSED" if root == "PASSED" else "FAILED"}
    assert outcomes(tmp_path, "all") == want_all

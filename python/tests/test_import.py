"""The package as installed: imports nothing heavy, ships its types."""

from __future__ import annotations

import inspect
from pathlib import Path

import numapin
from conftest import run_py


def test_import_loads_neither_torch_nor_numpy():
    r = run_py(
        """
        import sys
        import numapin
        assert "torch" not in sys.modules, "torch imported"
        assert "numpy" not in sys.modules, "numpy imported"
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_types_ship_with_the_package():
    pkg = Path(numapin.__file__).parent
    assert (pkg / "py.typed").is_file()
    stub = (pkg / "_numapin.pyi").read_text()
    for name in ["def empty", "def pin_address", "def copy_to_device", "class PinnedBuffer", "def bind"]:
        assert name in stub, name


def test_every_public_name_is_documented():
    for name in numapin.__all__:
        obj = getattr(numapin, name)
        assert inspect.getdoc(obj), f"numapin.{name} has no docstring"


def test_error_classes_derive_from_the_builtin_ones_they_mean():
    assert issubclass(numapin.InputError, ValueError)
    assert issubclass(numapin.BudgetError, MemoryError)
    assert issubclass(numapin.LimitError, PermissionError)
    for c in (numapin.InputError, numapin.BudgetError, numapin.LimitError):
        assert issubclass(c, numapin.Error)

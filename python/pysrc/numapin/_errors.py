"""numapin's exception classes.

Every error numapin raises is a :class:`numapin.Error`. Its message says what
was read, what is wrong and (in ``fix``, also below the message) what to do;
``kind`` is ``"input"``, ``"budget"``, ``"permission"`` or ``"system"``.
"""

from __future__ import annotations

import builtins


class Error(Exception):
    """Base class of every numapin error (and the class of system failures:
    the CUDA driver, hwloc or a system call failed)."""

    fix: str | None = None
    """What to do about it, when numapin knows."""

    kind: str = "system"
    """``"input"``, ``"budget"``, ``"permission"`` or ``"system"``."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        # Raised with the fix below the message ("...\n  fix: what to do"):
        # the fix is also the attribute.
        if args and isinstance(args[0], str) and "\n  fix: " in args[0]:
            self.fix = args[0].split("\n  fix: ", 1)[1]


class InputError(Error, ValueError):
    """Something the caller gave cannot be used: an argument, a file, an
    environment variable, a GPU or node that is not there."""

    kind = "input"


class BudgetError(Error, MemoryError):
    """A node's pinned-memory budget is spent: free tensors first, ask for
    less, or raise the budget with :func:`numapin.configure`."""

    kind = "budget"


class LimitError(Error, builtins.PermissionError):
    """A permission or limit refused: the memlock limit (``ulimit -l``), a
    NUMA system call blocked by a container's seccomp profile, a cpuset."""

    kind = "permission"

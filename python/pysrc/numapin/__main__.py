"""The ``numapin`` command: ``numapin topo``, ``affinity``, ``exec``,
``bench`` and ``doctor``, installed with the wheel as a script and runnable
as ``python -m numapin``.

It is the Rust command-line tool itself, run inside this interpreter by the
compiled module: the same outputs and exit codes as the ``numapin`` binary
built with ``cargo install --path cli``, and ``numapin exec`` replaces this
process with the command, as the binary does.
"""

from __future__ import annotations

import os
import signal
import sys


def _default_signals() -> None:
    """Gives the signals Python changed at start-up back the actions a
    program started by the shell has, as the binary would have them: SIGINT
    (Python's KeyboardInterrupt handler, unless the parent ignored it),
    SIGPIPE and SIGXFSZ (Python ignores both). numapin then handles SIGINT
    itself (cleaning up before it ends), and ``numapin exec`` hands these
    actions on to the command."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    for name in ("SIGPIPE", "SIGXFSZ"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)


def main() -> None:
    """Runs ``numapin`` with this process's command line and exits with its
    exit code."""
    from numapin import _numapin

    _default_signals()
    # Whatever Python buffered goes out before numapin writes to the same
    # file descriptors directly.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    args = ["numapin", *sys.argv[1:]]
    code = _numapin.run_cli(args)
    # numapin flushed everything it wrote; leave without Python's shutdown
    # (it could only add output, such as a failed flush of a closed pipe).
    os._exit(code)


if __name__ == "__main__":
    main()

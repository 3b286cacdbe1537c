"""Shared pinned memory: made once by one process of a job on a GPU's node
and counted in its budget, mapped by name by the others (attaching costs a
mapping and a CUDA registration, no memory)."""

from __future__ import annotations

from typing import Any

from numapin import _numapin


class SharedBuffer:
    """Pinned host memory several processes of one machine map, for example
    a KV-cache offload tier shared by the ranks of a node.

    One process makes it with :meth:`create` (on the node of CUDA device
    ``gpu``, placed, locked and registered as :func:`numapin.empty` memory
    is, and counted once in that process's :func:`numapin.stats` under
    ``bytes_shared``); the others :meth:`attach` to it by name, as the same
    user. :meth:`view` gives tensors or arrays over it. The memory lives
    while any process holds the buffer or a view of it, and goes with the
    last one, crashes included: nothing is left in ``/dev/shm``. The job
    orders its own reads and writes across processes.

    A forked child does not inherit the mapping (``MADV_DONTFORK``): views
    made before the fork end the child with ``SIGSEGV`` when it reads them
    (:class:`numapin.torch.DataLoader` refuses a dataset holding one); the
    child attaches the buffer by name instead.
    """

    def __init__(self, inner: _numapin.SharedBuffer) -> None:
        self._inner = inner

    @classmethod
    def create(cls, name: str, nbytes: int, *, gpu: int | None = None, node: int | None = None) -> SharedBuffer:
        """Makes ``nbytes`` of shared pinned memory called ``name`` (1 to 64
        letters, digits, ``.``, ``_``, ``-``; not in use) on the node of CUDA
        device ``gpu`` (or NUMA node ``node``, or the calling thread's)."""
        import numapin

        if not isinstance(name, str):
            raise TypeError(f"name={name!r} is not a string\n  fix: pass a name of 1 to 64 letters, digits, '.', '_', '-'")
        n = numapin._int(nbytes, "nbytes", hi=2**62, fix="pass the buffer's size in bytes (1 or more)")
        gpu, node = numapin._gpu_node(gpu, node)
        return cls(_numapin.SharedBuffer.create(name, n, gpu=gpu, node=node))

    @classmethod
    def attach(cls, name: str, *, timeout: float = 0.0) -> SharedBuffer:
        """Maps the shared memory another process made as ``name``, waiting
        up to ``timeout`` seconds for it to appear."""
        if not isinstance(name, str):
            raise TypeError(f"name={name!r} is not a string\n  fix: pass the name the buffer was made with")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= 86400:
            from numapin._errors import InputError

            raise InputError(f"timeout={timeout!r} is not 0 to 86400 seconds\n  fix: pass seconds to wait, e.g. 5.0")
        return cls(_numapin.SharedBuffer.attach(name, timeout=float(timeout)))

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def nbytes(self) -> int:
        return self._inner.nbytes

    @property
    def node(self) -> int:
        """The NUMA node its pages are on."""
        return self._inner.node

    @property
    def registered(self) -> bool:
        """Whether it is registered with CUDA in this process."""
        return self._inner.registered

    @property
    def owner(self) -> bool:
        """Whether this process made it (and counts it in its budget)."""
        return self._inner.owner

    def view(self, dtype: Any, shape: Any = None, *, offset: int = 0, like: str = "torch") -> Any:
        """A CPU tensor (``like="numpy"``: a NumPy array) of ``dtype`` and
        ``shape`` (default: 1-D, as many elements as fit) over the bytes
        from ``offset`` on. It keeps the memory mapped while it lives."""
        import numapin

        name = numapin._dtype_name(dtype, like)
        numapin._check_like(like, name)
        dims = None if shape is None else list(numapin._shape(shape))
        if dims is not None:
            numapin._check_rank(dims, like)
        offset = numapin._int(offset, "offset", hi=2**63 - 1, fix="pass a byte offset inside the buffer (0 or more)")
        return numapin._wrap(self._inner.view(name, dims, offset=offset), like)

    def __repr__(self) -> str:
        return repr(self._inner).replace("SharedBuffer", "numapin.SharedBuffer", 1)

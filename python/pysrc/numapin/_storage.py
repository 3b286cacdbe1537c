"""Checkpoints and file ranges to a GPU, or to pinned CPU tensors, through
pinned memory on the GPU's own NUMA node (``numapin::storage``)."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Iterable

from numapin import _numapin
from numapin._errors import InputError

__all__ = ["load_safetensors", "locate", "read_to_device", "safetensors_shards"]


MAX_WORLD = 1 << 20
"""Largest world size of ``shard=`` and :func:`safetensors_shards`."""

MAX_NAMES = 1 << 20
"""Most names ``names=`` may give."""

MAX_THREADS = 1024
"""Largest ``threads=``."""

MAX_CHUNK_BYTES = 1 << 30
"""Largest ``chunk_bytes=``."""


def _env_int(var: str) -> int:
    """The integer in environment variable ``var`` (as torchrun sets it)."""
    fix = "run under torchrun (or set LOCAL_RANK and LOCAL_WORLD_SIZE), or pass shard=(rank, world_size)"
    text = os.environ.get(var)
    if text is None:
        raise InputError(f'shard="local" needs {var} in the environment, and it is not set\n  fix: {fix}')
    t = text.strip()
    if not (t.isascii() and t.isdigit()) or len(t) > 20:
        raise InputError(f'shard="local": {var}={text[:40]!r} is not a non-negative integer\n  fix: {fix}')
    return int(t)


def _shard(shard: Any) -> tuple[int | None, int | None]:
    """``(rank, world)`` of ``shard``: ``None``, ``(rank, world)`` or
    ``"local"`` (``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, as torchrun sets),
    each checked: ``0 <= rank < world <= MAX_WORLD`` (``InputError``)."""
    if shard is None:
        return None, None
    import numapin

    fix = f"pass shard=(rank, world_size) with 0 <= rank < world_size <= {MAX_WORLD}, or shard=\"local\""
    if isinstance(shard, str):
        if shard != "local":
            raise InputError(f"shard={shard[:40]!r} is not (rank, world_size) or \"local\"\n  fix: {fix}")
        what, rank, world = "LOCAL_RANK", _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE")
    else:
        try:
            rank, world = shard
        except (TypeError, ValueError):
            raise InputError(f"shard={shard!r} is not (rank, world_size)\n  fix: {fix}") from None
        what = "shard rank"
        rank = numapin._int(rank, "shard rank", hi=2**64 - 1, fix=fix)
        world = numapin._int(world, "shard world_size", lo=0, hi=2**64 - 1, fix=fix)
    if not 1 <= world <= MAX_WORLD:
        raise InputError(f"a world size of {world}: it must be from 1 to {MAX_WORLD}\n  fix: {fix}")
    if rank >= world:
        raise InputError(f"{what} {rank} of a world of {world}: the rank must be below the world size\n  fix: {fix}")
    return rank, world


def _names(names: Any) -> list[str] | None:
    """``names`` as a list of strings: ``None``, a name, or an iterable of
    at most ``MAX_NAMES`` names; anything else is a ``TypeError``."""
    if names is None:
        return None
    if isinstance(names, str):
        return [names]
    fix = 'pass names=["a", "b"] (tensor names as strings) or None'
    if isinstance(names, (bytes, bytearray, memoryview)):
        raise TypeError(f"names={names[:40]!r} is bytes, not tensor names\n  fix: {fix}")
    try:
        it = iter(names)
    except TypeError:
        raise TypeError(f"names={names!r} is not a list of tensor names ({type(names).__name__})\n  fix: {fix}") from None
    out: list[str] = []
    for n in it:
        if not isinstance(n, str):
            raise TypeError(f"names: {n!r} is not a tensor name ({type(n).__name__})\n  fix: {fix}")
        if len(out) == MAX_NAMES:
            raise InputError(f"names: more than {MAX_NAMES} names\n  fix: pass names=None to load every tensor")
        out.append(n)
    return out


def _readers(world: int | None) -> int:
    """The ranks reading at once on this machine, for numapin's chunk: the
    shard's or group's world size, at most ``LOCAL_WORLD_SIZE`` where a
    launcher set it (the other ranks are on other machines); 1 without a
    shard."""
    if not world:
        return 1
    try:
        local = _env_int("LOCAL_WORLD_SIZE")
    except InputError:  # unset or not a number: no launcher's word on it
        return world
    return local if 0 < local < world else world


def _read_opts(threads: Any, chunk_bytes: Any, io: Any, *, auto_chunk: bool = True) -> dict[str, Any]:
    """``threads``, ``chunk_bytes`` and ``io`` checked for the reader (or,
    without ``auto_chunk``, the writer, whose chunk is at least a byte),
    before a file is opened."""
    import numapin

    _numapin.check_io(io)
    fix = "pass 0 (numapin picks) or a chunk size such as 4194304" if auto_chunk else "pass a chunk size such as 8388608"
    return dict(
        threads=numapin._int(threads, "threads", hi=MAX_THREADS, fix="pass 0 (numapin picks) or a thread count"),
        chunk_bytes=numapin._int(chunk_bytes, "chunk_bytes", lo=0 if auto_chunk else 1, hi=MAX_CHUNK_BYTES, fix=fix),
        io=io,
    )


def _warn(report: dict[str, Any]) -> None:
    for w in report.get("warnings", []):
        warnings.warn(w, RuntimeWarning, stacklevel=3)


def _cuda_device(device: Any) -> Any:
    """``device`` as a ``torch.device`` of CUDA with an index."""
    import torch

    try:
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise InputError(
            f"device={device!r} is not a device ({str(e).splitlines()[0]})\n"
            "  fix: pass a CUDA device (\"cuda\", \"cuda:1\", an ordinal) or None for pinned CPU tensors"
        ) from None
    if d.type != "cuda":
        raise InputError(
            f"device={device!r} is not a CUDA device\n  fix: pass device=None for pinned CPU tensors, or a CUDA device"
        )
    if not torch.cuda.is_available():
        from numapin._errors import Error

        raise Error(
            f"device={device!r}: torch sees no CUDA device in this process\n"
            "  fix: pass device=None for pinned CPU tensors, or run where a GPU is visible (check CUDA_VISIBLE_DEVICES)"
        )
    if d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    if d.index >= torch.cuda.device_count():
        raise InputError(
            f"device={device!r}: this process sees {torch.cuda.device_count()} CUDA device(s)\n"
            "  fix: pass a device it sees (check CUDA_VISIBLE_DEVICES)"
        )
    return d


def _default_gpu(gpu: int | None, node: int | None) -> int | None:
    if gpu is not None or node is not None:
        return gpu
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return None


def load_safetensors(
    path_or_index: str | os.PathLike[str],
    device: Any = "cuda",
    names: Iterable[str] | None = None,
    *,
    shard: Any = None,
    group: Any = None,
    gpu: int | None = None,
    node: int | None = None,
    threads: int = 0,
    chunk_bytes: int = 0,
    io: str = "auto",
    stats: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Loads a safetensors checkpoint: a ``.safetensors`` file, or a
    ``model.safetensors.index.json`` and the shard files it names. Returns
    ``{name: torch.Tensor}`` equal to ``safetensors.torch.load_file``'s
    (same names, dtypes, shapes and values; sorted by name).

    ``device``: a CUDA device (``"cuda"``, the current one; ``"cuda:1"``;
    an ordinal; a ``torch.device``): each tensor is read from the file
    into pinned slots on that GPU's NUMA node by threads on its CPUs and
    copied to its place, the copy of each slot overlapping the next read;
    what the page cache holds is copied from it, the rest read with
    ``O_DIRECT``. ``None`` (or ``"cpu"``): pinned CPU tensors from numapin's
    arena, on the node of ``gpu`` (default: torch's current device when
    CUDA is up), or ``node``, or the calling thread's, read straight into
    place.

    ``names``: load only these tensors (a name, or an iterable of at most
    ``MAX_NAMES`` strings). ``shard``: ``(rank, world_size)`` or
    ``"local"`` (``LOCAL_RANK``/``LOCAL_WORLD_SIZE``): this rank's share
    of the (selected) tensors: the tensors in file order, cut into
    ``world_size`` contiguous runs of nearly equal bytes (see
    :func:`safetensors_shards` for every rank's names); ``0 <= rank <
    world_size <= MAX_WORLD``. ``"replica"``: every tensor on every rank of
    the ``torch.distributed`` process group ``group`` (default: the default
    group), each byte read from the files by one rank only (its share, as
    ``(rank, world_size)`` in the group) and broadcast to the others over
    the group (NCCL: GPU to GPU); every rank of the group must make the
    same call (same files, same ``names``), each with its own GPU, all on
    one machine. ``threads`` (0 to ``MAX_THREADS``), ``chunk_bytes`` (0, numapin's
    pick: 1 to 4 MiB, so that the slots of every rank of the ``shard`` or
    ``"replica"`` group on this machine (at most ``LOCAL_WORLD_SIZE`` where
    set) reading at once stay within half of the GPU's node's last-level
    cache, a load without ``shard`` counting as one reader; or up to
    ``MAX_CHUNK_BYTES``; ``stats["chunk_bytes"]`` says which), ``io`` (``"auto"``, ``"buffered"``,
    ``"direct"``): how the files are read. A file on a drive behind another
    NUMA node or socket than the GPU gives a ``RuntimeWarning``. ``stats``:
    a dict to fill with what the read did (as :func:`read_to_device`
    returns; with ``"replica"``, this rank's reads and a ``"replica"``
    entry: ``world_size``, ``read_bytes``, ``received_bytes``,
    ``seconds``).

    dtypes are torch's as safetensors' own loader makes them: ``F4`` is
    ``torch.float4_e2m1fn_x2`` (two elements a byte, the last dimension
    halved); the 6-bit ``F6_E2M3`` and ``F6_E3M2``, which torch has no
    type for, are an :class:`numapin.InputError` naming the file and the
    tensor (load the others with ``names=``).

    Every argument is checked before a file is opened: a wrong type is a
    ``TypeError``, a value out of range an :class:`numapin.InputError`.
    Bad files (truncated, a header that lies, an index naming files outside
    its folder, a directory, a FIFO, a file changed since it was opened)
    raise :class:`numapin.InputError` naming the file (and the tensor); a
    GPU without room for the tensors a :class:`numapin.Error` before any is
    allocated; nothing stays allocated or open.

    With ``device=None`` the tensors are numapin's pinned memory, which is
    not mapped in a forked child (``MADV_DONTFORK``: a DataLoader worker
    forked from this process dies with ``SIGSEGV`` reading them, and
    :class:`numapin.torch.DataLoader` refuses a dataset holding them; give a
    dataset ``t.clone()``s; docs/python.md, "Processes").
    """
    # Every argument is checked before a file is opened (the rest in _open).
    if stats is not None and not isinstance(stats, dict):
        raise TypeError(f"stats={stats!r} is not a dict\n  fix: pass a dict to fill, or None")
    if isinstance(shard, str) and shard == "replica":
        from numapin import _replica

        def prepare() -> Any:
            return _prepare(path_or_index, device, names, group, gpu, node, threads, chunk_bytes, io)

        out, report = _replica.load(prepare, group, _fallback_device(device))
    else:
        if group is not None:
            raise InputError(
                f"group= is for shard=\"replica\", not shard={shard!r}\n"
                "  fix: pass shard=\"replica\" to share the reading over the group, or drop group="
            )
        ck, sel, infos, dev, read, _ = _open(path_or_index, device, names, shard, gpu, node, threads, chunk_bytes, io)
        tensors, report = read(sel)
        out = {infos[i][0]: t for i, t in zip(sel, tensors)}
    _warn(report)
    if stats is not None:
        stats.update(report)
    return {k: out[k] for k in sorted(out)}


def _open(path_or_index: Any, device: Any, names: Any, shard: Any, gpu: Any, node: Any, threads: Any,
          chunk_bytes: Any, io: Any, readers: int | None = None) -> tuple[Any, list[int], list[Any], Any, Any, Any]:
    """The checkpoint opened, the selected tensors (indexes in file order),
    every tensor's ``(name, dtype, shape, nbytes, safetensors dtype)``, the
    device (``None``: pinned CPU tensors), and ``read(indexes) -> (tensors,
    report)`` and ``alloc(index) -> tensor`` for it. ``readers``: the
    group's size for ``"replica"`` (default: the shard's world size), see
    :func:`_readers`."""
    opts = _read_opts(threads, chunk_bytes, io)
    import numapin

    gpu, node = numapin._gpu_node(gpu, node)
    wanted = _names(names)
    rank, world = _shard(shard)
    opts["readers"] = _readers(readers or world)
    host = device is None or (isinstance(device, str) and device == "cpu")
    dev = None if host else _cuda_device(device)
    ck = _numapin.open_safetensors(_path(path_or_index))
    sel = ck.select(wanted, rank, world)
    # A tensor torch cannot hold is refused, naming its file, before
    # anything is allocated.
    ck.check_loadable(sel)
    infos = ck.tensors()
    import torch

    for i in sel:
        if not hasattr(torch, str(infos[i][1])):
            raise InputError(
                f"{path_or_index}: tensor {infos[i][0]!r} is {infos[i][4]}, and this torch ({torch.__version__}) "
                f"has no torch.{infos[i][1]}\n  fix: use a newer torch, or load the other tensors (names=...)"
            )
    target = _default_gpu(gpu, node) if dev is None else None

    def view(i: int, t: Any) -> Any:
        # F4 is handed out as bytes: NumPy and DLPack have no such type.
        return t.view(torch.float4_e2m1fn_x2) if infos[i][4] == "F4" else t

    def read_host(part: list[int]) -> tuple[list[Any], dict[str, Any]]:
        bufs, report = ck.load_to_host(part, gpu=target, node=node, **opts)
        from numapin import _wrap

        return [view(i, _wrap(b, "torch")) for i, b in zip(part, bufs)], report

    def alloc_host(i: int) -> Any:
        if infos[i][4] == "F4":
            return view(i, numapin.empty(infos[i][2], "uint8", gpu=target, node=node))
        return numapin.empty(infos[i][2], infos[i][1], gpu=target, node=node)

    if dev is None:
        return ck, sel, infos, None, read_host, alloc_host

    def alloc(i: int) -> Any:
        return torch.empty(infos[i][2], dtype=getattr(torch, str(infos[i][1])), device=dev)

    def read(part: list[int]) -> tuple[list[Any], dict[str, Any]]:
        stream = torch.cuda.current_stream(dev)
        with _DeviceTensors(torch, infos, part, dev, path_or_index) as made:
            report = ck.load_to_device(part, made.make, dev.index, int(stream.cuda_stream), **opts)
        return made.tensors(), report

    return ck, sel, infos, dev, read, alloc


def _prepare(path_or_index: Any, device: Any, names: Any, group: Any, gpu: Any, node: Any, threads: Any,
             chunk_bytes: Any, io: Any) -> Any:
    """What ``shard="replica"`` needs of this rank: the checkpoint opened,
    every group rank's share, the device, how to read and allocate."""
    from numapin import _replica

    dist, group = _replica.dist_group(group)
    world = dist.get_world_size(group)
    names = _names(names)  # once: an iterator would be spent by the first select
    ck, sel, infos, dev, read, alloc = _open(path_or_index, device, names, None, gpu, node, threads, chunk_bytes, io,
                                             readers=world)
    shares = [ck.select(names, r, world) for r in range(world)]
    import torch

    return _replica.Prepared(
        files=[str(f) for f in ck.files()], sel=sel, infos=infos, shares=shares,
        device=dev if dev is not None else torch.device("cpu"), read=read, alloc=alloc,
    )


def _fallback_device(device: Any) -> Any:
    """The device ``shard="replica"``'s collectives use on a rank that could
    not resolve ``device`` (so that it can still tell the others)."""
    torch = sys.modules.get("torch")
    if device is None or torch is None or (isinstance(device, str) and device == "cpu"):
        return None
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


class _DeviceTensors:
    """Empty tensors on ``dev`` for the tensors at ``sel`` (torch's caching
    allocator, as ``load_file`` allocates), made one by one by ``make(k)``
    (the ``k``-th of ``sel``; it returns the tensor's address) while the
    reader reads. A GPU without room for them all is a ``numapin.Error``
    on entry, before any is made (or, when another allocation takes the
    room meanwhile, on exit, after the ones made are given back)."""

    def __init__(self, torch: Any, infos: list[Any], sel: list[int], dev: Any, path: Any) -> None:
        self._torch, self._infos, self._sel, self._dev, self._path = torch, infos, sel, dev, path
        self._made: dict[int, Any] = {}
        self._need = sum(infos[i][3] for i in sel)

    def __enter__(self) -> _DeviceTensors:
        torch, dev = self._torch, self._dev
        free, _total = torch.cuda.mem_get_info(dev)
        room = free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        if self._need > room:
            raise self._short(f"has {room} bytes free")
        return self

    def make(self, k: int) -> int:
        _name, dtype, shape, _, _ = self._infos[self._sel[k]]
        t = self._torch.empty(shape, dtype=getattr(self._torch, dtype), device=self._dev)
        self._made[k] = t
        return int(t.data_ptr())

    def tensors(self) -> list[Any]:
        """The tensors in the order of ``sel`` (the reader asks for them
        a turn of files at a time, so not always in that order)."""
        return [self._made[k] for k in range(len(self._sel))]

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            return
        self._made.clear()
        torch = self._torch
        if issubclass(kind, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)):
            raise self._short("ran out of memory allocating them") from None

    def _short(self, what: str) -> Exception:
        from numapin._errors import Error

        return Error(
            f"{os.fspath(self._path)}: the selected tensors are {self._need} bytes, and GPU {self._dev.index} {what}\n"
            "  fix: free GPU memory, or load a part at a time (names=..., shard=...), or to pinned CPU memory (device=None)"
        )


def safetensors_shards(
    path_or_index: str | os.PathLike[str], world_size: int, names: Iterable[str] | None = None
) -> list[list[str]]:
    """The names each of ``world_size`` ranks loads with
    ``load_safetensors(..., shard=(rank, world_size))``: disjoint, together
    every (selected) tensor, each a contiguous run of the files."""
    import numapin

    world = numapin._int(
        world_size, "world_size", lo=1, hi=MAX_WORLD, fix=f"pass the number of ranks (1 to {MAX_WORLD})"
    )
    wanted = _names(names)
    ck = _numapin.open_safetensors(_path(path_or_index))
    return ck.shards(world, wanted)


def read_to_device(
    path: str | os.PathLike[str],
    offset: int,
    nbytes: int,
    out: Any,
    *,
    stream: Any = None,
    threads: int = 0,
    chunk_bytes: int = 0,
    io: str = "auto",
) -> dict[str, Any]:
    """Reads ``nbytes`` bytes of the file at ``path`` from byte ``offset``
    into the first ``nbytes`` bytes of contiguous tensor ``out``.

    For a CUDA tensor, through pinned slots on its GPU's node (as
    :func:`load_safetensors`), ordered after the work queued on ``stream``
    (default: torch's current stream on that device); for a CPU tensor,
    straight into it by threads on the calling thread's node. Returns when
    the bytes are there, with what the read did (``bytes``, ``seconds``,
    ``gbps``, ``cached_bytes``, ``direct_bytes``, ``buffered_bytes``,
    ``threads``, ``chunk_bytes`` (numapin's pick with the default 0),
    ``node``, ``warnings``).
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(out, torch.Tensor):
        raise InputError(f"out must be a torch tensor, not {type(out).__name__}\n  fix: pass a tensor")
    if not out.is_contiguous():
        raise InputError("out is not contiguous\n  fix: pass a contiguous tensor")
    room = out.numel() * out.element_size()
    import numapin

    fix = "pass a non-negative offset and at most the tensor's bytes"
    offset = numapin._int(offset, "offset", lo=-(2**63), hi=2**63 - 1, fix=fix)
    nbytes = numapin._int(nbytes, "nbytes", lo=-(2**63), hi=2**63 - 1, fix=fix)
    if offset < 0 or nbytes < 0 or nbytes > room:
        raise InputError(
            f"offset {offset}, nbytes {nbytes} into a tensor of {room} bytes\n"
            "  fix: pass a non-negative offset and at most the tensor's bytes"
        )
    opts = _read_opts(threads, chunk_bytes, io)
    p = _path(path)
    if out.is_cuda:
        s = stream if stream is not None else torch.cuda.current_stream(out.device)
        report = _numapin.read_to_device(
            p, offset, nbytes, out.data_ptr(), int(out.device.index), int(s.cuda_stream), **opts
        )
    elif out.device.type == "cpu":
        report = _numapin.read_to_host(p, offset, nbytes, out.data_ptr(), **opts)
    else:
        raise InputError(f"out is on {out.device}\n  fix: pass a CUDA or CPU tensor")
    _warn(report)
    return report


def locate(path: str | os.PathLike[str]) -> tuple[str, list[dict[str, Any]]]:
    """Where the file at ``path`` lives: a sentence (``nvme0n1p2 on nvme0n1
    (0000:41:00.0, node 1)``, ``nfs4 server:/export (no local drive)``) and
    its drives (``name``, ``pci_bus_id``, ``numa_node``, ``package``,
    ``kind``)."""
    return _numapin.locate(_path(path))


def _path(path: Any) -> str:
    """``path`` (a string or path-like) as a string without NUL bytes."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(f"path {path!r} is not a path ({type(path).__name__})\n  fix: pass a str or os.PathLike") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if "\0" in p:
        raise InputError(f"path {p!r} has a NUL byte\n  fix: pass the file's real path")
    return p

"""numapin for PyTorch and NumPy: pinned host memory on the GPU's own NUMA
node, NUMA-local staged copies, and binding a process near its GPU.

``import numapin`` imports neither torch nor NumPy: each is used when the
caller passes its objects or asks for them (``like="numpy"``).

- :func:`topology`: which GPU hangs off which socket, NUMA node and CPUs.
- :func:`bind`: bind this process (every thread, and its memory policy) near
  its GPU, as ``numapin exec`` does for launchers that run a wrapper.
- :func:`empty`: a CPU tensor (or NumPy array) in pinned memory on the GPU's
  node, registered with CUDA, of exactly the size asked for.
- :func:`pin`: a pinned copy of a CPU tensor or array on the GPU's node,
  made by threads on that node: the drop-in for ``tensor.pin_memory()``.
- :func:`copy_to_device` / :func:`copy_from_device`: staged copies between
  pageable CPU memory and CUDA tensors, ordered on a CUDA stream.
- :class:`SharedBuffer`: pinned memory several processes of a job map by
  name (made once, counted once).
- :func:`place`: the node and CPUs numapin uses for a GPU (the one answer
  every function here, the DataLoader and the storage reader ask).
- :func:`load_safetensors` / :func:`read_to_device`: checkpoints and file
  ranges to a GPU through pinned memory on its node (or to pinned CPU
  tensors); :func:`safetensors_shards`, :func:`locate`.
- :func:`configure`, :func:`stats`, :func:`trim`: the arenas behind it all.
- :func:`doctor`: what keeps GPU data movement slow or broken here (the
  checks of ``numapin doctor``, as :class:`DoctorCheck` objects to log).

Errors are :class:`Error` (system failures) and its subclasses
:class:`InputError`, :class:`BudgetError` and :class:`LimitError`; each
message ends with what to do (also in ``err.fix``).
"""

from __future__ import annotations

import json
import operator
import os
import sys
from dataclasses import dataclass
from typing import Any

from numapin import _numapin
from numapin._errors import BudgetError, Error, InputError, LimitError
from numapin._numapin import DoctorCheck, PinnedBuffer
from numapin._shared import SharedBuffer
from numapin._storage import load_safetensors, locate, read_to_device, safetensors_shards
from numapin._topology import Allowed, Gpu, NumaNode, Package, Topology, Warning, cpus

__all__ = [
    "Allowed",
    "BudgetError",
    "DoctorCheck",
    "Error",
    "Gpu",
    "InputError",
    "LimitError",
    "NumaNode",
    "Package",
    "PinnedBuffer",
    "RankPlan",
    "SharedBuffer",
    "Site",
    "Topology",
    "Warning",
    "bind",
    "configure",
    "copy_from_device",
    "copy_to_device",
    "doctor",
    "dtypes",
    "empty",
    "load_safetensors",
    "locate",
    "pin",
    "place",
    "read_to_device",
    "safetensors_shards",
    "stats",
    "topology",
    "trim",
]


def topology(input: str | os.PathLike[str] | None = None) -> Topology:
    """This machine's topology, or a saved machine's (``input``: an hwloc
    XML export, a ``numapin topo --json`` file, an NCCL topology XML or a
    captured filesystem root), as ``numapin topo`` reads it."""
    json_text, text = _numapin.topology(None if input is None else os.fspath(input))
    return Topology(json_text, text)


@dataclass(frozen=True)
class RankPlan:
    """The binding :func:`bind` applied (or, with ``input``, would apply)."""

    local_rank: int
    gpu: int | None
    """The GPU's index in :attr:`Topology.gpus` (PCI order)."""
    pci_bus_id: str | None
    cpus: list[int]
    """The CPUs every thread of the process may now run on."""
    mems: list[int]
    """The NUMA nodes its memory comes from."""
    warnings: list[str]
    chosen_by: str
    """How the GPU was chosen (the rank, its variable, or ``gpu=``)."""


def bind(
    local_rank: int | None = None,
    *,
    gpu: int | None = None,
    node: int | None = None,
    mode: str = "node",
    memory: str = "bind",
    input: str | os.PathLike[str] | None = None,
) -> RankPlan:
    """Binds the calling process near its GPU and returns the plan.

    The GPU is CUDA device ``gpu`` when given; otherwise the device of local
    rank ``local_rank`` (default: ``LOCAL_RANK``, ``SLURM_LOCALID``,
    ``OMPI_COMM_WORLD_LOCAL_RANK``, ... as ``numapin exec`` reads them), or
    the only GPU in ``CUDA_VISIBLE_DEVICES`` when the launcher gave this
    process one. Every thread of the process that nobody bound elsewhere
    moves to the GPU's CPUs (``mode``: ``node``, ``socket``, ``exclusive``,
    ``cache`` or ``core``, as ``numapin affinity`` plans them), and memory
    the calling thread allocates comes from the GPU's node (``memory``:
    ``"bind"``, ``"preferred"`` or ``"none"`` for CPUs only). Call it early,
    before starting threads or DataLoader workers: they inherit both.

    With ``node``, the process is bound to that NUMA node's CPUs and memory
    instead (for work that is not one rank per GPU). With ``input`` (a saved
    machine) nothing is bound: the plan is returned.
    """
    plan_json, why = _numapin.bind(
        local_rank,
        gpu=gpu,
        node=node,
        mode=mode,
        memory=memory,
        input=None if input is None else os.fspath(input),
    )
    p = json.loads(plan_json)
    return RankPlan(
        local_rank=p["local_rank"],
        gpu=p["gpu"],
        pci_bus_id=p["pci_bus_id"],
        cpus=cpus(p["cpus"]),
        mems=list(p["mems"]),
        warnings=list(p["warnings"]),
        chosen_by=why,
    )


@dataclass(frozen=True)
class Site:
    """Where numapin puts threads and pinned memory for a GPU or node
    (:func:`place`)."""

    node: int
    """The NUMA node pinned memory comes from."""
    cpus: list[int]
    """The CPUs threads working for the GPU run on (never empty)."""
    gpu: int | None
    """The GPU's index in :attr:`Topology.gpus` (PCI order), for a GPU."""
    warnings: list[str]
    """Each fallback taken (unknown locality, CPUs not allowed, a node
    without memory this process can pin), in a sentence."""


def place(gpu: int | None = None, *, node: int | None = None) -> Site:
    """The node and CPUs numapin uses for CUDA device ``gpu`` (or NUMA node
    ``node``, or, with neither, the calling thread): the same answer
    :func:`empty`, :func:`pin`, the staged copies and
    :class:`numapin.torch.DataLoader` use. On a machine with several NUMA
    nodes, ``warnings`` names each fallback taken."""
    n, cpu_list, index, warnings = _numapin.place(gpu, node=node)
    return Site(node=n, cpus=list(cpu_list), gpu=index, warnings=list(warnings))


def doctor(
    input: str | os.PathLike[str] | None = None, *, cuda: bool = True, pin_probe: bool = True
) -> list[DoctorCheck]:
    """The checks of ``numapin doctor`` for this machine, as data: memlock
    limit, memory cgroup, CUDA driver, each GPU's visibility, PCIe link,
    locality and allowed CPUs and node, NICs, memory policy, refused NUMA
    system calls, container evidence, huge pages, NUMA balancing, IOMMU, and
    a small pinned region probed on each NUMA node (``pin_probe``).

    Each :class:`DoctorCheck` has ``name``, ``subject`` (``"GPU 0"``,
    ``"node 1"``, ... or ``None``), ``verdict`` (``"ok"``, ``"warn"``,
    ``"fail"`` or ``"skip"``), ``evidence`` and ``fix`` (``None`` when there
    is nothing to do); ``to_dict()`` gives the keys of ``numapin doctor
    --json``. With ``input`` (a saved machine, as :func:`topology` reads
    one) only the checks of its topology run; the others come back as
    ``"skip"`` with the reason as evidence. ``cuda=False`` does not load the
    CUDA driver. Log them at start-up::

        for c in numapin.doctor(pin_probe=False):
            if c.verdict in ("warn", "fail"):
                log.warning("%s %s: %s (fix: %s)", c.verdict, c.name, c.evidence, c.fix)
    """
    path = None if input is None else os.fspath(input)
    return _numapin.doctor(path, cuda=cuda, pin_probe=pin_probe)


def _shape(shape: Any) -> tuple[int, ...]:
    try:
        return (operator.index(shape),)
    except TypeError:
        return tuple(operator.index(d) for d in shape)


def _dtype_name(dtype: Any, like: str) -> str:
    """``torch.float32`` -> ``"float32"``; NumPy dtypes through ``np.dtype``."""
    if isinstance(dtype, str):
        return dtype
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    if like == "numpy" or "numpy" in sys.modules:
        import numpy as np

        return np.dtype(dtype).name
    raise InputError(f"dtype {dtype!r} is not one numapin hands out\n  fix: pass a torch or NumPy dtype")


def _default_gpu(gpu: int | None, node: int | None) -> int | None:
    """The GPU buffers go near: ``gpu``, else torch's current CUDA device when
    torch has CUDA up in this process, else none (the calling thread's node)."""
    if gpu is not None or node is not None:
        return gpu
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return None


def _wrap(buf: PinnedBuffer, like: str) -> Any:
    if like == "torch":
        import torch

        t = torch.from_dlpack(buf)
        if buf.registered and torch.cuda.is_available():
            # torch answers is_pinned() from the CUDA driver, and only once it
            # has initialised CUDA in this process.
            torch.cuda.init()
        return t
    if like == "numpy":
        import numpy as np

        return np.from_dlpack(buf)
    raise InputError(f'like={like!r} is not a kind of array numapin makes\n  fix: use like="torch" or like="numpy"')


def empty(
    shape: Any,
    dtype: Any,
    *,
    gpu: int | None = None,
    node: int | None = None,
    like: str = "torch",
) -> Any:
    """An uninitialised C-contiguous CPU tensor (``like="numpy"``: a NumPy
    array) in pinned memory on the node of CUDA device ``gpu`` (default:
    torch's current device when CUDA is up in this process), or on NUMA node
    ``node``, or else on the calling thread's node.

    The memory is exactly ``shape`` x ``dtype`` bytes (no power-of-two
    rounding), registered with CUDA when the driver is present (so
    ``is_pinned()`` is true and ``.to("cuda", non_blocking=True)`` is an
    asynchronous DMA), and goes back to numapin's arena when the last
    tensor, view or slice over it is gone. As with any memory a framework
    does not own, keep the tensor alive until an asynchronous copy from it
    has completed (or use :func:`copy_to_device`).
    """
    buf = _numapin.empty(
        _shape(shape), _dtype_name(dtype, like), gpu=_default_gpu(gpu, node), node=node
    )
    return _wrap(buf, like)


def pin(x: Any, *, gpu: int | None = None, node: int | None = None) -> Any:
    """A pinned copy of CPU tensor or NumPy array ``x`` on the node of CUDA
    device ``gpu`` (default as for :func:`empty`), copied by threads on that
    node with the GIL released: the drop-in for ``tensor.pin_memory()``.
    Returns the same kind of object as ``x``."""
    target = _default_gpu(gpu, node)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise InputError(
                f"pin() takes a CPU tensor, not one on {x.device}\n  fix: pin CPU tensors; a CUDA tensor needs no pinning"
            )
        src = x.resolve_conj().resolve_neg().contiguous()
        buf = _numapin.pin_address(
            src.data_ptr(),
            src.numel() * src.element_size(),
            tuple(src.shape),
            _dtype_name(src.dtype, "torch"),
            gpu=target,
            node=node,
        )
        return _wrap(buf, "torch")
    import numpy as np

    src = np.ascontiguousarray(x)
    buf = _numapin.pin_buffer(src, src.shape, src.dtype.name, gpu=target, node=node)
    return _wrap(buf, "numpy")


def _host(x: Any, what: str) -> tuple[Any, int, int]:
    """(owner, address, nbytes) of a C-contiguous CPU tensor or NumPy array."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise InputError(f"{what} must be a CPU tensor or array, not one on {x.device}\n  fix: pass CPU memory")
        if not x.is_contiguous():
            raise InputError(f"{what} is not contiguous\n  fix: pass x.contiguous()")
        return x, x.data_ptr(), x.numel() * x.element_size()
    iface = getattr(x, "__array_interface__", None)
    if iface is None:
        raise InputError(f"{what} is neither a torch tensor nor a NumPy array\n  fix: pass one of them")
    import numpy as np

    a = np.asarray(x)
    if not a.flags.c_contiguous:
        raise InputError(f"{what} is not C-contiguous\n  fix: pass np.ascontiguousarray(x)")
    return a, a.__array_interface__["data"][0], a.nbytes


def _device(t: Any, stream: Any, what: str) -> tuple[int, int, int]:
    """(data_ptr, CUDA device, raw CUstream) of CUDA tensor ``t``."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(t, torch.Tensor) or not t.is_cuda:
        raise InputError(f"{what} must be a CUDA tensor\n  fix: pass a tensor on a CUDA device")
    if not t.is_contiguous():
        raise InputError(f"{what} is not contiguous\n  fix: pass a contiguous CUDA tensor")
    if stream is None:
        stream = torch.cuda.current_stream(t.device)
    return t.data_ptr(), int(t.device.index), int(stream.cuda_stream)


def copy_to_device(src: Any, dst: Any, *, stream: Any = None) -> None:
    """Copies CPU tensor or array ``src`` (pageable memory) into CUDA tensor
    ``dst`` of the same size, staged through pinned memory on ``dst``'s node
    by threads on that node (the GIL released). The copy starts after the
    work already queued on ``stream`` (default: torch's current stream on
    ``dst``'s device) and has arrived when the call returns."""
    owner, addr, nbytes = _host(src, "src")
    ptr, device, raw = _device(dst, stream, "dst")
    if nbytes != dst.numel() * dst.element_size():
        raise InputError(
            f"src has {nbytes} bytes, dst {dst.numel() * dst.element_size()}\n  fix: copy between tensors of the same size"
        )
    _numapin.copy_to_device(addr, nbytes, ptr, device, raw)
    del owner


def copy_from_device(src: Any, dst: Any, *, stream: Any = None) -> None:
    """Copies CUDA tensor ``src`` into CPU tensor or array ``dst`` of the same
    size (see :func:`copy_to_device`): after the work queued on ``stream``,
    complete when the call returns."""
    ptr, device, raw = _device(src, stream, "src")
    owner, addr, nbytes = _host(dst, "dst")
    if nbytes != src.numel() * src.element_size():
        raise InputError(
            f"dst has {nbytes} bytes, src {src.numel() * src.element_size()}\n  fix: copy between tensors of the same size"
        )
    _numapin.copy_from_device(ptr, addr, nbytes, device, raw)
    del owner


def configure(
    *,
    budget_bytes: int | None = None,
    budget_fraction: float | None = None,
    region_bytes: int | None = None,
    register: bool | None = None,
    placement: str | None = None,
    thread_cache_blocks: int | None = None,
    thread_cache_bytes: int | None = None,
    populate_threads: int | None = None,
    backend: str | None = None,
    huge_pages: str | None = None,
    register_in_parts: bool | None = None,
) -> None:
    """Configures the arenas; call before the first call that allocates.

    ``budget_bytes`` / ``budget_fraction``: pinned bytes allowed per node
    (default half the node's memory); ``region_bytes``: size of each pinned
    region (default 256 MiB); ``register``: register with CUDA (default
    true when the driver is present); ``placement``: ``"strict"`` (a page
    off its node is an error, the default) or ``"warn"``;
    ``thread_cache_blocks`` / ``thread_cache_bytes``: each thread's cache of
    freed blocks (0 blocks turns it off); ``populate_threads``: threads that
    fault in a new region (0 picks); ``backend``: where pinned regions
    come from, ``"mapped"`` (the default: mmap + mbind + mlock +
    cuMemHostRegister), ``"driver_numa"`` (cuMemCreate on the node) or
    ``"host_alloc_bound"`` (cuMemHostAlloc under MPOL_BIND); the driver
    backends need a GPU; ``huge_pages``: the pages of each region of the
    mapped backend, ``"auto"`` (hugetlb pages when the node's pool has
    enough free for the region, else transparent huge pages; the default),
    ``"thp"``, ``"2m"`` or ``"1g"`` (hugetlb pages from the node's pool; too
    few is a :class:`BudgetError`) or ``"none"`` (4 KiB pages).
    :func:`stats` counts the regions of each kind (``regions_hugetlb_2m``,
    ``regions_thp``, ...). ``register_in_parts``: make each standard region
    in two halves, the second faulted in while the first is registered with
    CUDA (default false; no buffer then spans the halves, since CUDA
    refuses a copy across two registrations).
    """
    _numapin.configure(
        budget_bytes=budget_bytes,
        budget_fraction=budget_fraction,
        region_bytes=region_bytes,
        register=register,
        placement=placement,
        thread_cache_blocks=thread_cache_blocks,
        thread_cache_bytes=thread_cache_bytes,
        populate_threads=populate_threads,
        backend=backend,
        huge_pages=huge_pages,
        register_in_parts=register_in_parts,
    )


def stats() -> list[dict[str, Any]]:
    """Counters per NUMA node with memory: regions, bytes reserved, locked,
    registered, in use and cached, the budget, allocations, placement."""
    return _numapin.stats()


def trim() -> int:
    """Gives every empty region back to the system (after the threads'
    caches of freed blocks); returns the bytes still reserved."""
    return _numapin.trim()


def dtypes() -> list[str]:
    """The dtype names :func:`empty` accepts."""
    return _numapin.dtypes()

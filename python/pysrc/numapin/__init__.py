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

import itertools
import json
import operator
import os
import sys
from dataclasses import dataclass
from typing import Any

from numapin import _numapin
from numapin._errors import BudgetError, Error, InputError, LimitError
from numapin._numapin import DoctorCheck, PinnedBuffer
from numapin._save import save_safetensors
from numapin._shared import SharedBuffer
from numapin._storage import _path, load_safetensors, locate, read_to_device, safetensors_shards
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
    "save_safetensors",
    "stats",
    "topology",
    "trim",
]


def topology(input: str | os.PathLike[str] | None = None) -> Topology:
    """This machine's topology, or a saved machine's (``input``: an hwloc
    XML export, a ``numapin topo --json`` file, an NCCL topology XML or a
    captured filesystem root), as ``numapin topo`` reads it."""
    json_text, text = _numapin.topology(None if input is None else _path(input))
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
    local_rank = _opt_int(local_rank, "local_rank", hi=_U32, fix="pass the process's local rank (0, 1, ...) or None")
    gpu, node = _gpu_node(gpu, node)
    plan_json, why = _numapin.bind(
        local_rank,
        gpu=gpu,
        node=node,
        mode=mode,
        memory=memory,
        input=None if input is None else _path(input),
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
    gpu, node = _gpu_node(gpu, node)
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
    path = None if input is None else _path(input)
    return _numapin.doctor(path, cuda=cuda, pin_probe=pin_probe)


_U32 = 2**32 - 1
_I64 = 2**63 - 1
_U64 = 2**64 - 1


def _is_bool(x: Any) -> bool:
    """Python and NumPy bools (which ``operator.index`` would take as 0/1)."""
    return isinstance(x, bool) or type(x).__name__ == "bool_"


def _int(value: Any, what: str, *, lo: int = 0, hi: int = _U64, fix: str) -> int:
    """``value`` as an int (Python, NumPy or torch integers): a bool or a
    non-integer is a ``TypeError``, one outside ``lo..hi`` an
    :class:`InputError`; both name ``what`` and say what to do."""
    if _is_bool(value):
        raise TypeError(f"{what}={value!r} is a bool, not an integer\n  fix: {fix}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}={value!r} is not an integer ({type(value).__name__})\n  fix: {fix}") from None
    if not lo <= n <= hi:
        raise InputError(f"{what}={n} is out of range ({lo} to {hi})\n  fix: {fix}")
    return n


def _opt_int(value: Any, what: str, *, lo: int = 0, hi: int = _U64, fix: str) -> int | None:
    return None if value is None else _int(value, what, lo=lo, hi=hi, fix=fix)


def _gpu_node(gpu: Any, node: Any) -> tuple[int | None, int | None]:
    """``gpu`` and ``node`` checked: ``None`` or CUDA ordinals / NUMA node
    numbers (0 to 2**32 - 1; whether one is there is checked by the call)."""
    return (
        _opt_int(gpu, "gpu", hi=_U32, fix="pass a CUDA device ordinal (0, 1, ...; see numapin.topology().gpus) or None"),
        _opt_int(node, "node", hi=_U32, fix="pass a NUMA node number (see numapin.topology().numa_nodes) or None"),
    )


#: Most dimensions a shape may have (DLPack, which hands tensors to torch,
#: allows 2^31 - 1; this bound keeps reading a shape short). NumPy allows
#: fewer: :func:`_numpy_max_rank`.
MAX_RANK = 65536


def _numpy_max_rank() -> int:
    """The most dimensions a NumPy array may have (64 from NumPy 2, 32
    before)."""
    import numpy as np

    return 64 if int(np.__version__.split(".")[0]) >= 2 else 32


def _check_rank(dims: Any, like: str) -> None:
    """An :class:`InputError` for a shape of more dimensions than ``like``'s
    arrays may have, before anything is allocated."""
    if like == "numpy" and len(dims) > (most := _numpy_max_rank()):
        raise InputError(
            f"shape of {len(dims)} dimensions: a NumPy array has at most {most}\n"
            '  fix: use fewer dimensions (reshape), or like="torch"'
        )


def _shape(shape: Any) -> tuple[int, ...]:
    """``shape`` (an integer or a sequence of them: Python, NumPy or torch
    integers) as a tuple; a bool, string or non-integer is a ``TypeError``,
    a negative or overflowing size, or more than :data:`MAX_RANK`
    dimensions (read no further), an :class:`InputError`."""
    fix = "give the shape as an integer or a tuple of integers, e.g. (2, 3)"
    if shape is None or isinstance(shape, (str, bytes, bytearray)) or _is_bool(shape):
        raise TypeError(f"shape={shape!r} is not a shape\n  fix: {fix}")
    try:
        dims: list[Any] = [operator.index(shape)]
    except TypeError:
        try:
            dims = list(itertools.islice(iter(shape), MAX_RANK + 1))
        except TypeError:
            raise TypeError(f"shape={shape!r} is not a shape ({type(shape).__name__})\n  fix: {fix}") from None
    if len(dims) > MAX_RANK:
        raise InputError(
            f"shape of more than {MAX_RANK} dimensions: more than numapin hands out\n"
            "  fix: use fewer dimensions (reshape)"
        )
    out = []
    for d in dims:
        if _is_bool(d) or d is None or isinstance(d, (str, bytes)):
            raise TypeError(f"shape={shape!r}: {d!r} is not a size\n  fix: {fix}")
        try:
            n = operator.index(d)
        except TypeError:
            raise TypeError(f"shape={shape!r}: {d!r} is not an integer size\n  fix: {fix}") from None
        if n < 0:
            raise InputError(f"shape {tuple(dims)!r}: dimension {n} is negative\n  fix: give sizes of zero or more")
        if n > _I64:
            raise InputError(
                f"shape {tuple(dims)!r}: dimension {n} holds more bytes than an address space\n"
                "  fix: ask for a smaller tensor"
            )
        out.append(n)
    return tuple(out)


#: dtypes NumPy has (numapin's others, such as bfloat16, are torch-only).
_NUMPY_DTYPES = frozenset(
    "bool uint8 int8 uint16 int16 uint32 int32 uint64 int64 float16 float32 float64 complex64 complex128".split()
)


def _numpy_dtype_name(dt: Any, given: Any) -> str:
    """The name of NumPy dtype ``dt`` (from ``given``) if numapin hands it
    out: native byte order, no fields."""
    if dt.fields is not None or dt.subdtype is not None:
        raise InputError(
            f"dtype {given!r} is a structured or sub-array dtype\n  fix: pass a plain numeric dtype (float32, int64, ...)"
        )
    if not dt.isnative:
        raise InputError(
            f"dtype {given!r} has a non-native byte order; numapin hands out memory in this machine's byte order\n"
            "  fix: pass the dtype in native order (dtype.newbyteorder('='))"
        )
    return dt.name


#: torch's other names for its dtypes (``torch.float`` is ``torch.float32``),
#: how a string is read with ``like="torch"``. NumPy reads some of them
#: otherwise (``"float"`` is float64 and ``"int"`` int64 there), as it does
#: with ``like="numpy"``.
_TORCH_ALIASES = {
    "float": "float32", "double": "float64", "half": "float16", "int": "int32", "long": "int64",
    "short": "int16", "cfloat": "complex64", "cdouble": "complex128", "chalf": "complex32",
}


def _dtype_name(dtype: Any, like: str) -> str:
    """``torch.float32`` -> ``"float32"``; a name read as ``like``'s
    library reads it (``like="torch"``: torch's names, so ``"float"`` is
    float32 and ``"int"`` int32; ``like="numpy"``: ``np.dtype``'s, where
    they are float64 and int64); NumPy dtypes and their other spellings
    (``"f4"``, ``np.float32``, ``float``) through ``np.dtype``. Something
    that is no dtype is a ``TypeError``; a dtype numapin does not hand out
    (objects, strings, records, a foreign byte order) an :class:`InputError`."""
    names = _numapin.dtypes()
    if isinstance(dtype, str) and dtype in names:
        return dtype
    if isinstance(dtype, str) and like == "torch" and dtype in _TORCH_ALIASES:
        return _TORCH_ALIASES[dtype]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    if dtype is None or _is_bool(dtype) or isinstance(dtype, (int, float)) and not isinstance(dtype, type):
        raise TypeError(f"dtype={dtype!r} is not a dtype\n  fix: pass a torch or NumPy dtype, or its name")
    try:
        import numpy as np
    except ImportError:
        if isinstance(dtype, str):
            raise InputError(
                f"dtype {dtype!r} is not one numapin hands out\n  fix: use one of {', '.join(names)}"
            ) from None
        raise TypeError(f"dtype={dtype!r} is not a dtype\n  fix: pass a torch dtype or a dtype name") from None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as e:
        if isinstance(dtype, str) and dtype in _TORCH_ALIASES:
            raise InputError(
                f"dtype {dtype!r} is torch's name for {_TORCH_ALIASES[dtype]}, which NumPy does not know by it\n"
                f'  fix: pass "{_TORCH_ALIASES[dtype]}", or like="torch"'
            ) from None
        if isinstance(dtype, str):
            raise InputError(
                f"dtype {dtype!r} is not one numapin hands out ({e})\n  fix: use one of {', '.join(names)}"
            ) from None
        raise TypeError(f"dtype={dtype!r} is not a dtype ({e})\n  fix: pass a torch or NumPy dtype, or its name") from None
    return _numpy_dtype_name(dt, dtype)


def _check_like(like: Any, dtype: str) -> None:
    if like not in ("torch", "numpy"):
        raise InputError(f'like={like!r} is not a kind of array numapin makes\n  fix: use like="torch" or like="numpy"')
    if dtype not in _numapin.dtypes():
        raise InputError(f"dtype {dtype!r} is not one numapin hands out\n  fix: use one of {', '.join(dtypes())}")
    if like == "numpy" and dtype not in _NUMPY_DTYPES:
        raise InputError(
            f"NumPy has no dtype {dtype}\n  fix: use like=\"torch\" for {dtype}, or a dtype NumPy has"
        )


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

    ``dtype`` is a torch or NumPy dtype, a Python type (``float`` is
    float64, as for both), or a name, read as ``like``'s library reads it:
    with ``like="torch"`` torch's names (``"float"`` float32, ``"int"``
    int32, ``"long"`` int64, ``"half"``, ``"double"``, ``"cfloat"`` ...),
    with ``like="numpy"`` NumPy's (``"float"`` float64, ``"int"`` int64,
    ``"f4"`` ...). A shape of more dimensions than the result may have
    (NumPy's 64, numapin's 65,536) is an :class:`InputError` before
    anything is allocated. Like all of numapin's
    pinned memory, it is not mapped in a forked child (``MADV_DONTFORK``:
    a worker of torch's DataLoader reading it dies with ``SIGSEGV``, and
    :class:`numapin.torch.DataLoader` refuses a dataset holding it; keep a
    dataset's data in ordinary memory; docs/python.md, "Processes").
    """
    if like not in ("torch", "numpy"):
        _check_like(like, "")
    dims = _shape(shape)
    name = _dtype_name(dtype, like)
    _check_like(like, name)
    _check_rank(dims, like)
    gpu, node = _gpu_node(gpu, node)
    buf = _numapin.empty(dims, name, gpu=_default_gpu(gpu, node), node=node)
    return _wrap(buf, like)


def pin(x: Any, *, gpu: int | None = None, node: int | None = None) -> Any:
    """A pinned copy of CPU tensor or NumPy array ``x`` on the node of CUDA
    device ``gpu`` (default as for :func:`empty`), copied by threads on that
    node with the GIL released: the drop-in for ``tensor.pin_memory()``.
    Returns the same kind of object as ``x``, C-contiguous, of its shape,
    dtype and values, whatever its strides (a tensor's conjugate and
    negative bits are resolved; ``requires_grad`` is not kept). ``bytes``,
    ``bytearray``, ``memoryview``, NumPy scalars and Python numbers give a
    NumPy array (``uint8`` for bytes, the memoryview's format and shape
    otherwise; 0-d for scalars); a NumPy array in a foreign byte order gives
    one of the same values in native order. Sparse, quantized and non-CPU
    tensors, and arrays of objects, strings, records or dates, are an
    :class:`InputError`. The copy is not mapped in a forked child, as
    :func:`empty`'s memory is not."""
    gpu, node = _gpu_node(gpu, node)
    target = _default_gpu(gpu, node)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        src = _torch_source(torch, x)
        buf = _numapin.pin_address(
            src.data_ptr(),
            src.numel() * src.element_size(),
            tuple(src.shape),
            _dtype_name(src.dtype, "torch"),
            gpu=target,
            node=node,
        )
        del src
        return _wrap(buf, "torch")
    src = _numpy_source(x)
    # A 0-d array exports no shape through the buffer protocol: its one
    # element goes as a 1-element array, viewed back as 0-d.
    raw = src.reshape(1) if src.ndim == 0 else src
    buf = _numapin.pin_buffer(raw, src.shape, src.dtype.name, gpu=target, node=node)
    return _wrap(buf, "numpy")


def _torch_source(torch: Any, x: Any) -> Any:
    """CPU tensor ``x`` as a plain contiguous strided tensor numapin can
    copy (conjugate and negative bits resolved), or an :class:`InputError`."""
    if x.device.type != "cpu":
        raise InputError(
            f"pin() takes a CPU tensor, not one on {x.device}\n  fix: pin CPU tensors; a CUDA tensor needs no pinning"
        )
    if x.layout != torch.strided:
        raise InputError(f"pin() takes a dense tensor, not a {x.layout} one\n  fix: pin x.to_dense()")
    if x.is_quantized:
        raise InputError(
            f"pin() takes no quantized tensors ({x.dtype})\n  fix: pin x.int_repr() and keep the scale apart, or x.dequantize()"
        )
    name = str(x.dtype).removeprefix("torch.")
    if name not in _numapin.dtypes():
        raise InputError(f"dtype {name} is not one numapin hands out\n  fix: use one of {', '.join(dtypes())}")
    return x.detach().resolve_conj().resolve_neg().contiguous()


def _numpy_source(x: Any) -> Any:
    """``x`` (an array, a buffer, a scalar) as a C-contiguous NumPy array in
    native byte order, of ``x``'s shape and values, or an error."""
    import numpy as np

    if isinstance(x, (bytes, bytearray)):
        return np.frombuffer(x, dtype=np.uint8)
    if x is None or isinstance(x, (str, dict, set)):
        raise TypeError(
            f"pin() takes a CPU tensor, a NumPy array or a buffer, not {type(x).__name__}\n  fix: pass one of them"
        )
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"pin() cannot read {type(x).__name__} as an array ({e})\n  fix: pass a tensor or array") from None
    if a.dtype.fields is not None or a.dtype.kind in "OSUVMmT":
        raise InputError(
            f"pin() takes numeric arrays, not one of dtype {a.dtype}\n  fix: pass numbers (bool, ints, floats, complex)"
        )
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype.name not in _NUMPY_DTYPES:
        raise InputError(
            f"dtype {a.dtype} is not one numapin hands out\n  fix: use one of {', '.join(sorted(_NUMPY_DTYPES))}"
        )
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return a


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
    machine_budget: str | float | int | None = None,
    budget_wait: float | None = None,
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
    refuses a copy across two registrations). ``machine_budget``: what
    every numapin process of this user on the machine may pin per node
    together (shared regions counted once, in the process that made them):
    ``"auto"`` (the default, unless ``NUMAPIN_MACHINE_BUDGET`` says
    otherwise: half of each node, or this process's own budget there when
    larger), ``"off"``, a fraction of each node's memory (``0.5`` or
    ``"0.5"``), bytes per node (an int, or ``"64GiB"``); over it a
    :class:`BudgetError` names the processes holding the node's share, and
    :func:`stats` gives ``machine_budget``, ``machine_used`` and
    ``machine_share``. ``budget_wait``: seconds an allocation over a budget
    waits for memory to be freed (in this process or, for the machine
    budget, in others) before the :class:`BudgetError` (default: none).

    A value of the wrong type is a ``TypeError``; a name that is not one of
    those listed, or a value out of range, an :class:`InputError` (both
    name the argument and say what to pass). Nothing is stored unless every
    argument is right.
    """
    # Each argument is checked as the compiled module reads it (a bool is no
    # integer, a name must be one listed above), and the configuration as a
    # whole by the library's own check; either raises before anything is
    # stored.
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
        machine_budget=machine_budget,
        budget_wait=budget_wait,
    )


def stats() -> list[dict[str, Any]]:
    """Counters per NUMA node with memory: regions, bytes reserved, locked,
    registered, in use and cached, the budget, allocations, placement; the
    machine budget (``machine_budget``: every numapin process of this user
    together, 0 when off), what all of them pin on the node
    (``machine_used``, read now) and this process's part of it
    (``machine_share``)."""
    return _numapin.stats()


def trim() -> int:
    """Gives every empty region back to the system (after the threads'
    caches of freed blocks); returns the bytes still reserved."""
    return _numapin.trim()


def dtypes() -> list[str]:
    """The dtype names :func:`empty` accepts."""
    return _numapin.dtypes()

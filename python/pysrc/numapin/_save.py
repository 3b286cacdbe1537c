"""Checkpoints saved from CUDA or CPU tensors to safetensors files, through
pinned memory on the GPU's own NUMA node (``numapin::storage::write``)."""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from numapin import _numapin
from numapin._errors import InputError

__all__ = ["save_safetensors"]

#: torch dtype name -> safetensors dtype, for every dtype both have (the
#: ones ``safetensors.torch`` saves and numapin's loader makes tensors of).
SAFETENSORS_DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "complex64": "C64",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
}

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _shard_size(value: Any) -> int | None:
    """``max_shard_size``: ``None``, bytes, or a size as Hugging Face writes
    it (``"5GB"`` is 5 * 10**9 bytes, ``"5GiB"`` 5 * 2**30)."""
    if value is None:
        return None
    fix = 'pass a size in bytes, or a string such as "5GB" or "2GiB"'
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise InputError(f"max_shard_size={value!r} is not a size\n  fix: {fix}")
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        import numapin

        n = numapin._int(value, "max_shard_size", lo=1, hi=2**63 - 1, fix=fix)
    if n < 1:
        raise InputError(f"max_shard_size={value!r} is less than a byte\n  fix: {fix}")
    return n


def _metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InputError(
            f"metadata={metadata!r} is not a dict of strings to strings\n"
            "  fix: pass metadata={\"key\": \"value\"} (safetensors keeps strings only), or None"
        )
    return dict(metadata)


def _is_dtensor(t: Any) -> bool:
    mod = sys.modules.get("torch.distributed.tensor")
    cls = getattr(mod, "DTensor", None) if mod is not None else None
    return cls is not None and isinstance(t, cls)


def check_dense(name: str, t: Any, torch: Any) -> None:
    """:class:`InputError` naming ``name`` unless tensor ``t`` is dense,
    materialised, and on the CPU or a CUDA device."""
    if t.layout != torch.strided:
        raise InputError(f"{name!r} is a {t.layout} tensor, not a dense one\n  fix: use t.to_dense()")
    if t.device.type == "meta":
        raise InputError(f"{name!r} is on the meta device (it holds no data)\n  fix: materialise it first")
    if t.device.type not in ("cpu", "cuda"):
        raise InputError(f"{name!r} is on {t.device}\n  fix: move it to a CUDA device or the CPU")


def _checked(name: Any, t: Any, torch: Any) -> Any:
    """Tensor ``t`` of key ``name``, ready to write: dense, materialised, on
    the CPU or a CUDA device, of a dtype safetensors has, contiguous, with
    conjugation and negation applied; :class:`InputError` naming the key
    otherwise."""
    if not isinstance(name, str):
        raise InputError(f"key {name!r} is not a string\n  fix: name every tensor with a str")
    fix = "save tensors only (drop it, or save it another way)"
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name!r} is a {type(t).__name__}, not a tensor\n  fix: {fix}")
    if _is_dtensor(t):
        raise InputError(
            f"{name!r} is a DTensor\n  fix: save its full_tensor() (or to_local() per rank), "
            "or use torch.distributed.checkpoint with numapin.torch.CheckpointStager"
        )
    check_dense(name, t, torch)
    dt = str(t.dtype).removeprefix("torch.")
    if dt not in SAFETENSORS_DTYPES:
        raise InputError(
            f"{name!r} has dtype {t.dtype}, which safetensors does not store\n"
            f"  fix: convert it to one of {', '.join(sorted(SAFETENSORS_DTYPES))}"
        )
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


def _main_gpu(tensors: list[Any]) -> int | None:
    """The CUDA device holding the most bytes, if any."""
    by: dict[int, int] = {}
    for t in tensors:
        if t.is_cuda:
            by[t.device.index] = by.get(t.device.index, 0) + t.nbytes
    return max(by, key=lambda g: by[g]) if by else None


def save_safetensors(
    state_dict: Mapping[str, Any],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
    *,
    max_shard_size: int | str | None = None,
    fsync: bool = True,
    prefix: str = "model",
    gpu: int | None = None,
    node: int | None = None,
    threads: int = 0,
    chunk_bytes: int = 8 << 20,
    io: str = "auto",
    stats: dict[str, Any] | None = None,
) -> list[str]:
    """Saves ``state_dict`` (names to tensors on any CUDA device or the CPU)
    as a safetensors file at ``path`` that ``safetensors.torch.load_file``
    reads back bit for bit, as does :func:`load_safetensors`. Returns the
    files written.

    Each tensor goes from device memory into pinned slots on its GPU's NUMA
    node (the GPU holding most of the bytes; ``gpu``/``node`` to choose) and
    is written from there by threads on that node's CPUs, the writes of
    some slots overlapping the copies into the others, with ``O_DIRECT``
    where the filesystem allows it (``io="buffered"`` for the page cache).
    The copies start after the work queued on each device's current
    stream. Crash-safe: the file is written beside ``path`` under a
    temporary name (``.<name>.numapin-tmp-<pid>-<n>``), synced (``fsync``,
    default true) and renamed over it; a failure leaves the old file as it
    was and no temporary file; a save killed mid-way leaves its temporary
    file, which the next save to ``path`` removes. ``path`` may be a link
    (the file it names is replaced); a directory or FIFO is refused.

    The header is the one ``safetensors.torch.save_file`` writes (tensors
    by dtype alignment, then name; ``metadata``: a dict of strings, the
    ``__metadata__``). Non-contiguous tensors are made contiguous on their
    device first; tensors that share memory (views) are each written whole
    (the format cannot share them; ``save_file`` refuses them).

    ``max_shard_size`` (bytes, or ``"5GB"``/``"2GiB"``): ``path`` is a
    folder (made if missing) that gets ``<prefix>-00001-of-0000N.safetensors``
    shards and ``<prefix>.safetensors.index.json`` (or ``<prefix>.safetensors``
    alone when all fits in one shard), split in the dict's order as Hugging
    Face's ``save_torch_state_dict`` does, each shard's metadata
    ``{"format": "pt", **metadata}``; the files of an earlier sharded save
    there that this one did not write are removed.

    Values that are not tensors, sparse or meta tensors and dtypes
    safetensors lacks raise :class:`InputError` naming the key, before
    anything is written. A full filesystem, a spent quota, a file over
    ``ulimit -f`` or a drive error raise :class:`numapin.Error` naming the
    file, the offset and the fix; a folder this user may not write,
    :class:`LimitError`. ``stats``: a dict to fill with what the write did
    (``bytes``, ``seconds``, ``gbps``, ``direct_bytes``, ...).
    """
    import numapin
    import torch

    if not isinstance(state_dict, Mapping):
        raise InputError(
            f"state_dict is a {type(state_dict).__name__}, not a dict of names to tensors\n"
            "  fix: pass a dict such as model.state_dict()"
        )
    meta = _metadata(metadata)
    shard = _shard_size(max_shard_size)
    if shard is not None:
        meta = {"format": "pt", **(meta or {})}
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise InputError(f"prefix={prefix!r} is not a file name\n  fix: pass a name such as \"model\"")
    gpu, node = numapin._gpu_node(gpu, node)
    opts = numapin._storage._read_opts(threads, chunk_bytes, io, auto_chunk=False)
    held = [(k, _checked(k, v, torch)) for k, v in state_dict.items()]
    tensors = [t for _, t in held]
    if gpu is None and node is None:
        gpu = _main_gpu(tensors)
        if gpu is None:
            gpu = numapin._storage._default_gpu(None, None)
    entries = [
        (
            k,
            SAFETENSORS_DTYPES[str(t.dtype).removeprefix("torch.")],
            list(t.shape),
            t.device.index if t.is_cuda else -1,
            t.data_ptr(),
            t.nbytes,
        )
        for k, t in held
    ]
    devices = sorted({t.device.index for t in tensors if t.is_cuda})
    streams = [(d, int(torch.cuda.current_stream(d).cuda_stream)) for d in devices]
    report = _numapin.save_safetensors(
        numapin._storage._path(path),
        entries,
        metadata=meta,
        max_shard_size=shard,
        prefix=prefix,
        gpu=gpu,
        node=node,
        streams=streams,
        fsync=bool(fsync),
        **opts,
    )
    del held, tensors
    for w in report.get("warnings", []):
        warnings.warn(w, RuntimeWarning, stacklevel=2)
    if stats is not None:
        stats.update(report)
    return [str(f) for f in report["files"]]

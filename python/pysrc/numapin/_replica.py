"""Every rank of a ``torch.distributed`` group with the whole checkpoint,
each byte read from storage once per machine:
``load_safetensors(..., shard="replica", group=...)``.

Each rank reads its share (the cut ``shard=(rank, world_size)`` gives) from
the files to its own device with the same reader as any other load; the
shares then go to the other ranks with broadcasts over the group (NCCL:
GPU to GPU, over NVLink where the GPUs have it; gloo: through host
memory). A share is read in pieces, and the broadcasts of one piece run on
the GPUs while the next piece is read.

Every rank first tells the others, in one all-gather of a fixed-size
record, whether it could open the checkpoint, a hash of what it opened,
its machine and its GPU: ranks that opened other files, a group that spans
machines, or two ranks on one GPU are an :class:`InputError` on every rank
(never a hang). After each piece the ranks tell each other whether their
read succeeded, so a failed read stops every rank too.

This module imports nothing of numapin but its errors: ``_storage``
(``load_safetensors``) hands it what it needs as callables.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from numapin._errors import Error, InputError

PIECE_BYTES = 256 << 20
"""A rank's share is read in pieces of about this many bytes; a piece's
broadcasts run on the GPUs while the next piece is read."""

SMALL_BYTES = 4 << 20
"""Tensors below this size go packed together, up to :data:`BUCKET_BYTES`
a broadcast (one broadcast each would cost more in latency than in
bandwidth); larger ones are broadcast in place."""

BUCKET_BYTES = 64 << 20

IN_FLIGHT = 4
"""Packed buffers (each at most :data:`BUCKET_BYTES` of device memory)
whose broadcast may be queued before the host waits for the oldest."""

_RECORD = 64  # bytes of each rank's agreement record
_OK, _INPUT, _FAILED = 0, 1, 2  # a rank's status


@dataclass
class Prepared:
    """What ``load_safetensors`` opened and selected, and how to read and
    allocate for it."""

    files: list[str]
    """The checkpoint's files (one, or an index's shards in name order)."""
    sel: list[int]
    """The selected tensors, indexes into ``infos``, in file order."""
    infos: list[tuple[Any, ...]]
    """``(name, torch dtype name, shape, nbytes, safetensors dtype)`` of every tensor."""
    shares: list[list[int]]
    """Each group rank's share of ``sel``, in file order."""
    device: Any
    """The ``torch.device`` the tensors go to (CUDA with an index, or CPU)."""
    read: Callable[[list[int]], tuple[list[Any], dict[str, Any]]]
    """Reads these tensors from the files: new tensors, and the read's report."""
    alloc: Callable[[int], Any]
    """A new, uninitialised tensor for this tensor index."""


@dataclass
class _Report:
    """The reads' reports summed, and the exchange's figures."""

    reads: list[dict[str, Any]] = field(default_factory=list)
    received: int = 0

    def merged(self, world: int, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes": 0, "seconds": 0.0, "cached_bytes": 0, "direct_bytes": 0,
                               "buffered_bytes": 0, "staging_bytes": 0, "chunk_bytes": 0, "threads": 0,
                               "node": None}
        warnings: list[str] = []
        for r in self.reads:
            for k in ("bytes", "seconds", "cached_bytes", "direct_bytes", "buffered_bytes"):
                out[k] += r.get(k) or 0
            out["staging_bytes"] = max(out["staging_bytes"], r.get("staging_bytes") or 0)
            out["chunk_bytes"] = max(out["chunk_bytes"], r.get("chunk_bytes") or 0)
            out["threads"] = r.get("threads", out["threads"])
            out["node"] = r.get("node", out["node"])
            warnings += [w for w in r.get("warnings", []) if w not in warnings]
        out["gbps"] = out["bytes"] / out["seconds"] / 1e9 if out["seconds"] > 0 else 0.0
        out["warnings"] = warnings
        out["replica"] = {"world_size": world, "read_bytes": out["bytes"], "received_bytes": self.received,
                          "seconds": seconds}
        return out


def dist_group(group: Any) -> tuple[Any, Any]:
    """``torch.distributed`` and the group to use (the default group for
    ``None``), or an :class:`InputError` when there is none."""
    dist: Any
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is None or not dist.is_available():
        raise InputError(
            'shard="replica" needs torch.distributed, which this torch lacks\n'
            '  fix: use a torch built with distributed support, or shard=None (each rank reads every byte)'
        )
    if not dist.is_initialized():
        raise InputError(
            'shard="replica" needs torch.distributed initialised: its ranks share the reading\n'
            "  fix: call torch.distributed.init_process_group() first (torchrun sets its environment), "
            "or load without shard=\"replica\""
        )
    if group is None:
        group = dist.group.WORLD
    try:
        rank = dist.get_rank(group)
    except (TypeError, AttributeError, ValueError, RuntimeError) as e:
        raise InputError(
            f"group={group!r} is not a torch.distributed process group ({e})\n"
            "  fix: pass a group from torch.distributed.new_group() or new_subgroups(), or None for the default group"
        ) from None
    if rank < 0:
        raise InputError(
            "this process is not a member of group=\n"
            "  fix: pass the group this rank belongs to (new_subgroups() returns it), or None for the default group"
        )
    return dist, group


def comm_device(dist: Any, group: Any, device: Any) -> Any:
    """The device of the tensors the group's collectives take for a load to
    ``device`` (``None``: pinned CPU tensors)."""
    import torch

    backend = str(dist.get_backend(group))
    if device is None or device.type == "cpu":
        if backend == "nccl":
            raise InputError(
                'shard="replica" to CPU tensors with an NCCL group: NCCL moves only CUDA tensors\n'
                "  fix: load to each rank's GPU (device=f\"cuda:{local_rank}\"), or pass a gloo group "
                "(torch.distributed.new_group(backend=\"gloo\"))"
            )
        return torch.device("cpu")
    return device


def load(prepare: Callable[[], Prepared], group: Any, fallback_device: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Loads every selected tensor on every rank of ``group`` (see the
    module's text): ``{name: tensor}`` and the merged report.

    ``prepare`` opens the checkpoint on this rank; its failure is told to
    the other ranks before it is raised here. ``fallback_device`` is the
    device the collectives use when ``prepare`` failed before it knew the
    device (``None``: CPU)."""
    t0 = time.perf_counter()
    dist, group = dist_group(group)
    me, world = dist.get_rank(group), dist.get_world_size(group)
    mine: BaseException | None = None
    p: Prepared | None = None
    rec = bytearray(_RECORD)
    try:
        p = prepare()
        rec[1:33] = _digest(p)
        rec[33:41] = _machine()
        rec[41:49] = _gpu(p.device)
    except Exception as e:  # told to the other ranks, then raised
        mine = e
    rec[0] = _status(mine)
    try:
        dev = comm_device(dist, group, p.device if p is not None else fallback_device)
    except InputError:
        if mine is not None:  # no device to tell the others on: this rank's own error
            raise mine from None
        raise
    _agree(dist, group, me, world, dev, bytes(rec), mine)
    assert p is not None
    report = _Report()
    out = _exchange(dist, group, me, world, dev, p, report)
    return out, report.merged(world, time.perf_counter() - t0)


def _status(e: BaseException | None) -> int:
    if e is None:
        return _OK
    return _INPUT if isinstance(e, (InputError, ValueError, TypeError)) else _FAILED


def _gather(dist: Any, group: Any, world: int, rec: bytes, dev: Any) -> list[bytes]:
    """Every rank's ``rec`` (each the same length), in group rank order."""
    import torch

    mine = torch.frombuffer(bytearray(rec), dtype=torch.uint8).to(dev)
    got = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(got, mine, group=group)
    return [bytes(t.cpu().tolist()) for t in got]


def _raise_failed(me: int, statuses: list[int], mine: BaseException | None, what: str) -> None:
    """Raises on every rank when any rank failed: its own error on the rank
    that failed, on the others an error naming it."""
    bad = [r for r, s in enumerate(statuses) if s != _OK]
    if not bad:
        return
    if mine is not None:
        raise mine
    names = ", ".join(str(r) for r in bad)
    cls = InputError if all(statuses[r] == _INPUT for r in bad) else Error
    raise cls(
        f"rank {names} of the group could not {what} (its own error says why)\n"
        "  fix: see that rank's error; every rank stops, so that none waits for it"
    )


def _digest(p: Prepared) -> bytes:
    """A hash of the files (sizes and headers) and of the selected tensors."""
    h = hashlib.sha256()
    for f in p.files:
        with open(f, "rb") as fh:
            h.update(os.fstat(fh.fileno()).st_size.to_bytes(8, "little"))
            n = int.from_bytes(fh.read(8), "little")
            h.update(fh.read(n))  # at most the format's 100 MB, checked at open
    for i in p.sel:
        name, _, shape, nbytes, dtype = p.infos[i]
        h.update(repr((name, dtype, list(shape), nbytes)).encode())
    return h.digest()


def _machine() -> bytes:
    """8 bytes naming this machine (its kernel's boot id: the same in every
    container of one machine, different on another)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            ident = f.read().strip()
    except OSError:
        ident = socket.gethostname().encode()
    return hashlib.sha256(ident).digest()[:8]


def _gpu(device: Any) -> bytes:
    """8 bytes naming the GPU of ``device`` (zeros for CPU or when torch
    does not say)."""
    if device is None or device.type != "cuda":
        return bytes(8)
    import torch

    props = torch.cuda.get_device_properties(device)
    ident = getattr(props, "uuid", None)
    if ident is None:
        ident = (getattr(props, "pci_domain_id", None), getattr(props, "pci_bus_id", None),
                 getattr(props, "pci_device_id", None))
        if ident[1] is None:
            return bytes(8)
    return hashlib.sha256(str(ident).encode()).digest()[:8]


def _agree(dist: Any, group: Any, me: int, world: int, dev: Any, rec: bytes, mine: BaseException | None) -> None:
    """Every rank opened the same checkpoint, on one machine, each on its own
    GPU (``rec``: this rank's status, digest, machine and GPU); or an error
    on every rank."""
    recs = _gather(dist, group, world, rec, dev)
    _raise_failed(me, [r[0] for r in recs], mine, "open the checkpoint or select its tensors")
    machines = {r[33:41] for r in recs}
    if len(machines) > 1:
        raise InputError(
            f'shard="replica" over a group of {world} ranks on {len(machines)} machines: it reads each byte once '
            "per machine and passes it between the GPUs of that machine\n"
            "  fix: pass group= the ranks of this machine (torch.distributed.new_subgroups() makes one group "
            "per machine), or load without shard=\"replica\""
        )
    other = [r for r, x in enumerate(recs) if x[1:33] != recs[0][1:33]]
    if other:
        raise InputError(
            f"rank {', '.join(map(str, other))} of the group opened another checkpoint than rank 0 (the files' "
            "sizes or headers differ, or names= selects other tensors)\n"
            "  fix: give every rank the same files and the same names="
        )
    gpus = [x[41:49] for x in recs]
    for r, g in enumerate(gpus):
        if g != bytes(8) and gpus.index(g) != r:
            raise InputError(
                f"ranks {gpus.index(g)} and {r} of the group load to the same GPU\n"
                "  fix: give each rank its own GPU (device=f\"cuda:{local_rank}\")"
            )


def _pieces(p: Prepared, share: list[int]) -> list[list[int]]:
    """``share`` cut into runs of about :data:`PIECE_BYTES` (each at least
    one tensor)."""
    pieces: list[list[int]] = []
    run: list[int] = []
    size = 0
    for i in share:
        run.append(i)
        size += p.infos[i][3]
        if size >= PIECE_BYTES:
            pieces.append(run)
            run, size = [], 0
    if run:
        pieces.append(run)
    return pieces


def _batches(p: Prepared, piece: list[int]) -> list[list[int]]:
    """``piece``'s tensors as broadcasts: a large one alone, neighbouring
    small ones together up to :data:`BUCKET_BYTES`; empty ones not at all."""
    out: list[list[int]] = []
    run: list[int] = []
    size = 0
    for i in piece:
        n = p.infos[i][3]
        if n == 0:
            continue
        if n >= SMALL_BYTES:
            if run:
                out.append(run)
                run, size = [], 0
            out.append([i])
            continue
        if size + n > BUCKET_BYTES and run:
            out.append(run)
            run, size = [], 0
        run.append(i)
        size += n
    if run:
        out.append(run)
    return out


def _flat(t: Any) -> Any:
    """A contiguous tensor's bytes as a 1-D uint8 view."""
    import torch

    return t.reshape(-1).view(torch.uint8)


class _Sender:
    """Queues the broadcasts of a load: on CUDA asynchronously on a side
    stream (so the next piece's read, on torch's current stream, does not
    wait for them), on CPU one after the other."""

    def __init__(self, dist: Any, group: Any, device: Any) -> None:
        import torch

        self.dist, self.group, self.device = dist, group, device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.works: list[Any] = []
        self.pending: list[Any] = []
        if self.stream is not None:
            # The receiving tensors came from torch's allocator on the
            # current stream: the broadcasts go after the work queued there.
            self.stream.wait_stream(torch.cuda.current_stream(device))

    def batch(self, root: int, tensors: list[Any], owner: bool) -> None:
        """Broadcasts ``tensors`` (the owner's filled ones, or the others'
        to fill) from group rank ``root``."""
        import torch

        src = self.dist.get_global_rank(self.group, root)
        if self.stream is None:
            self._packed_cpu(src, tensors, owner)
            return
        with torch.cuda.stream(self.stream):
            if len(tensors) == 1 and _flat(tensors[0]).numel() >= SMALL_BYTES:
                self.works.append(self.dist.broadcast(_flat(tensors[0]), src=src, group=self.group, async_op=True))
                return
            flats = [_flat(t) for t in tensors]
            if owner:
                buf = torch.cat(flats)
            else:
                buf = torch.empty(sum(f.numel() for f in flats), dtype=torch.uint8, device=self.device)
            self.dist.broadcast(buf, src=src, group=self.group, async_op=True).wait()
            if not owner:
                _unpack(buf, flats)
            ev = torch.cuda.Event()
            ev.record(self.stream)
            self.pending.append(ev)
            del buf
        while len(self.pending) > IN_FLIGHT:
            self.pending.pop(0).synchronize()

    def _packed_cpu(self, src: int, tensors: list[Any], owner: bool) -> None:
        import torch

        flats = [_flat(t) for t in tensors]
        if len(flats) == 1:
            self.dist.broadcast(flats[0], src=src, group=self.group)
            return
        buf = torch.cat(flats) if owner else torch.empty(sum(f.numel() for f in flats), dtype=torch.uint8)
        self.dist.broadcast(buf, src=src, group=self.group)
        if not owner:
            _unpack(buf, flats)

    def finish(self) -> None:
        """Waits until every broadcast has landed (torch's current stream
        ordered after them)."""
        if self.stream is None:
            return
        import torch

        cur = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(cur):
            for w in self.works:
                w.wait()
        cur.wait_stream(self.stream)
        cur.synchronize()
        self.works.clear()
        self.pending.clear()


def _unpack(buf: Any, flats: list[Any]) -> None:
    off = 0
    for f in flats:
        n = f.numel()
        f.copy_(buf[off:off + n])
        off += n


def _exchange(dist: Any, group: Any, me: int, world: int, dev: Any, p: Prepared, report: _Report) -> dict[str, Any]:
    """Reads this rank's share piece by piece and broadcasts every rank's
    pieces: every selected tensor, by name."""
    pieces = [_pieces(p, s) for s in p.shares]
    out: dict[str, Any] = {}
    sender: _Sender | None = None
    for k in range(max((len(x) for x in pieces), default=0)):
        err: BaseException | None = None
        try:
            if k == 0:  # the tensors the others read (out of memory here is told, as a failed read)
                for r in range(world):
                    out.update({p.infos[i][0]: p.alloc(i) for i in p.shares[r] if r != me})
            if k < len(pieces[me]):
                tensors, rep = p.read(pieces[me][k])
                report.reads.append(rep)
                out.update({p.infos[i][0]: t for i, t in zip(pieces[me][k], tensors)})
        except Exception as e:  # told to the other ranks, then raised
            err = e
        statuses = [r[0] for r in _gather(dist, group, world, bytes([_status(err)]), dev)]
        _raise_failed(me, statuses, err, "read its share of the checkpoint")
        if sender is None:
            sender = _Sender(dist, group, dev)
        for r in range(world if world > 1 else 0):  # a group of one has nothing to pass on
            if k >= len(pieces[r]):
                continue
            for b in _batches(p, pieces[r][k]):
                sender.batch(r, [out[p.infos[i][0]] for i in b], owner=r == me)
                if r != me:
                    report.received += sum(p.infos[i][3] for i in b)
    if sender is not None:
        sender.finish()
    return out

"""The machine's topology as Python objects (see :func:`numapin.topology`).

Field names follow numapin's JSON schema (``numapin topo --json``,
docs/topology-json.md); CPU sets are lists of CPU numbers here and cpulist
strings (``"0-3,8"``) in :meth:`Topology.to_dict`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def cpus(text: str) -> list[int]:
    """Expands a kernel cpulist (``"0-3,8"``) into CPU numbers."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


@dataclass(frozen=True)
class Gpu:
    """A GPU, in PCI bus id order."""

    index: int
    """Position in :attr:`Topology.gpus` (PCI order), as ``numapin topo`` numbers it."""
    cuda_ordinal: int | None
    """What CUDA (and ``torch.device("cuda", n)``) calls it in this process, ``None`` when hidden."""
    pci_bus_id: str
    name: str | None
    uuid: str | None
    numa_node: int | None
    """The node it hangs off, ``None`` when the machine does not say (never a guessed 0)."""
    package: int | None
    local_cpus: list[int]


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node."""

    os_index: int
    package: int | None
    cpus: list[int]
    memory_bytes: int
    distances: list[int]
    kind: str
    """``normal``, ``cpuless``, ``memoryless`` or ``gpu_memory``."""


@dataclass(frozen=True)
class Package:
    """A processor package (socket)."""

    index: int
    cpus: list[int]
    numa_nodes: list[int]


@dataclass(frozen=True)
class Allowed:
    """What this process may use (cgroups, cpusets, taskset)."""

    cpus: list[int]
    numa_nodes: list[int]


@dataclass(frozen=True)
class Warning:
    """Something a person should read about the topology."""

    kind: str
    gpu: int | None
    message: str


class Topology:
    """A machine: its packages, NUMA nodes and GPUs, and what this process
    may use of them. ``str(t)`` is the ``numapin topo`` report."""

    def __init__(self, json_text: str, text: str) -> None:
        self._dict: dict[str, Any] = json.loads(json_text)
        self._text = text
        d = self._dict
        self.source: str = d["source"]
        self.gpus: list[Gpu] = [
            Gpu(
                index=g["index"],
                cuda_ordinal=g["cuda_ordinal"],
                pci_bus_id=g["pci_bus_id"],
                name=g["name"],
                uuid=g["uuid"],
                numa_node=g["numa_node"],
                package=g["package"],
                local_cpus=cpus(g["local_cpus"]),
            )
            for g in d["gpus"]
        ]
        self.numa_nodes: list[NumaNode] = [
            NumaNode(
                os_index=n["os_index"],
                package=n["package"],
                cpus=cpus(n["cpus"]),
                memory_bytes=n["memory_bytes"],
                distances=list(n["distances"]),
                kind=n["kind"],
            )
            for n in d["numa_nodes"]
        ]
        self.packages: list[Package] = [
            Package(index=p["index"], cpus=cpus(p["cpus"]), numa_nodes=list(p["numa_nodes"]))
            for p in d["packages"]
        ]
        self.allowed = Allowed(
            cpus=cpus(d["allowed"]["cpus"]), numa_nodes=list(d["allowed"]["numa_nodes"])
        )
        self.warnings: list[Warning] = [
            Warning(kind=w["kind"], gpu=w["gpu"], message=w["message"]) for w in d["warnings"]
        ]

    def gpu_by_ordinal(self, ordinal: int) -> Gpu | None:
        """The GPU this process sees as CUDA device ``ordinal``."""
        return next((g for g in self.gpus if g.cuda_ordinal == ordinal), None)

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON schema (``numapin topo --json``) as a dict."""
        return json.loads(json.dumps(self._dict))

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return (
            f"Topology(source={self.source!r}, packages={len(self.packages)}, "
            f"numa_nodes={len(self.numa_nodes)}, gpus={len(self.gpus)})"
        )

"""Type stubs of numapin's compiled module (the public API is `numapin`)."""

from typing import Any, Callable, Literal, final

__all__ = [
    "PinnedBuffer",
    "SlotPool",
    "SlotLease",
    "SharedBuffer",
    "DoctorCheck",
    "empty",
    "pin_address",
    "pin_buffer",
    "copy_to_device",
    "copy_from_device",
    "topology",
    "bind",
    "doctor",
    "configure",
    "stats",
    "trim",
    "place",
    "dtypes",
    "run_cli",
    "_delete_export_on_foreign_thread",
    "_lent_at",
    "Checkpoint",
    "open_safetensors",
    "check_io",
    "read_to_device",
    "read_to_host",
    "locate",
    "save_safetensors",
    "staging_buffers",
    "DLPACK_VERSION",
]

DLPACK_VERSION: tuple[int, int]

@final
class PinnedBuffer:
    """numapin-owned host memory viewed as a tensor; exported with DLPack."""

    @property
    def nbytes(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def address(self) -> int: ...
    @property
    def node(self) -> int | None: ...
    @property
    def registered(self) -> bool: ...
    @property
    def _owners(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def to_bytes(self) -> bytes: ...

def empty(
    shape: tuple[int, ...] | list[int], dtype: str, *, gpu: int | None = None, node: int | None = None
) -> PinnedBuffer: ...
def pin_address(
    address: int,
    nbytes: int,
    shape: tuple[int, ...] | list[int],
    dtype: str,
    *,
    gpu: int | None = None,
    node: int | None = None,
) -> PinnedBuffer: ...
def pin_buffer(
    src: Any, shape: tuple[int, ...] | list[int], dtype: str, *, gpu: int | None = None, node: int | None = None
) -> PinnedBuffer: ...
def copy_to_device(host: int, nbytes: int, device_ptr: int, gpu: int, stream: int) -> None: ...
def copy_from_device(device_ptr: int, host: int, nbytes: int, gpu: int, stream: int) -> None: ...
def topology(input: str | None = None) -> tuple[str, str]: ...
def bind(
    local_rank: int | None = None,
    *,
    gpu: int | None = None,
    node: int | None = None,
    mode: str = "node",
    memory: str = "bind",
    input: str | None = None,
) -> tuple[str, str]: ...
@final
class DoctorCheck:
    """One check of `numapin doctor`: name, subject, verdict, evidence, fix."""

    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def subject(self) -> str | None: ...
    @property
    def verdict(self) -> Literal["ok", "warn", "fail", "skip"]: ...
    @property
    def evidence(self) -> str: ...
    @property
    def fix(self) -> str | None: ...
    @property
    def gpu(self) -> int | None: ...
    @property
    def node(self) -> int | None: ...
    @property
    def nic(self) -> int | None: ...
    def to_dict(self) -> dict[str, Any]: ...

def doctor(input: str | None = None, *, cuda: bool = True, pin_probe: bool = True) -> list[DoctorCheck]: ...
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
    machine_budget: str | None = None,
    budget_wait: float | None = None,
) -> None: ...
def stats() -> list[dict[str, Any]]: ...
def trim() -> int: ...
def place(gpu: int | None = None, *, node: int | None = None) -> tuple[int, list[int], int | None, list[str]]: ...
def dtypes() -> list[str]: ...
def run_cli(args: list[str]) -> int: ...
def _delete_export_on_foreign_thread(buf: PinnedBuffer) -> int: ...
def _lent_at(spans: list[tuple[int, int]]) -> tuple[int, str] | None: ...

@final
class SlotLease:
    """The main process's hold on one filled loader slot."""

    @property
    def slot(self) -> int: ...
    def view(self, offset: int, nbytes: int, dtype: str, shape: list[int]) -> PinnedBuffer: ...

@final
class SlotPool:
    """Batch slots in shared memory (numapin.torch.DataLoader)."""

    @staticmethod
    def create() -> SlotPool: ...
    @staticmethod
    def attach(path: str) -> SlotPool: ...
    @property
    def path(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def nslots(self) -> int: ...
    @property
    def max_slots(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def registered(self) -> bool: ...
    def provision(
        self, nslots: int, slot_bytes: int, *, gpu: int | None = None, node: int | None = None, register: bool = True
    ) -> None: ...
    def provision_on_request(
        self,
        nslots: int,
        *,
        first: int | None = None,
        grow_by: int | None = None,
        gpu: int | None = None,
        node: int | None = None,
        register: bool = True,
    ) -> None: ...
    def provision_error(self) -> str | None: ...
    def request(self, nbytes: int) -> None: ...
    def wait_ready(self, timeout: float) -> bool: ...
    def acquire(self, timeout: float) -> int | None: ...
    def release(self, slot: int) -> None: ...
    def view(self, slot: int, offset: int, nbytes: int, dtype: str, shape: list[int]) -> PinnedBuffer: ...
    def write(
        self, slot: int, offset: int, addresses: list[int], lengths: list[int], align: int, cpus: list[int]
    ) -> int: ...
    def lease(self, slot: int) -> SlotLease: ...
    def begin_generation(self) -> int: ...
    def reclaim_before(self, generation: int) -> int: ...
    def reset(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...

@final
class SharedBuffer:
    @staticmethod
    def create(name: str, nbytes: int, *, gpu: int | None = None, node: int | None = None) -> SharedBuffer: ...
    @staticmethod
    def attach(name: str, *, timeout: float = 0.0) -> SharedBuffer: ...
    @property
    def name(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def registered(self) -> bool: ...
    @property
    def owner(self) -> bool: ...
    @property
    def path(self) -> str | None: ...
    def view(self, dtype: str, shape: list[int] | None = None, *, offset: int = 0) -> PinnedBuffer: ...

@final
class Checkpoint:
    """A safetensors checkpoint (a file, or an index and its shards), opened and checked."""

    def tensors(self) -> list[tuple[str, str | None, list[int], int, str]]: ...
    def check_loadable(self, selection: list[int]) -> None: ...
    def files(self) -> list[str]: ...
    def locations(self) -> list[str]: ...
    def select(
        self, names: list[str] | None = None, rank: int | None = None, world: int | None = None
    ) -> list[int]: ...
    def shards(self, world: int, names: list[str] | None = None) -> list[list[str]]: ...
    def load_to_host(
        self,
        selection: list[int],
        *,
        gpu: int | None = None,
        node: int | None = None,
        threads: int = 0,
        chunk_bytes: int = 0,
        readers: int = 1,
        io: str = "auto",
    ) -> tuple[list[PinnedBuffer], dict[str, Any]]: ...
    def load_to_device(
        self,
        selection: list[int],
        make: Callable[[int], int],
        gpu: int,
        stream: int,
        *,
        threads: int = 0,
        chunk_bytes: int = 0,
        readers: int = 1,
        io: str = "auto",
    ) -> dict[str, Any]: ...

def open_safetensors(path: str) -> Checkpoint: ...
def check_io(io: str) -> None: ...
def read_to_device(
    path: str,
    offset: int,
    nbytes: int,
    device_ptr: int,
    gpu: int,
    stream: int,
    *,
    threads: int = 0,
    chunk_bytes: int = 0,
    io: str = "auto",
) -> dict[str, Any]: ...
def read_to_host(
    path: str,
    offset: int,
    nbytes: int,
    address: int,
    *,
    gpu: int | None = None,
    node: int | None = None,
    threads: int = 0,
    chunk_bytes: int = 0,
    io: str = "auto",
) -> dict[str, Any]: ...
def locate(path: str) -> tuple[str, list[dict[str, Any]]]: ...
def save_safetensors(
    path: str,
    tensors: list[tuple[str, str, list[int], int, int, int]],
    *,
    metadata: dict[str, str] | None = None,
    max_shard_size: int | None = None,
    prefix: str = "model",
    gpu: int | None = None,
    node: int | None = None,
    streams: list[tuple[int, int]] = ...,
    threads: int = 0,
    chunk_bytes: int = 8388608,
    io: str = "auto",
    fsync: bool = True,
) -> dict[str, Any]: ...
def staging_buffers(
    parts: list[tuple[str, list[int]]], *, gpu: int | None = None, node: int | None = None
) -> list[PinnedBuffer]: ...

"""Type stubs of numapin's compiled module (the public API is `numapin`)."""

from typing import Any

DLPACK_VERSION: tuple[int, int]

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
) -> None: ...
def stats() -> list[dict[str, Any]]: ...
def trim() -> int: ...
def dtypes() -> list[str]: ...
def _delete_export_on_foreign_thread(buf: PinnedBuffer) -> int: ...

"""empty(), pin() and the copies with torch tensors (CPU paths; the GPU ones
are in test_gpu.py)."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

import numapin  # noqa: E402
from numapin import _numapin  # noqa: E402
from conftest import in_use  # noqa: E402

TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.uint16, torch.int16, torch.uint32,
    torch.int32, torch.uint64, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
    torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
]


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_dtype_has_its_shape_strides_and_exact_size(dtype, no_leak):
    t = numapin.empty((3, 4, 5), dtype)
    assert t.dtype == dtype and t.device.type == "cpu"
    assert tuple(t.shape) == (3, 4, 5) and t.stride() == (20, 5, 1)
    assert t.untyped_storage().nbytes() == 60 * t.element_size()
    del t


def test_released_exactly_when_the_last_view_dies(no_leak):
    before = in_use()
    t = numapin.empty((64, 1024), torch.float32)
    row, col, flat, tr = t[1], t[:, 2], t.view(-1), t.t()
    del t
    gc.collect()
    assert in_use() > before
    del row, col, flat
    gc.collect()
    assert in_use() > before
    tr.fill_(1.0)  # still usable memory
    del tr
    assert in_use() == before


def test_writes_through_the_tensor_reach_the_arena_memory(no_leak):
    buf = _numapin.empty((4,), "int32")
    t = torch.from_dlpack(buf)
    t.copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    assert buf.to_bytes() == torch.tensor([1, 2, 3, 4], dtype=torch.int32).numpy().tobytes()
    del t, buf


def test_without_cuda_the_tensor_is_not_pinned_and_says_so():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: test_gpu.py covers pinning")
    buf = _numapin.empty((8,), "float32")
    assert not buf.registered
    t = numapin.empty(8, torch.float32)
    assert not t.is_pinned()
    reg = {s["registration"] for s in numapin.stats() if s["regions"]}
    assert reg and all(r.startswith("skipped") for r in reg), reg


def test_pin_matches_pin_memory_bit_for_bit(no_leak):
    g = torch.Generator().manual_seed(0)
    for src in (
        torch.randn(1000, 33, generator=g),
        torch.randn(64, 64, generator=g).t(),  # not contiguous
        torch.randn(8, 8, dtype=torch.complex64, generator=g).conj(),  # lazy conjugate
        torch.randint(0, 100, (5 << 20,), generator=g, dtype=torch.int32),  # threads
        torch.randn(3, 5, generator=g).to(torch.bfloat16),
    ):
        p = numapin.pin(src)
        assert isinstance(p, torch.Tensor) and p.is_contiguous()
        assert p.dtype == src.dtype and p.shape == src.shape
        assert torch.equal(p, src.resolve_conj())
        del p


def test_copy_functions_refuse_what_is_not_a_cuda_tensor():
    a = torch.zeros(4)
    with pytest.raises(numapin.InputError) as e:
        numapin.copy_to_device(a, torch.zeros(4))
    assert "CUDA tensor" in str(e.value)
    with pytest.raises(numapin.InputError):
        numapin.copy_from_device(torch.zeros(4), a)
    with pytest.raises(numapin.InputError) as e:
        numapin.copy_to_device(torch.zeros(4, 4).t(), torch.zeros(4))
    assert "contiguous" in str(e.value)


def test_pin_refuses_a_tensor_on_a_device():
    meta = torch.empty(4, device="meta")
    with pytest.raises(numapin.InputError) as e:
        numapin.pin(meta)
    assert "meta" in str(e.value)

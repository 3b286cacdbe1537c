"""Hostile input to `empty`, `pin`, `place` and `configure`: shapes, dtypes,
nodes and GPUs of every wrong kind; sources that are not plain contiguous
memory; every byte order and rank; many threads at once. Each call either
gives the right tensor or array, or raises a documented exception
(`numapin.InputError` / `ValueError`, `TypeError`, `numapin.BudgetError`)
whose message names the input and the fix, and leaves nothing allocated."""

from __future__ import annotations

import sys
import threading

import pytest

import numapin
from conftest import in_use, run_py

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

DOCUMENTED = (numapin.InputError, TypeError, numapin.BudgetError)


def refused(call, *exc):
    """Runs `call`, which must raise one of `exc` (default: the documented
    kinds) with a message that says what to do; nothing stays allocated."""
    want = exc or DOCUMENTED
    before = in_use()
    with pytest.raises(want) as info:
        call()
    e = info.value
    assert not isinstance(e, (OverflowError, RuntimeError)) or isinstance(e, numapin.Error), repr(e)
    assert "PanicException" not in type(e).__name__
    text = str(e)
    assert "fix:" in text or isinstance(e, TypeError), text
    assert in_use() == before, "a refused call left pinned memory in use"
    return e


# Shapes ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", [-1, (2, -3), (-(2**63),)])
def test_negative_dimensions_are_input_errors(shape):
    e = refused(lambda: numapin.empty(shape, "float32"), numapin.InputError)
    assert "negative" in str(e)


@pytest.mark.parametrize("shape", [(2**62, 2**62), (2**40, 2**40, 2**40), 2**64, (2**70,), -(2**70)])
def test_overflowing_shapes_are_input_errors_not_overflow_errors(shape):
    e = refused(lambda: numapin.empty(shape, "float32"), numapin.InputError)
    assert "shape" in str(e)


def test_a_shape_beyond_the_budget_is_a_budget_error():
    e = refused(lambda: numapin.empty((1 << 46,), "uint8"), numapin.BudgetError)
    assert "budget" in str(e).lower()


@pytest.mark.parametrize("shape", [1.5, "3", None, [1.0, 2], (2, None), True, (True, 2), np.bool_(True), object()])
def test_shapes_of_the_wrong_type_are_type_errors(shape):
    e = refused(lambda: numapin.empty(shape, "float32"), TypeError)
    assert "shape" in str(e)


@pytest.mark.parametrize(
    "shape, want",
    [
        (np.int64(3), (3,)),
        (np.uint8(2), (2,)),
        ((np.int32(2), np.int16(3)), (2, 3)),
        (np.array([2, 3]), (2, 3)),
        (torch.tensor(4), (4,)),
        (torch.Size([2, 2]), (2, 2)),
        ((), ()),
        (0, (0,)),
        ((3, 0), (3, 0)),
    ],
)
def test_numpy_and_torch_integers_make_shapes(shape, want, no_leak):
    t = numapin.empty(shape, torch.float32)
    assert tuple(t.shape) == want
    a = numapin.empty(shape, np.float32, like="numpy")
    assert a.shape == want
    del t, a


# Dtypes ---------------------------------------------------------------------

TORCH_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_torch_dtype_gives_its_tensor_or_an_input_error(dtype, no_leak):
    try:
        t = numapin.empty((2, 3), dtype)
    except numapin.InputError as e:
        assert str(dtype).removeprefix("torch.") in str(e) and "fix:" in str(e)
        return
    assert t.dtype == dtype and tuple(t.shape) == (2, 3)
    assert t.is_pinned() or not torch.cuda.is_available()
    del t


@pytest.mark.parametrize("dtype", ["bfloat16", "complex32", "float8_e4m3fn", "float8_e8m0fnu", torch.bfloat16])
def test_dtypes_numpy_cannot_hold_are_input_errors_for_numpy(dtype, no_leak):
    e = refused(lambda: numapin.empty(4, dtype, like="numpy"), numapin.InputError)
    assert "numpy" in str(e).lower()


@pytest.mark.parametrize(
    "dtype",
    [object, "O", "S5", "U3", np.dtype([("a", "i4"), ("b", "f8")]), "datetime64[s]", "timedelta64", np.longdouble,
     "float128", "V8", "nonsense", "", "float32 "],
)
def test_unknown_object_and_structured_dtypes_are_input_errors(dtype):
    refused(lambda: numapin.empty(4, dtype, like="numpy"), numapin.InputError)
    refused(lambda: numapin.empty(4, dtype), numapin.InputError)


@pytest.mark.parametrize("dtype", [None, 42, 1.5, object(), [np.float32], {"a": 1}])
def test_things_that_are_no_dtype_are_type_errors(dtype):
    e = refused(lambda: numapin.empty(4, dtype), TypeError)
    assert "dtype" in str(e)


@pytest.mark.parametrize("dtype", [">f4", ">i8", np.dtype("<u2").newbyteorder(">"), ">c8"])
def test_a_non_native_byte_order_for_empty_is_an_input_error(dtype):
    e = refused(lambda: numapin.empty(4, dtype, like="numpy"), numapin.InputError)
    assert "byte order" in str(e)


@pytest.mark.parametrize("dtype", [np.float32, "f4", "<f4", "=f4", "float32", float, int, bool, np.bool_, np.complex64,
                                   np.float16, np.uint64])
def test_numpy_dtype_spellings(dtype, no_leak):
    a = numapin.empty(3, dtype, like="numpy")
    assert a.dtype == np.dtype(dtype).newbyteorder("=")
    del a


# Names torch and NumPy read alike, and the two they read otherwise: each
# is read as the library of `like=` reads it.
AMBIGUOUS = {"float": ("float32", "float64"), "int": ("int32", "int64")}
ALIKE = {"long": "int64", "half": "float16", "double": "float64", "short": "int16", "cdouble": "complex128"}


@pytest.mark.parametrize("name", list(AMBIGUOUS) + list(ALIKE) + ["cfloat", "chalf"])
def test_dtype_names_are_read_as_the_library_of_like_reads_them(name, no_leak):
    t = numapin.empty(3, name)
    assert t.dtype == getattr(torch, name), name
    if name in ("cfloat", "chalf"):  # torch's names only
        e = refused(lambda: numapin.empty(3, name, like="numpy"), numapin.InputError)
        assert "complex64" in str(e) or "complex32" in str(e), str(e)
    else:
        a = numapin.empty(3, name, like="numpy")
        assert a.dtype == np.dtype(name), name
        want_torch, want_numpy = AMBIGUOUS.get(name, (ALIKE.get(name),) * 2)
        assert (str(t.dtype), a.dtype.name) == (f"torch.{want_torch}", want_numpy)
        del a
    del t


def test_shared_buffer_views_read_dtype_names_the_same_way(no_leak):
    import os

    sb = numapin.SharedBuffer.create(f"hostile-dtype-{os.getpid()}", 4096)
    assert sb.view("float").dtype == torch.float32
    assert sb.view("float", like="numpy").dtype == np.float64
    e = refused(lambda: sb.view("uint8", (1,) * 65, like="numpy"), numapin.InputError)
    assert "at most 64" in str(e)
    del sb


@pytest.mark.parametrize("ndim", [65, 100, 1000])
def test_more_dimensions_than_numpy_allows_are_refused_before_allocating(ndim, no_leak):
    # NumPy itself raises RuntimeError (from DLPack) or ValueError for them.
    e = refused(lambda: numapin.empty((1,) * ndim, "uint8", like="numpy"), numapin.InputError)
    assert f"shape of {ndim} dimensions: a NumPy array has at most 64" in str(e) and "fix:" in str(e)
    # torch takes them (through DLPack).
    t = numapin.empty((1,) * ndim, "uint8")
    assert t.dim() == ndim
    del t


def test_a_shape_of_endless_dimensions_is_refused_without_reading_it_all():
    def endless():
        while True:
            yield 1

    for shape in (endless(), range(10**12), (1,) * 65537):
        e = refused(lambda: numapin.empty(shape, "uint8"), numapin.InputError)
        assert "more than 65536 dimensions" in str(e), str(e)
    # The compiled module's own check, for its direct callers.
    e = refused(lambda: numapin._numapin.empty([1] * 65537, "uint8"), numapin.InputError)
    assert "65537 dimensions" in str(e)


def test_like_must_be_torch_or_numpy():
    refused(lambda: numapin.empty(3, "float32", like="jax"), numapin.InputError)
    refused(lambda: numapin.empty(3, "float32", like=None), numapin.InputError, TypeError)


# GPUs and nodes -------------------------------------------------------------

def _placed(fn, kw):
    """A call of `fn` (empty, pin or place) with GPU/node arguments `kw`."""
    return {
        "empty": lambda: numapin.empty(4, "float32", **kw),
        "pin": lambda: numapin.pin(torch.ones(4), **kw),
        "place": lambda: numapin.place(kw.get("gpu"), node=kw.get("node")),
    }[fn]


@pytest.mark.parametrize("kw", [{"gpu": -1}, {"gpu": 2**40}, {"gpu": 2**70}, {"node": -1}, {"node": 2**33},
                                {"node": 999}, {"gpu": 999}])
@pytest.mark.parametrize("fn", ["empty", "pin", "place"])
def test_out_of_range_gpus_and_nodes_are_input_errors(kw, fn):
    e = refused(_placed(fn, kw), numapin.InputError)
    assert ("gpu" in str(e).lower()) or ("node" in str(e).lower()), str(e)


@pytest.mark.parametrize("kw", [{"gpu": True}, {"gpu": "0"}, {"gpu": 0.0}, {"node": False}, {"node": "0"},
                                {"node": [0]}])
@pytest.mark.parametrize("fn", ["empty", "pin", "place"])
def test_gpus_and_nodes_of_the_wrong_type_are_type_errors(kw, fn):
    e = refused(_placed(fn, kw), TypeError)
    assert "gpu" in str(e) or "node" in str(e), str(e)


def test_numpy_and_torch_integers_name_nodes(no_leak):
    node = numapin.place().node
    for n in (np.int64(node), np.uint8(node), torch.tensor(node)):
        t = numapin.empty(2, "float32", node=n)
        assert t.shape == (2,)
        del t


# Sources that are not plain contiguous memory -------------------------------

def _sources():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    ro = np.arange(12, dtype=np.int32).reshape(3, 4)
    ro.setflags(write=False)
    pinned = torch.arange(5.0).pin_memory() if torch.cuda.is_available() else numapin.pin(torch.arange(5.0))
    return {
        "transposed": base.t(),
        "strided": base[::2, ::3],
        "negative_stride_numpy": np.arange(10.0)[::-1],
        "fortran": np.asfortranarray(np.arange(12).reshape(3, 4)),
        "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),
        "readonly": ro,
        "zero_size": torch.empty(0, 3),
        "zero_size_numpy": np.empty((2, 0), dtype=np.float64),
        "requires_grad": torch.arange(6.0, requires_grad=True).reshape(2, 3),
        "already_pinned": pinned,
        "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "neg": torch.tensor([1.0, -2.0])._neg_view() if hasattr(torch.Tensor, "_neg_view") else torch.tensor([-1.0, 2.0]),
        "bool": torch.tensor([True, False, True]),
        "bfloat16": torch.arange(4.0).to(torch.bfloat16),
        "scalar_tensor": torch.tensor(3.5),
        "non_contiguous_numpy_view": np.arange(20).reshape(4, 5)[:, 1:3],
    }


@pytest.mark.parametrize("name", list(_sources()))
def test_pin_copies_any_cpu_layout_with_its_shape_and_values(name, no_leak):
    x = _sources()[name]
    p = numapin.pin(x)
    assert type(p) is type(x)
    if isinstance(x, torch.Tensor):
        assert p.dtype == x.dtype and p.shape == x.shape and p.is_contiguous()
        assert torch.equal(p.resolve_conj().resolve_neg(), x.detach().resolve_conj().resolve_neg())
        assert not p.requires_grad
    else:
        assert p.dtype == x.dtype and p.shape == x.shape and p.flags.c_contiguous
        assert np.array_equal(p, x)
    del p


@pytest.mark.parametrize("src, want", [
    (b"\x01\x02\x03", np.array([1, 2, 3], dtype=np.uint8)),
    (bytearray(b"ab"), np.array([97, 98], dtype=np.uint8)),
    (b"", np.zeros(0, dtype=np.uint8)),
    (memoryview(np.arange(6, dtype=np.int16).reshape(2, 3)), np.arange(6, dtype=np.int16).reshape(2, 3)),
    (memoryview(np.arange(10, dtype=np.float64))[::3], np.arange(10, dtype=np.float64)[::3]),
    (memoryview(b"xyz"), np.frombuffer(b"xyz", dtype=np.uint8)),
])
def test_bytes_and_memoryviews_pin_to_arrays_of_their_values(src, want, no_leak):
    p = numapin.pin(src)
    assert isinstance(p, np.ndarray)
    assert p.dtype == want.dtype and p.shape == want.shape and np.array_equal(p, want)
    del p


@pytest.mark.parametrize("src", [
    np.array([object(), 1], dtype=object),
    np.array(["ab", "c"]),
    np.zeros(2, dtype=[("a", "i4")]),
    np.array([1, 2], dtype="datetime64[s]"),
    "a string",
    None,
    {"a": 1},
    [1, "x"],
])
def test_unpinnable_sources_are_documented_errors(src):
    refused(lambda: numapin.pin(src))


def test_tensors_not_in_cpu_memory_or_not_strided_are_input_errors():
    refused(lambda: numapin.pin(torch.empty(3, device="meta")), numapin.InputError)
    sparse = torch.eye(3).to_sparse()
    refused(lambda: numapin.pin(sparse), numapin.InputError)
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    refused(lambda: numapin.pin(q), numapin.InputError)


# Byte order and rank --------------------------------------------------------

ORDERS = ["<", ">", "=", "|"]
KINDS = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16", "b1"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("order", ORDERS)
def test_every_byte_order_pins_to_the_same_values(kind, order, no_leak):
    dt = np.dtype(kind) if order == "|" else np.dtype(order + kind)
    x = (np.arange(12) % 3 == 1) if kind == "b1" else (np.arange(12) * 7 - 20)
    x = x.astype(dt).reshape(3, 4)
    p = numapin.pin(x)
    assert p.shape == x.shape and np.array_equal(p, x), (dt, p, x)
    assert p.dtype.newbyteorder("=") == dt.newbyteorder("=")
    del p


@pytest.mark.parametrize("ndim", [0, 1, 2, 3, 5, 8, 16, 32])
def test_every_rank_keeps_its_shape(ndim, no_leak):
    shape = tuple(1 if i % 4 else 2 for i in range(ndim))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    p = numapin.pin(x)
    assert p.shape == shape and np.array_equal(p, x)
    t = numapin.pin(torch.from_numpy(x))
    assert tuple(t.shape) == shape and torch.equal(t, torch.from_numpy(x))
    e = numapin.empty(shape, "float32")
    assert tuple(e.shape) == shape
    del p, t, e


@pytest.mark.parametrize("scalar", [np.float32(1.5), np.int8(-3), np.bool_(True), np.complex64(1 - 2j),
                                    np.float64(2.0).astype(">f8"), np.uint64(2**64 - 1), 7, 2.5, True])
def test_numpy_and_python_scalars_pin_to_0d_arrays(scalar, no_leak):
    p = numapin.pin(scalar)
    want = np.asarray(scalar)
    assert p.shape == () and p.dtype.newbyteorder("=") == want.dtype.newbyteorder("=") and p == want
    del p


# configure ------------------------------------------------------------------

BAD_CONFIG = [
    ("budget_bytes", -1), ("budget_bytes", 2**70), ("budget_bytes", True), ("budget_bytes", "1G"),
    ("budget_fraction", float("nan")), ("budget_fraction", -0.5), ("budget_fraction", 0.0),
    ("budget_fraction", 1.5), ("budget_fraction", float("inf")), ("budget_fraction", "half"),
    ("region_bytes", 0), ("region_bytes", -1), ("region_bytes", 2**70), ("region_bytes", 2**62),
    ("thread_cache_blocks", -1), ("thread_cache_bytes", -5), ("populate_threads", -1),
    ("populate_threads", 2**70), ("register", "yes"), ("placement", "loose"), ("placement", 5),
    ("backend", "cuda"), ("huge_pages", "4k"), ("register_in_parts", 1.0),
]


def test_bad_configure_arguments_are_refused_at_once_and_leave_the_default():
    code = f"""
import numapin
from math import nan, inf
cases = {BAD_CONFIG!r}
for key, value in cases:
    try:
        numapin.configure(**{{key: value}})
    except (numapin.InputError, TypeError) as e:
        assert key in str(e), (key, str(e))
        print("refused", key)
        continue
    except BaseException as e:
        print("WRONG", key, repr(value), type(e).__name__, e)
        continue
    print("ACCEPTED", key, repr(value))
import numpy
a = numapin.empty(4, "float32", like="numpy")
print("made", a.shape)
"""
    r = run_py(code, env={"NUMAPIN_NO_CUDA": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "made (4,)", r.stdout
    assert all(line.startswith("refused") for line in lines[:-1]), r.stdout


@pytest.mark.parametrize(
    "key, value, names",
    [
        ("placement", "loose", ["strict", "warn"]),
        ("placement", 5, ["strict", "warn"]),
        ("backend", "cuda", ["mapped", "driver_numa", "host_alloc_bound"]),
        ("huge_pages", b"2m", ["auto", "thp", "2m", "1g", "none"]),
    ],
)
def test_a_wrong_option_names_the_argument_the_value_and_every_choice(key, value, names):
    # Checked as the compiled module reads it: nothing is stored, whether
    # or not the runtime was made.
    e = refused(lambda: numapin.configure(**{key: value}), numapin.InputError if isinstance(value, str) else TypeError)
    text = str(e)
    assert f"{key}=" in text and (repr(value) if not isinstance(value, str) else f'"{value}"') in text, text
    for n in names:
        assert f'"{n}"' in text, (n, text)


@pytest.mark.parametrize(
    "key, value, kind",
    [
        ("budget_bytes", True, TypeError),
        ("populate_threads", 4097, numapin.InputError),
        ("thread_cache_blocks", 2**40, numapin.InputError),
        ("budget_fraction", np.float32(0.5), TypeError),
        ("register", np.bool_(True), TypeError),
        ("register_in_parts", 1, TypeError),
    ],
)
def test_a_wrong_number_or_flag_names_the_argument_and_the_value(key, value, kind):
    e = refused(lambda: numapin.configure(**{key: value}), kind)
    assert f"{key}=" in str(e) and "fix: " in str(e), str(e)


def test_a_long_wrong_value_is_shown_cut():
    e = refused(lambda: numapin.configure(placement="x" * 100_000), numapin.InputError)
    assert len(str(e)) < 1000 and "xxx..." in str(e), str(e)[:200]


def test_configure_after_first_use_is_an_input_error():
    numapin.stats()
    e = refused(lambda: numapin.configure(budget_bytes=1 << 20), numapin.InputError)
    assert "configure" in str(e)


# Threads --------------------------------------------------------------------

def test_many_threads_configure_stats_trim_and_empty_at_once():
    code = """
import threading, numapin
errors, made = [], []
start = threading.Barrier(16)
def work(i):
    start.wait()
    try:
        for k in range(50):
            if k % 10 == 0:
                try:
                    numapin.configure(thread_cache_blocks=4)
                except numapin.InputError:
                    pass
            b = numapin._numapin.empty([k + 1 + i], "uint8")
            numapin.stats(); numapin.trim()
            made.append(b.nbytes)
            del b
    except BaseException as e:
        errors.append(repr(e))
ts = [threading.Thread(target=work, args=(i,)) for i in range(16)]
[t.start() for t in ts]; [t.join(60) for t in ts]
import gc; gc.collect()
print(len(made), errors[:3], sum(s["bytes_in_use"] for s in numapin.stats()))
"""
    r = run_py(code, env={"NUMAPIN_NO_CUDA": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "800" and r.stdout.rstrip().endswith("[] 0"), r.stdout


def test_threads_in_this_process_share_one_runtime(no_leak):
    out: list[object] = []

    def work():
        try:
            for _ in range(20):
                t = numapin.empty(1000, torch.float32)
                t.fill_(1)
                out.append(float(t.sum()))
                numapin.stats()
        except BaseException as e:  # noqa: BLE001
            out.append(e)

    ts = [threading.Thread(target=work) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert out == [1000.0] * 160, [o for o in out if not isinstance(o, float)][:3]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

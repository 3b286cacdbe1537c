"""empty() and pin() with NumPy: pinned memory from the node's arena, of the
size asked for, given back when the last array over it is gone."""

from __future__ import annotations

import gc
import threading
import time

import pytest

np = pytest.importorskip("numpy")

import numapin  # noqa: E402
from numapin import _numapin  # noqa: E402
from conftest import in_use, run_py  # noqa: E402


def test_empty_is_an_exact_c_contiguous_array_on_a_node(no_leak):
    a = numapin.empty((3, 5), "float64", like="numpy")
    assert a.shape == (3, 5) and a.dtype == np.float64 and a.flags.c_contiguous
    a[:] = 7.0
    assert a.sum() == 105.0
    node = numapin.topology().numa_nodes[0].os_index
    b = numapin.empty(1000, np.uint8, node=node, like="numpy")
    assert b.nbytes == 1000
    del a, b


def test_sizes_are_not_rounded_up_to_powers_of_two(no_leak):
    before = in_use()
    a = numapin.empty(5 * 2**20 + 3, "uint8", like="numpy")
    # Only the arena's 4 KiB alignment: 5 MiB + 4 KiB, not 8 MiB.
    assert in_use() - before == 5 * 2**20 + 4096
    del a


def test_memory_goes_back_when_the_last_view_dies_and_not_before(no_leak):
    before = in_use()
    a = numapin.empty((4, 1024), "float32", like="numpy")
    row = a[1]
    col = a[:, 2]
    del a
    gc.collect()
    assert in_use() > before, "a view alone must keep the memory"
    row[:] = 1.0
    col[:] = 2.0
    del row
    assert in_use() > before
    del col
    assert in_use() == before


def test_zero_sized_and_zero_dimensional_arrays():
    z = numapin.empty((0, 4), "float32", like="numpy")
    assert z.shape == (0, 4) and z.size == 0
    s = numapin.empty((), "int32", like="numpy")
    assert s.shape == () and s.ndim == 0
    s[()] = 5
    assert int(s) == 5


def test_pin_copies_exactly_from_contiguous_and_strided_arrays(no_leak):
    rng = np.random.default_rng(1)
    for src in (
        rng.integers(0, 255, size=(257, 1031), dtype=np.uint8),
        rng.standard_normal((64, 128)).astype(np.float32)[:, ::2],  # strided
        rng.standard_normal(3 * 2**20 // 8 + 11),  # above the 4 MiB parallel threshold
    ):
        p = numapin.pin(src)
        assert isinstance(p, np.ndarray) and p.flags.c_contiguous
        assert p.dtype == src.dtype and p.shape == src.shape
        np.testing.assert_array_equal(p, src)
        del p


def test_pin_of_a_large_array_uses_threads_and_stays_exact(no_leak):
    src = np.arange(48 * 2**20 // 8, dtype=np.int64)
    p = numapin.pin(src)
    np.testing.assert_array_equal(p, src)
    del p


def test_the_gil_is_released_while_pinning(no_leak):
    src = np.ones(256 * 2**20 // 8)
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.01)
    start = ticks
    for _ in range(3):
        p = numapin.pin(src)
        del p
    stop.set()
    t.join()
    # With the GIL held through three 256 MiB copies the counter would
    # barely move; released, it runs alongside.
    assert ticks - start > 1000, ticks - start


def test_stats_per_node_and_trim():
    s = numapin.stats()
    assert s and all({"node", "bytes_reserved", "bytes_in_use", "budget", "registration"} <= d.keys() for d in s)
    a = numapin.empty(2**20, "uint8", like="numpy")
    assert sum(d["bytes_in_use"] for d in numapin.stats()) >= 2**20
    del a
    gc.collect()
    numapin.trim()
    assert sum(d["bytes_reserved"] for d in numapin.stats()) == 0


def test_dlpack_deleter_runs_without_the_gil():
    buf = _numapin.empty((16,), "float32")
    assert buf._owners == 1
    # Deleting an export on a thread that never touched Python, while this
    # one holds the GIL, must not deadlock (torch frees tensors that way).
    assert _numapin._delete_export_on_foreign_thread(buf) == 1


def test_bad_shapes_and_dtypes_are_input_errors():
    with pytest.raises(numapin.InputError) as e:
        numapin.empty((2, -1), "float32", like="numpy")
    assert "-1" in str(e.value) and e.value.fix
    with pytest.raises(numapin.InputError) as e:
        numapin.empty(4, "float128", like="numpy")
    assert "float128" in str(e.value) and "float32" in e.value.fix
    with pytest.raises(numapin.InputError):
        numapin.empty(4, "float32", like="cupy")
    with pytest.raises(numapin.InputError) as e:
        numapin.empty(4, "float32", node=4000, like="numpy")
    assert "4000" in str(e.value)


def test_budget_exhausted_is_a_budget_error_and_frees_make_room():
    r = run_py(
        """
        import numapin, gc
        numapin.configure(budget_bytes=8 << 20, region_bytes=4 << 20)
        a = numapin.empty(6 << 20, "uint8", like="numpy")
        try:
            numapin.empty(6 << 20, "uint8", like="numpy")
        except numapin.BudgetError as e:
            assert isinstance(e, MemoryError)
            print("budget", "RuntimeConfig" not in str(e), e.fix is not None)
        del a; gc.collect()
        b = numapin.empty(6 << 20, "uint8", like="numpy")
        print("after free", b.nbytes)
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0].startswith("budget"), r.stdout
    assert "after free 6291456" in r.stdout


def test_configure_comes_before_first_use():
    r = run_py(
        """
        import numapin
        numapin.stats()
        try:
            numapin.configure(budget_bytes=1 << 30)
        except numapin.InputError as e:
            print("refused:", e.fix)
        """
    )
    assert r.returncode == 0, r.stderr
    assert "refused: call numapin.configure() once" in r.stdout
    with pytest.raises(numapin.InputError) as e:
        numapin.configure(placement="sometimes")
    assert "strict" in e.value.fix
    with pytest.raises(numapin.InputError) as e:
        numapin.configure(huge_pages="4k")
    assert "4k" in str(e.value) and '"auto"' in e.value.fix


def test_huge_pages_are_configured_and_counted():
    # 4 KiB pages asked for: the stats say so, on every node with a region.
    r = run_py(
        """
        import numapin
        numapin.configure(huge_pages="none", region_bytes=4 << 20)
        a = numapin.empty(1 << 20, "uint8", like="numpy")
        s = [s for s in numapin.stats() if s["regions"]][0]
        print(s["regions_base_pages"], s["regions_thp"], s["regions_hugetlb_2m"], s["regions_hugetlb_1g"])
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "0", "0", "0"], r.stdout
    # A 1 GiB pool nobody reserved: a BudgetError (or, where the kernel
    # offers no 1 GiB pages, an Error) naming the pool, with its fix.
    r = run_py(
        """
        import numapin
        numapin.configure(huge_pages="1g")
        try:
            numapin.empty(1 << 20, "uint8", like="numpy")
            print("made")
        except numapin.Error as e:
            print(type(e).__name__, "hugetlb" in str(e), "nr_hugepages" in (e.fix or ""))
        """
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    if out != ["made"]:
        assert out[1:] == ["True", "True"], r.stdout
        assert out[0] in ("BudgetError", "Error"), r.stdout


def test_backend_is_checked_and_driver_backends_need_a_driver():
    with pytest.raises(numapin.InputError) as e:
        numapin.configure(backend="anywhere")
    assert "driver_numa" in e.value.fix
    r = run_py(
        """
        import numapin
        numapin.configure(backend="driver_numa")
        try:
            numapin.empty(1 << 20, "uint8", like="numpy")
        except numapin.Error as e:
            print("refused:", str(e).splitlines()[0], "|", e.fix)
        """,
        env={"NUMAPIN_NO_CUDA": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "the driver_numa backend" in r.stdout, r.stdout
    assert "Backend::Mapped" in r.stdout or "default backend" in r.stdout, r.stdout


def test_regions_in_parts_keep_every_buffer_inside_one_half():
    # 4 MiB regions in halves of 2 MiB: 1.5 MiB buffers take a half each,
    # two per region; in one piece a region holds two as well, with room
    # for a third 1 MiB buffer that the halves cannot give.
    code = """
        import numapin
        numapin.configure(region_bytes=4 << 20, register_in_parts={parts})
        keep = [numapin.empty(3 << 19, "uint8", like="numpy") for _ in range(2)]
        keep.append(numapin.empty(1 << 20, "uint8", like="numpy"))
        print(sum(s["regions"] for s in numapin.stats()))
        """
    for parts, regions in [(True, "2"), (False, "1")]:
        r = run_py(code.format(parts=parts))
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [regions], (parts, r.stdout)


HOLDER = """
import sys, numapin
numapin.configure(machine_budget="8MiB", region_bytes=2 << 20)
a = numapin.empty(6 << 20, "uint8", like="numpy")
s = [s for s in numapin.stats() if s["regions"]][0]
print(s["machine_budget"], s["machine_used"], s["machine_share"], flush=True)
sys.stdin.readline()
"""


def _holder(state_dir):
    """A process holding 6 MiB of an 8 MiB machine budget (state file in
    `state_dir`) until a line arrives on its standard input."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMAPIN_MACHINE_BUDGET_DIR=str(state_dir))
    p = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline().split()
    assert first == [str(8 << 20), str(6 << 20), str(6 << 20)], (first, p.stderr.read() if p.poll() else "")
    return p


def test_the_machine_budget_is_shared_by_processes_and_names_the_holders(tmp_path):
    holder = _holder(tmp_path)
    try:
        r = run_py(
            """
            import numapin
            numapin.configure(machine_budget=8 << 20, region_bytes=2 << 20)
            try:
                numapin.empty(4 << 20, "uint8", like="numpy")
                print("made")
            except numapin.BudgetError as e:
                print("BudgetError", e.fix is not None and "NUMAPIN_MACHINE_BUDGET" in e.fix)
                print(e)
            s = [s for s in numapin.stats() if s["machine_budget"]][0]
            print("stats", s["machine_used"], s["machine_share"])
            """,
            env={"NUMAPIN_MACHINE_BUDGET_DIR": str(tmp_path)},
        )
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "BudgetError True", r.stdout
        assert f"pid {holder.pid} (python" in r.stdout, r.stdout
        assert f"stats {6 << 20} 0" in r.stdout, r.stdout
        # budget_wait: waits for the holder to let go.
        waiter = run_py_async(
            """
            import time, numapin
            numapin.configure(machine_budget="8MiB", budget_wait=60, region_bytes=2 << 20)
            t = time.monotonic()
            a = numapin.empty(4 << 20, "uint8", like="numpy")
            print("made", a.nbytes, time.monotonic() - t > 0.2)
            """,
            env={"NUMAPIN_MACHINE_BUDGET_DIR": str(tmp_path)},
        )
        time.sleep(0.5)
        holder.stdin.write("\n")
        holder.stdin.flush()
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, err
        assert out.split() == ["made", str(4 << 20), "True"], out
    finally:
        holder.kill()
        holder.wait()


def run_py_async(code: str, env: dict[str, str]):
    import os
    import subprocess
    import sys
    import textwrap

    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=dict(os.environ, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_machine_budget_settings_are_checked():
    for bad in ["lots", "64GB", "2", "-0.5", "0B"]:
        with pytest.raises(numapin.InputError) as e:
            numapin.configure(machine_budget=bad)
        assert "machine_budget" in str(e.value) and "64GiB" in e.value.fix, bad
    for bad in [1.5, 0.0, float("nan"), -3]:
        with pytest.raises(numapin.InputError):
            numapin.configure(machine_budget=bad)
    with pytest.raises(TypeError):
        numapin.configure(machine_budget=True)
    with pytest.raises(TypeError):
        numapin.configure(budget_wait="soon")
    with pytest.raises(numapin.InputError):
        numapin.configure(budget_wait=-1.0)
    # A bad variable: an InputError naming it, at first use.
    r = run_py(
        """
        import numapin
        try:
            numapin.empty(1, "uint8", like="numpy")
        except numapin.InputError as e:
            print("InputError", e.fix)
            print(e)
        """,
        env={"NUMAPIN_MACHINE_BUDGET": "half"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("InputError"), r.stdout
    assert "NUMAPIN_MACHINE_BUDGET" in r.stdout and "half" in r.stdout, r.stdout
    # off: no machine budget in the stats.
    r = run_py(
        """
        import numapin
        a = numapin.empty(1 << 20, "uint8", like="numpy")
        print([s["machine_budget"] for s in numapin.stats() if s["regions"]])
        """,
        env={"NUMAPIN_MACHINE_BUDGET": "off"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0]", r.stdout

"""numapin.bind(): the process moves near its GPU (or node), as `numapin exec`."""

from __future__ import annotations

import os

import pytest

import numapin
from conftest import FIXTURES, run_py, requires


def test_binding_to_a_node_moves_every_thread_and_the_memory_policy():
    r = run_py(
        """
        import os, threading, numapin
        node = numapin.topology().numa_nodes[0]
        ready = threading.Event(); done = threading.Event(); seen = {}
        def worker():
            ready.set(); done.wait()
            seen["cpus"] = sorted(os.sched_getaffinity(0))
        t = threading.Thread(target=worker); t.start(); ready.wait()
        p = numapin.bind(node=node.os_index)
        done.set(); t.join()
        assert sorted(os.sched_getaffinity(0)) == p.cpus, (p, os.sched_getaffinity(0))
        assert seen["cpus"] == p.cpus, "a thread started before bind() was left behind"
        assert p.mems == [node.os_index]
        status = open("/proc/self/status").read()
        print("ok", p.chosen_by)
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok NUMA node"), r.stdout


@requires("tool", "taskset")
def test_under_taskset_the_binding_stays_inside_the_allowed_cpus():
    cpu = min(os.sched_getaffinity(0))
    r = run_py(
        """
        import os, numapin
        n = numapin.topology().numa_nodes[0].os_index
        p = numapin.bind(node=n, memory="none")
        print(sorted(os.sched_getaffinity(0)), p.cpus)
        """,
        prefix=["taskset", "-c", str(cpu)],
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("]")[0] == f"[{cpu}", r.stdout


def test_a_saved_machine_is_planned_not_bound():
    before = os.sched_getaffinity(0)
    p = numapin.bind(3, input=FIXTURES / "dgx-h100.xml")
    assert os.sched_getaffinity(0) == before
    assert p.local_rank == 3 and p.gpu == 3
    t = numapin.topology(FIXTURES / "dgx-h100.xml")
    assert p.cpus == [c for c in t.gpus[3].local_cpus if c in t.allowed.cpus]
    assert "local rank 3" in p.chosen_by


def test_local_rank_defaults_to_the_launchers_variable():
    r = run_py(
        f"""
        import numapin
        p = numapin.bind(input={str(FIXTURES / "dgx-h100.xml")!r})
        print(p.local_rank, p.gpu, p.chosen_by)
        """,
        env={"LOCAL_RANK": "5"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("5 5 "), r.stdout
    assert "LOCAL_RANK" in r.stdout


def test_bad_arguments_are_input_errors_with_a_fix():
    with pytest.raises(numapin.InputError) as e:
        numapin.bind(0, mode="fastest", input=FIXTURES / "dgx-h100.xml")
    assert "fastest" in str(e.value) and e.value.fix
    with pytest.raises(numapin.InputError) as e:
        numapin.bind(0, memory="everywhere", input=FIXTURES / "dgx-h100.xml")
    assert '"bind"' in e.value.fix and '"none"' in e.value.fix, e.value.fix
    with pytest.raises(TypeError) as t:
        numapin.bind(0, mode=5, input=FIXTURES / "dgx-h100.xml")
    assert "mode=5" in str(t.value) and '"socket"' in str(t.value), t.value
    # The library's other spelling of cache.
    assert numapin.bind(0, mode="core-complex", input=FIXTURES / "dgx-h100.xml").cpus
    with pytest.raises(numapin.InputError) as e:
        numapin.bind(99, input=FIXTURES / "dgx-h100.xml")
    assert "99" in str(e.value)


def test_no_rank_and_no_gpu_says_which_variables_were_read():
    r = run_py(
        """
        import numapin
        try:
            numapin.bind(input=%r)
        except numapin.InputError as e:
            print(e)
        """ % str(FIXTURES / "dgx-h100.xml"),
    )
    assert r.returncode == 0, r.stderr
    assert "LOCAL_RANK" in r.stdout and "SLURM_LOCALID" in r.stdout

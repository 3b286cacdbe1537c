"""numapin.topology(): this machine and saved ones, as `numapin topo` reads them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import numapin
from conftest import FIXTURES, ROOT, run_py, skip


def cli() -> str | None:
    """The numapin binary built beside the package, if there is one."""
    for p in (ROOT / "target" / "release" / "numapin", ROOT / "target" / "debug" / "numapin"):
        if p.is_file():
            return str(p)
    return shutil.which("numapin")


def test_a_saved_dgx_a100_has_its_gpus_on_their_nodes():
    t = numapin.topology(FIXTURES / "dgx-a100-nps4.xml")
    assert len(t.gpus) == 8
    assert len(t.numa_nodes) == 8 and len(t.packages) == 2
    # GPU 0 hangs off NPS4 node 3 of package 0, with that node's CPUs.
    g0 = t.gpus[0]
    assert (g0.pci_bus_id, g0.numa_node, g0.package) == ("0000:07:00.0", 3, 0)
    assert g0.local_cpus == list(range(48, 64)) + list(range(176, 192))
    assert t.gpu_by_ordinal(0) == g0
    node3 = next(n for n in t.numa_nodes if n.os_index == 3)
    assert node3.cpus == g0.local_cpus and node3.package == 0


def test_to_dict_is_the_documented_schema_and_str_is_the_topo_table():
    path = FIXTURES / "dgx-h100.xml"
    t = numapin.topology(path)
    d = t.to_dict()
    assert d["schema_version"] == 1
    assert {"packages", "numa_nodes", "gpus", "allowed", "warnings", "cuda"} <= d.keys()
    assert d["gpus"][0]["local_cpus"].count("-") >= 1  # cpulist strings in the schema
    exe = cli()
    if exe is None:
        pytest.skip("the numapin binary is not built (cargo build --release -p numapin-cli)")
    env = dict(os.environ)
    out = subprocess.run([exe, "topo", "--json", "--input", str(path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert d == json.loads(out.stdout)
    text = subprocess.run([exe, "topo", "--input", str(path)], capture_output=True, text=True, env=env)
    assert str(t) == text.stdout


def test_this_machine_lists_the_cpus_this_process_may_use():
    t = numapin.topology()
    assert t.source == "live"
    assert sorted(t.allowed.cpus) == sorted(os.sched_getaffinity(0))
    assert t.numa_nodes and all(n.cpus or n.kind != "normal" for n in t.numa_nodes)


def test_a_missing_file_is_an_input_error_naming_it():
    with pytest.raises(numapin.InputError) as e:
        numapin.topology("/nonexistent/machine.xml")
    assert "/nonexistent/machine.xml" in str(e.value)
    assert e.value.fix == "check the path"
    assert e.value.kind == "input"


def test_a_bad_cuda_visible_devices_names_the_variable():
    r = run_py(
        f"""
        import numapin
        try:
            numapin.topology({str(FIXTURES / "dgx-h100.xml")!r})
        except numapin.InputError as e:
            print("InputError", e.fix)
        """,
        env={"CUDA_VISIBLE_DEVICES": "0,zero"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("InputError"), r.stdout
    assert "CUDA_VISIBLE_DEVICES" in r.stdout or "GPU indices" in r.stdout


def test_shared_real_machines_read_when_present():
    shared = ROOT.parent / "shared" / "topologies" / "nccl"
    files = sorted(shared.glob("*")) if shared.is_dir() else []
    if not files:
        skip("shared", "../shared/topologies is not there")
    for f in files:
        t = numapin.topology(f)
        assert t.gpus, f
        assert all(g.numa_node is None or any(n.os_index == g.numa_node for n in t.numa_nodes) for g in t.gpus)

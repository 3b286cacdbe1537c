"""numapin.doctor(): the checks of `numapin doctor`, as typed objects."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest

import numapin
from conftest import FIXTURES, run_py, skip
from test_topology import cli

# The checks every report on this machine holds, in report order.
CHECKS = [
    "memlock", "cgroup_memory", "cuda_driver", "gpu_visible", "pcie_link", "gpu_locality",
    "gpu_cpus_allowed", "gpu_memory_allowed", "nic_locality", "nic_pcie_link", "memory_policy",
    "numa_syscalls", "container", "transparent_hugepages", "huge_pages", "numa_balancing", "iommu",
    "storage_locality", "pin_probe",
]
LIVE = [
    "memlock", "cgroup_memory", "cuda_driver", "memory_policy", "numa_syscalls", "container",
    "transparent_hugepages", "huge_pages", "numa_balancing", "iommu", "storage_locality",
    "pin_probe",
]


def test_this_machine_gets_every_check_with_evidence():
    checks = numapin.doctor(cuda=False)
    assert all(isinstance(c, numapin.DoctorCheck) for c in checks)
    names = [c.name for c in checks]
    assert sorted(set(names), key=CHECKS.index) == CHECKS
    for c in checks:
        assert c.verdict in ("ok", "warn", "fail"), c
        assert c.evidence, c
        # A fix exactly when there is something to do.
        assert (c.fix is None) == (c.verdict == "ok"), c
        # The subject names the GPU, node or NIC the check is about.
        ids = {"GPU": c.gpu, "node": c.node, "NIC": c.nic}
        if c.subject is None:
            assert ids == {"GPU": None, "node": None, "NIC": None}, c
        else:
            kind, n = c.subject.split(" ")
            assert ids[kind] == int(n), c
    # The pin probe ran once per node and every page stayed on its node.
    probes = [c for c in checks if c.name == "pin_probe"]
    assert {c.node for c in probes} == {n.os_index for n in numapin.topology().numa_nodes}
    assert all(c.verdict == "ok" for c in probes), probes


def test_the_pin_probe_can_be_left_out():
    checks = numapin.doctor(cuda=False, pin_probe=False)
    last = checks[-1]
    assert (last.name, last.verdict, last.subject, last.fix) == ("pin_probe", "skip", None, None)
    assert "pin_probe" in last.evidence
    assert [c.name for c in checks if c.verdict == "skip"] == ["pin_probe"]


def test_a_saved_machine_skips_the_live_checks_and_matches_the_command_line():
    path = FIXTURES / "pcie-switch-2s.xml"
    checks = numapin.doctor(path)
    skipped = [c for c in checks if c.verdict == "skip"]
    assert [c.name for c in skipped] == LIVE
    assert all(c.evidence == f"reads this machine's live state, not {path}'s" for c in skipped)
    ran = [c for c in checks if c.verdict != "skip"]
    gpu_lines = [c for c in ran if c.name == "pcie_link"]
    assert [c.subject for c in gpu_lines] == [f"GPU {i}" for i in range(len(gpu_lines))]
    exe = cli()
    if exe is None:
        pytest.skip("the numapin binary is not built (cargo build --release -p numapin-cli)")
    out = subprocess.run([exe, "doctor", "--json", "--input", str(path)],
                         capture_output=True, text=True, env=dict(os.environ))
    report = json.loads(out.stdout)
    assert [c.to_dict() for c in ran] == report["checks"]
    assert [c.name for c in skipped] == [n["name"] for n in report["not_run"]]
    assert out.returncode == (1 if any(c.verdict == "fail" for c in ran) else 0)


def test_checks_are_frozen_values():
    a = numapin.doctor(FIXTURES / "cloud-vm-2n-nolocality.xml")
    b = numapin.doctor(FIXTURES / "cloud-vm-2n-nolocality.xml")
    assert a == b and len(set(a)) == len(a)
    c = next(c for c in a if c.name == "gpu_locality")
    assert c.verdict == "warn" and "NUMA node unknown" in c.evidence and c.fix
    assert repr(c).startswith("DoctorCheck(name='gpu_locality', subject='GPU 0', verdict='warn'")
    with pytest.raises(AttributeError):
        c.verdict = "ok"  # type: ignore[misc]
    assert not dataclasses.is_dataclass(c)
    assert list(c.to_dict()) == ["name", "verdict", "evidence", "fix", "gpu", "node", "nic", "subject"]


def test_a_missing_file_is_an_input_error_naming_it():
    with pytest.raises(numapin.InputError) as e:
        numapin.doctor("/nonexistent/machine.xml")
    assert "/nonexistent/machine.xml" in str(e.value)


def test_a_low_memlock_limit_fails_with_its_fix_as_nobody():
    """As an unprivileged user with an 8 MiB limit (root has CAP_IPC_LOCK,
    which the limit does not bind), the memlock check fails with the fix."""
    if os.geteuid() != 0:
        skip("root", "needs root to start a child as nobody")
    code = """
        import json, os, resource
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (8 << 20, 8 << 20))
        import numapin  # before dropping root: the package may not be readable by nobody
        os.setgid(65534); os.setuid(65534)
        c = next(c for c in numapin.doctor(cuda=False, pin_probe=False) if c.name == "memlock")
        print(json.dumps(c.to_dict()))
    """
    r = run_py(code, env={"NUMAPIN_NO_CUDA": "1"})
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert c["verdict"] == "fail", c
    assert "soft 8 MiB" in c["evidence"] and "no CAP_IPC_LOCK" in c["evidence"]
    assert "ulimit -l" in c["fix"]

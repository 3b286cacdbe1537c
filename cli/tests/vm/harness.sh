#!/usr/bin/env bash
# shellcheck disable=SC2015  # "A && B || die" here means: die unless both hold.
# Boots an emulated multi-NUMA-node x86-64 machine (QEMU, software emulation),
# runs a shell script inside it, prints what the script printed and exits with
# its exit code. See docs/vm-tests.md.
#
#   tests/vm/harness.sh [OPTIONS] SCRIPT
#
# Options:
#   --nodes N             NUMA nodes (default 4), each with its own memory
#   --cpus-per-node K     CPUs on each node (default 1): node N has CPUs N*K..N*K+K-1
#   --node-mem MIB        memory of each node in MiB (default 512)
#   --accel-node N        put a stand-in accelerator (QEMU pci-testdev, PCI id
#                         1b36:0005) behind its own PCIe expander bridge on node N;
#                         repeatable, at most 7
#   --nic-node N          put an emulated Intel 82574L Ethernet NIC (QEMU e1000e, PCI id
#                         8086:10d3) behind its own PCIe expander bridge on node N;
#                         repeatable; accelerators and NICs together at most 7. The
#                         kernel's e1000e module is shipped and loaded when
#                         /lib/modules/VERSION (VERSION from the kernel's file name
#                         vmlinuz-VERSION, or NUMAPIN_VM_MODULES) has it; without it
#                         the NIC is on the PCI bus with no driver and no interface
#   --bin PATH[:NAME]     ship an executable as /bin/NAME (default: its file name),
#                         with the shared libraries `ldd` lists and the dynamic loader
#   --file PATH:DEST      ship a file or folder to DEST (an absolute guest path)
#   --timeout SECS        hard limit for boot, run and power-off (default 300)
#   --workdir DIR         keep the initramfs and the console logs in DIR
#                         (default: a temporary folder, removed afterwards)
#   --check               only check that everything needed is here
#
# SCRIPT runs under busybox sh as root with /proc, /sys, /dev and /tmp mounted
# and NUMAPIN_VM_GUEST=1 set. It may call `step NAME CMD [ARGS...]`, which runs
# CMD (killed after $STEP_TIMEOUT seconds, default 120) and prints
#   === STEP NAME stdout / ... / === STEP NAME stderr / ... / === STEP NAME rc=RC seconds=S
# with one newline added after each output so that the markers start a line.
#
# The script's output comes back on a second serial port, apart from the
# kernel's console, so kernel messages never mix into it. The last line
# printed is `NUMAPIN-VM-EXIT RC`.
#
# Exit status: the script's exit status; 77 when something needed is missing
# (the reason is printed; nothing was run); 124 when the time limit was hit;
# 125 when the guest never reported (kernel panic, bad initramfs, ...: the end
# of the kernel console is printed).
#
# Environment: NUMAPIN_VM_KERNEL (default: the newest readable /boot/vmlinuz-*),
# NUMAPIN_VM_BUSYBOX (default: busybox on PATH), NUMAPIN_VM_MODULES (the kernel's
# module folder, default /lib/modules/VERSION), NUMAPIN_VM_QEMU (default:
# qemu-system-x86_64), NUMAPIN_VM_ACCEL (default tcg; kvm is used only when
# asked for: nested KVM can hang after the firmware).
set -euo pipefail

SKIP=77
say() { echo "vm-harness: $*" >&2; }
skip() { say "skipped: $*"; exit "$SKIP"; }
die() { say "error: $*"; exit 2; }

nodes=4 cpus_per_node=1 node_mem=512 timeout_s=300 workdir="" check=0 script=""
accel_nodes=() nic_nodes=() bins=() files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --cpus-per-node) cpus_per_node=$2; shift 2 ;;
    --node-mem) node_mem=$2; shift 2 ;;
    --accel-node) accel_nodes+=("$2"); shift 2 ;;
    --nic-node) nic_nodes+=("$2"); shift 2 ;;
    --bin) bins+=("$2"); shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$script" ] || die "one SCRIPT only (got '$script' and '$1')"; script=$1; shift ;;
  esac
done

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
for v in nodes cpus_per_node node_mem timeout_s; do
  is_uint "${!v}" && [ "${!v}" -gt 0 ] || die "--${v//_/-} must be a positive whole number, got '${!v}'"
done
[ "$nodes" -le 64 ] || die "--nodes $nodes: at most 64"
[ $(( ${#accel_nodes[@]} + ${#nic_nodes[@]} )) -le 7 ] || die "at most 7 --accel-node and --nic-node together (one PCIe expander bridge of 32 buses each)"
for n in "${accel_nodes[@]}" "${nic_nodes[@]}"; do
  is_uint "$n" && [ "$n" -lt "$nodes" ] || die "--accel-node/--nic-node $n: the machine has nodes 0-$((nodes - 1))"
done

# --- what is needed, or a clear reason to skip -------------------------------
qemu=${NUMAPIN_VM_QEMU:-qemu-system-x86_64}
command -v "$qemu" >/dev/null || skip "$qemu not found (Debian: apt-get install qemu-system-x86)"
kernel=${NUMAPIN_VM_KERNEL:-}
if [ -z "$kernel" ]; then
  for k in $(printf '%s\n' /boot/vmlinuz-* | sort -V -r); do
    if [ -r "$k" ]; then kernel=$k; break; fi
  done
  [ -n "$kernel" ] || skip "no readable kernel /boot/vmlinuz-* (Debian: apt-get install linux-image-amd64; or set NUMAPIN_VM_KERNEL)"
fi
[ -r "$kernel" ] || skip "kernel $kernel is not readable (set NUMAPIN_VM_KERNEL to a readable bzImage)"
busybox=${NUMAPIN_VM_BUSYBOX:-$(command -v busybox || true)}
[ -n "$busybox" ] && [ -x "$busybox" ] || skip "busybox not found (Debian: apt-get install busybox-static; or set NUMAPIN_VM_BUSYBOX)"
for t in cpio ldd timeout; do
  command -v "$t" >/dev/null || skip "$t not found (Debian: apt-get install cpio libc-bin coreutils)"
done
accel=${NUMAPIN_VM_ACCEL:-tcg}
case "$accel" in
  tcg) accel_args=(-accel tcg -cpu max)
    # Nested KVM can hang after the firmware: it is only used when asked for.
    [ ! -e /dev/kvm ] || accel="tcg (/dev/kvm is here but unused; NUMAPIN_VM_ACCEL=kvm tries it)" ;;
  kvm) [ -w /dev/kvm ] || skip "NUMAPIN_VM_ACCEL=kvm but /dev/kvm is not usable"; accel_args=(-accel kvm -cpu host) ;;
  *) die "NUMAPIN_VM_ACCEL must be tcg or kvm, got '$accel'" ;;
esac
if [ "$check" = 1 ]; then
  say "ready: $qemu, kernel $kernel, busybox $busybox, accel $accel"
  exit 0
fi
[ -n "$script" ] || die "no SCRIPT given (see --help)"
[ -r "$script" ] || die "cannot read the guest script $script"

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
t_start=$(now)

if [ -n "$workdir" ]; then
  mkdir -p "$workdir"
  work=$(cd "$workdir" && pwd)
  rm -rf "$work/root" "$work/initramfs.cpio" "$work/console.log" "$work/output.log"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/numapin-vm.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
root=$work/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,root,etc,lib}

# --- initramfs --------------------------------------------------------------
# Copies FILE to the same path under the root (following links), once.
copy_path() {
  local src=$1
  [ -e "$root$src" ] && return 0
  mkdir -p "$root$(dirname "$src")"
  cp -L "$src" "$root$src"
}
# Copies the shared libraries and the dynamic loader that `ldd` lists for BIN.
copy_libs() {
  local bin=$1 out lib
  # A static executable makes ldd fail with "not a dynamic executable".
  out=$(ldd "$bin" 2>&1) || return 0
  while read -r lib; do
    [ -n "$lib" ] && copy_path "$lib"
  done < <(awk '/=> \// { print $3; next } /^[[:space:]]*\// { print $1 }' <<<"$out")
  if grep -q 'not found' <<<"$out"; then die "$bin needs libraries that are not here: $(grep 'not found' <<<"$out" | tr -s ' \t\n' ' ')"; fi
}

cp -L "$busybox" "$root/bin/busybox"
copy_libs "$busybox"
for spec in "${bins[@]}"; do
  src=${spec%%:*}
  name=$(basename "$src")
  [ "$spec" = "$src" ] || name=${spec#*:}
  [ -f "$src" ] && [ -x "$src" ] || die "--bin $src: not an executable file"
  # Debug information is not needed inside and only slows the boot; symbols stay.
  if command -v strip >/dev/null && strip --strip-debug -o "$root/bin/$name" "$src" 2>/dev/null; then :; else cp -L "$src" "$root/bin/$name"; fi
  chmod 755 "$root/bin/$name"
  copy_libs "$src"
done
for spec in "${files[@]}"; do
  src=${spec%%:*} dest=${spec#*:}
  [ "$spec" != "$src" ] && [ "${dest:0:1}" = / ] || die "--file $spec: give PATH:DEST with an absolute DEST"
  [ -e "$src" ] || die "--file $src: no such file or folder"
  mkdir -p "$root$(dirname "$dest")"
  cp -rL "$src" "$root$dest"
done

cat >"$root/lib/vm-steps.sh" <<'EOF'
# step NAME CMD [ARGS...]: run CMD, print its output and status between markers.
step() {
  _name=$1; shift
  _t0=$(cut -d' ' -f1 /proc/uptime)
  timeout "${STEP_TIMEOUT:-120}" "$@" >/tmp/step.out 2>/tmp/step.err </dev/null
  _rc=$?
  _t1=$(cut -d' ' -f1 /proc/uptime)
  echo "=== STEP $_name stdout"; cat /tmp/step.out; echo
  echo "=== STEP $_name stderr"; cat /tmp/step.err; echo
  echo "=== STEP $_name rc=$_rc seconds=$(awk -v a="$_t0" -v b="$_t1" 'BEGIN { printf "%.2f", b - a }')"
  return $_rc
}
EOF
cp "$script" "$root/test.sh"

# The NIC's driver, from the modules of the kernel that boots.
nic_driver="none"
if [ "${#nic_nodes[@]}" -gt 0 ]; then
  kname=$(basename "$kernel")
  moddir=${NUMAPIN_VM_MODULES:-/lib/modules/${kname#vmlinuz-}}
  ko=$moddir/kernel/drivers/net/ethernet/intel/e1000e/e1000e.ko
  if [ -r "$ko" ]; then
    mkdir -p "$root/lib/vm-modules"
    cp "$ko" "$root/lib/vm-modules/"
    nic_driver=$ko
  else
    say "no readable $ko (a compressed .ko.xz is not loaded either): the NIC(s) will have no driver and no interface name"
  fi
fi

cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root NUMAPIN_VM_GUEST=1
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
for m in /lib/vm-modules/*.ko; do [ -e "$m" ] && insmod "$m"; done
out=/dev/ttyS1
[ -c "$out" ] || out=/dev/console
stty -F "$out" raw -echo 2>/dev/null
{
  echo "NUMAPIN-VM-BEGIN uptime=$(cut -d' ' -f1 /proc/uptime)"
  sh -c '. /lib/vm-steps.sh; . /test.sh' 2>&1
  rc=$?
  echo "NUMAPIN-VM-EXIT $rc uptime=$(cut -d' ' -f1 /proc/uptime)"
} >"$out" 2>&1
sync
poweroff -f
EOF
chmod 755 "$root/init"

(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$work/initramfs.cpio"
rm -rf "$root"
t_built=$(now)
size_mib=$(($(stat -c %s "$work/initramfs.cpio") / 1048576))

# --- the machine --------------------------------------------------------------
machine=(-M q35 -smp $((nodes * cpus_per_node)) -m $((nodes * node_mem))M)
for ((n = 0; n < nodes; n++)); do
  first=$((n * cpus_per_node)) last=$((n * cpus_per_node + cpus_per_node - 1))
  cpus=$first; [ "$last" = "$first" ] || cpus=$first-$last
  machine+=(-object "memory-backend-ram,id=m$n,size=${node_mem}M" -numa "node,nodeid=$n,cpus=$cpus,memdev=m$n")
done
k=0
for n in "${accel_nodes[@]}"; do
  k=$((k + 1))
  machine+=(-device "pxb-pcie,id=pxb$k,bus_nr=$((32 * k)),numa_node=$n,bus=pcie.0"
    -device "pcie-root-port,id=rp$k,bus=pxb$k,chassis=$k"
    -device "pci-testdev,bus=rp$k")
done
for n in "${nic_nodes[@]}"; do
  k=$((k + 1))
  machine+=(-device "pxb-pcie,id=pxb$k,bus_nr=$((32 * k)),numa_node=$n,bus=pcie.0"
    -device "pcie-root-port,id=rp$k,bus=pxb$k,chassis=$k"
    -device "e1000e,bus=rp$k,mac=52:54:00:12:34:$(printf %02x "$k")")
done

say "booting $nodes node(s) x $cpus_per_node CPU(s) x ${node_mem} MiB, accelerators on node(s) ${accel_nodes[*]:-none}, NICs on node(s) ${nic_nodes[*]:-none} (driver: $nic_driver), $accel, kernel $(basename "$kernel"), initramfs $size_mib MiB (built in $(secs "$t_start" "$t_built") s)"
: >"$work/console.log"
: >"$work/output.log"
qemu_rc=0
timeout --kill-after=10 "$timeout_s" "$qemu" "${accel_args[@]}" "${machine[@]}" \
  -nodefaults -display none -no-reboot -monitor none \
  -serial "file:$work/console.log" -serial "file:$work/output.log" \
  -kernel "$kernel" -initrd "$work/initramfs.cpio" \
  -append "console=ttyS0 rdinit=/init panic=-1" \
  </dev/null >"$work/qemu.log" 2>&1 || qemu_rc=$?
t_end=$(now)

tr -d '\r' <"$work/output.log" | sed -n '/^NUMAPIN-VM-BEGIN/,/^NUMAPIN-VM-EXIT/{/^NUMAPIN-VM-BEGIN/d;p}'
exit_line=$(tr -d '\r' <"$work/output.log" | grep -a '^NUMAPIN-VM-EXIT ' | tail -n 1 || true)
begin_up=$(tr -d '\r' <"$work/output.log" | sed -n 's/^NUMAPIN-VM-BEGIN uptime=//p' | head -n 1)
exit_up=${exit_line##*uptime=}
run_s="?"
[ -z "$exit_line" ] || [ -z "$begin_up" ] || run_s=$(secs "$begin_up" "$exit_up")

if [ -n "$exit_line" ]; then
  rc=$(awk '{ print $2 }' <<<"$exit_line")
  say "guest exit $rc; boot+run+poweroff $(secs "$t_built" "$t_end") s (guest: boot ${begin_up:-?} s, script $run_s s); total $(secs "$t_start" "$t_end") s"
  exit "$rc"
fi
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
  say "error: the guest did not finish within ${timeout_s} s (--timeout); it was killed"
  rc=124
else
  say "error: the guest never reported an exit status (qemu exit $qemu_rc after $(secs "$t_built" "$t_end") s)"
  rc=125
fi
say "qemu said:"; tail -n 20 "$work/qemu.log" >&2
say "end of the kernel console:"; tr -d '\r' <"$work/console.log" | tail -n 40 >&2
exit "$rc"

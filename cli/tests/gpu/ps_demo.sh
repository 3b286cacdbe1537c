#!/bin/sh
# `numapin ps` on a GPU machine, by hand: torch processes bound right and
# bound wrong, the report, and the raw /proc evidence behind it (which
# device files each process has open and mapped, what numa_maps counts).
#
#   NUMAPIN=./numapin OUT=ps-demo sh cli/tests/gpu/ps_demo.sh
#
# Needs python3 with torch (CUDA) and the numapin binary (NUMAPIN, default
# `numapin` on PATH). Writes everything under OUT (default ./ps-demo-out),
# ends every process it started, and exits with `numapin ps`'s code.
#
# The processes (each holds 1 GiB of pinned host memory and 512 MiB of
# ordinary data, with a CUDA context on the GPU it works on):
#   right      LOCAL_RANK=0, started by `numapin exec` (bound near GPU 0)
#   wrong-gpu  LOCAL_RANK=1 (2+ GPUs) but working on GPU 0: no set_device
#   wrong-node LOCAL_RANK=0 bound by `numapin exec --node N` to another node
#              (machines with 2+ nodes only)
#   wrong-nic  LOCAL_RANK=0, bound right, UCX_NET_DEVICES=mlx5_99:1
#   unbound    LOCAL_RANK=0, started with no binding
set -u
NUMAPIN=${NUMAPIN:-numapin}
OUT=${OUT:-ps-demo-out}
mkdir -p "$OUT"
PIDS=

cleanup() {
    [ -n "$PIDS" ] && kill $PIDS 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT INT TERM

cat > "$OUT/worker.py" <<'PY'
import sys, time, torch
dev = int(sys.argv[1])
torch.cuda.set_device(dev)
pinned = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
data = torch.ones(512 << 20, dtype=torch.uint8)
gpu = pinned.to(f"cuda:{dev}", non_blocking=True)
torch.cuda.synchronize()
open(sys.argv[2], "w").close()
time.sleep(900)
PY

# start NAME ENV... -- CMD...: runs it in the background, waits until ready.
start() {
    name=$1; shift
    rm -f "$OUT/ready-$name"
    env "$@" "$OUT/ready-$name" > "$OUT/$name.log" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    i=0
    while [ ! -e "$OUT/ready-$name" ]; do
        if ! kill -0 $pid 2>/dev/null || [ $i -ge 600 ]; then
            echo "$name did not start:"; cat "$OUT/$name.log"; return 1
        fi
        sleep 0.2; i=$((i + 1))
    done
    echo "$name $pid" >> "$OUT/pids"
}

"$NUMAPIN" --version > "$OUT/version.txt" 2>&1
"$NUMAPIN" topo > "$OUT/topo.txt" 2>&1
"$NUMAPIN" topo --json > "$OUT/topo.json" 2>&1
nvidia-smi -L > "$OUT/nvidia-smi-L.txt" 2>&1
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
NODES=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
GPU0_NODE=$(python3 - "$OUT/topo.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
g = [g for g in t["gpus"] if g.get("cuda_ordinal") == 0]
print(g[0]["numa_node"] if g and g[0]["numa_node"] is not None else 0)
PY
)
OTHER_NODE=$(ls -d /sys/devices/system/node/node[0-9]* | sed 's/.*node//' | grep -vx "$GPU0_NODE" | head -1)
echo "GPUs $GPUS, nodes $NODES, GPU 0 on node $GPU0_NODE, another node: ${OTHER_NODE:-none}" | tee "$OUT/machine.txt"
: > "$OUT/pids"

W="python3 $OUT/worker.py 0"
start right LOCAL_RANK=0 "$NUMAPIN" exec -- $W
if [ "$GPUS" -ge 2 ]; then
    start wrong-gpu LOCAL_RANK=1 $W
fi
if [ -n "$OTHER_NODE" ]; then
    start wrong-node LOCAL_RANK=0 "$NUMAPIN" exec --node "$OTHER_NODE" -- $W
fi
start wrong-nic LOCAL_RANK=0 UCX_NET_DEVICES=mlx5_99:1 "$NUMAPIN" exec -- $W
start unbound LOCAL_RANK=0 $W

# The evidence numapin ps reads, per process.
while read -r name pid; do
    {
        echo "== $name (pid $pid)"
        echo "-- descriptors on the NVIDIA driver's files"
        ls -l /proc/$pid/fd 2>&1 | grep nvidia | awk '{print $NF}' | sort | uniq -c
        echo "-- mapped device files (mappings per file)"
        awk '$6 ~ /nvidia/ {print $6}' /proc/$pid/maps | sort | uniq -c
        echo "-- numa_maps lines of device files, and the anonymous total per node"
        grep nvidia /proc/$pid/numa_maps | head -5
        grep -v 'file=' /proc/$pid/numa_maps | tr ' ' '\n' | grep '^N[0-9]*=' \
            | awk -F= '{p[$1]+=$2} END {for (n in p) print n, p[n], "pages"}'
        grep -E 'Cpus_allowed_list|Mems_allowed_list|VmRSS|VmLck|VmPin' /proc/$pid/status
    } >> "$OUT/evidence.txt" 2>&1
done < "$OUT/pids"
grep -E 'Device Minor|Bus Location' /proc/driver/nvidia/gpus/*/information > "$OUT/driver-minors.txt" 2>&1
nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv > "$OUT/nvidia-smi-apps.csv" 2>&1

"$NUMAPIN" ps > "$OUT/ps.txt" 2>&1
rc=$?
"$NUMAPIN" ps --json > "$OUT/ps.json" 2>&1
"$NUMAPIN" ps --pid "$(awk '{print $2}' "$OUT/pids" | paste -sd, -)" > "$OUT/ps-pids.txt" 2>&1
python3 - "$NUMAPIN" > "$OUT/timing.txt" <<'PY'
import subprocess, sys, time
t = []
for _ in range(3):
    s = time.perf_counter()
    subprocess.run([sys.argv[1], "ps"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t.append(time.perf_counter() - s)
print("numapin ps, whole command, 3 runs (s):", " ".join(f"{x:.3f}" for x in t))
PY
echo "numapin ps exit code: $rc" | tee -a "$OUT/timing.txt"
cat "$OUT/ps.txt"
exit $rc

#!/bin/sh
# `numapin ps` against a real torchrun job (2 to 4 GPUs; written for 4):
#
#   sh cli/tests/gpu/ps_job.sh ./numapin [OUT]
#
#   torchrun --standalone --nproc-per-node N --no-python numapin exec -- python3 rank.py
#
# with, in every rank, NCCL (an all-reduce), 256 MiB on its GPU and a
# DataLoader with 2 workers (forked after CUDA started: they hold their
# rank's device files and no context):
#   rank 0 and 1      right: set_device(LOCAL_RANK), bound by numapin exec
#   rank 2 (2 % N)    also makes a context on the next GPU, on purpose
#   rank N-1          moved onto another GPU's CPUs (os.sched_setaffinity,
#                     before torch starts): another node's CPUs where GPUs sit
#                     on two nodes, else another GPU's share of the node
#                     (`numapin affinity --mode exclusive`): on a machine of
#                     one NUMA node no CPU is off its GPU's node, so ps
#                     cannot call it wrong there
# While the job runs: `numapin ps`, `numapin ps --json`, `numapin ps
# --no-nvml`, `nvidia-smi --query-compute-apps`, the raw device-file
# evidence, and the time `numapin ps` takes per process it lists. Needs
# python3 with torch (CUDA), nvidia-smi, and the numapin binary (argument 1;
# no cargo needed). Writes 8 files to OUT (default /tmp/ps-out), prints a
# summary, ends every process it started; about a minute, 4 at most.
set -u
NUMAPIN=$(readlink -f "${1:?usage: ps_job.sh NUMAPIN [OUT]}")
OUT=${2:-/tmp/ps-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/ps-job.XXXXXX)
JOB=

cleanup() {
    : > "$WORK/stop"
    if [ -n "$JOB" ]; then
        i=0
        while kill -0 "$JOB" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
        kill -TERM -- "-$JOB" 2>/dev/null || kill "$JOB" 2>/dev/null
        wait "$JOB" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

N=$(python3 -c 'import torch; print(min(4, torch.cuda.device_count()))')
if [ "$N" -lt 2 ]; then
    echo "ps_job.sh: needs 2 or more GPUs (found $N)"
    exit 2
fi
STRAY=$((2 % N))
WRONG=$((N - 1))
# The CPUs rank WRONG is moved onto: another node's GPU's, else another
# GPU's exclusive share of the same node.
WRONG_CPUS=$("$NUMAPIN" affinity --format json > "$WORK/node.json" &&
    "$NUMAPIN" affinity --mode exclusive --format json > "$WORK/excl.json" &&
    python3 - "$WORK/node.json" "$WORK/excl.json" "$WRONG" <<'PY'
import json, sys
node, excl, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
mine = node["ranks"][r]
other = [x for x in node["ranks"] if x["mems"] != mine["mems"]]
print(other[0]["cpus"] if other else excl["ranks"][(r + 1) % len(excl["ranks"])]["cpus"])
PY
)
if [ -z "$WRONG_CPUS" ]; then
    echo "numapin affinity gave no CPUs: no rank is moved"
    WRONG=-1
    WRONG_CPUS=none
fi
NODES=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)

cat > "$WORK/rank.py" <<'PY'
import os, sys, time

work, stray, wrong, wrong_cpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lr = int(os.environ["LOCAL_RANK"])
if lr == wrong:
    cpus = set()
    for part in wrong_cpus.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    os.sched_setaffinity(0, cpus)  # before torch starts any thread

import torch
import torch.distributed as dist

torch.cuda.set_device(lr)
dist.init_process_group("nccl", device_id=torch.device(f"cuda:{lr}"))
x = torch.ones(64 << 20, device=f"cuda:{lr}")  # 256 MiB
dist.all_reduce(x)
torch.cuda.synchronize()
if lr == stray:
    other = (lr + 1) % torch.cuda.device_count()
    extra = torch.empty(16 << 20, device=f"cuda:{other}")  # a context there, on purpose


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.full((1024,), float(i))


loader = torch.utils.data.DataLoader(Numbers(), batch_size=64, num_workers=2, persistent_workers=True)
batches = iter(loader)
next(batches)
with open(f"{work}/ready-{lr}", "w") as f:
    f.write(str(os.getpid()))
while not os.path.exists(f"{work}/stop"):
    time.sleep(0.2)
dist.destroy_process_group()
PY

echo "GPUs used $N, NUMA nodes $NODES; rank $STRAY makes a second context; rank $WRONG moved onto CPUs $WRONG_CPUS" | tee "$OUT/job.log"
# Its own process group, so that cleanup ends every rank and worker.
setsid timeout 240 python3 -m torch.distributed.run --standalone --nproc-per-node "$N" \
    --no-python "$NUMAPIN" exec -- python3 "$WORK/rank.py" "$WORK" "$STRAY" "$WRONG" "$WRONG_CPUS" \
    >> "$OUT/job.log" 2>&1 &
JOB=$!
i=0
while [ "$(ls "$WORK"/ready-* 2>/dev/null | wc -l)" -lt "$N" ]; do
    if ! kill -0 "$JOB" 2>/dev/null || [ $i -ge 900 ]; then
        echo "the job did not start:"; tail -40 "$OUT/job.log"; exit 1
    fi
    sleep 0.2; i=$((i + 1))
done
sleep 2  # the DataLoader workers' first batches

nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv > "$OUT/nvidia-smi.csv" 2>&1
"$NUMAPIN" ps > "$OUT/ps.txt" 2>&1
echo "exit code $?" >> "$OUT/ps.txt"
"$NUMAPIN" ps --json > "$OUT/ps.json" 2>&1
"$NUMAPIN" ps --no-nvml > "$OUT/ps-no-nvml.txt" 2>&1
echo "exit code $?" >> "$OUT/ps-no-nvml.txt"

# The raw evidence, per rank: device files open and mapped.
for r in $(seq 0 $((N - 1))); do
    pid=$(cat "$WORK/ready-$r")
    {
        echo "== rank $r (pid $pid)"
        grep -E 'NSpid|Cpus_allowed_list' /proc/$pid/status
        echo "-- descriptors per NVIDIA file"
        ls -l /proc/$pid/fd 2>/dev/null | grep nvidia | awk '{print $NF}' | sort | uniq -c
        echo "-- mappings per device file"
        awk '$6 ~ /nvidia/ {print $6}' /proc/$pid/maps | sort | uniq -c
        echo "-- its DataLoader workers (children with the NVIDIA files open)"
        for c in $(cat /proc/$pid/task/*/children 2>/dev/null); do
            printf '%s: %s nvidia descriptors\n' "$c" "$(ls -l /proc/$c/fd 2>/dev/null | grep -c nvidia)"
        done
    } >> "$OUT/evidence.txt" 2>&1
done
grep -E 'Device Minor|Bus Location' /proc/driver/nvidia/gpus/*/information >> "$OUT/evidence.txt" 2>&1

python3 - "$NUMAPIN" "$WORK" "$N" > "$OUT/timing.txt" <<'PY'
import json, subprocess, sys, time
numapin, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ranks = ",".join(open(f"{work}/ready-{r}").read() for r in range(n))
def timed(args, reps=5):
    t, listed = [], 0
    for _ in range(reps):
        s = time.perf_counter()
        o = subprocess.run([numapin, "ps", "--json", *args], capture_output=True, text=True)
        t.append(time.perf_counter() - s)
        listed = len(json.loads(o.stdout)["processes"])
    best = min(t)
    return f"{' '.join(args) or '(scan)':<22} {listed:3d} processes; whole command {best * 1e3:7.1f} ms best of {reps} " \
           f"({' '.join(f'{x * 1e3:.0f}' for x in t)} ms); {best / max(listed, 1) * 1e3:.1f} ms per process"
for args in ([], ["--no-nvml"], ["--pid", ranks], ["--pid", ranks, "--no-nvml"]):
    print(timed(args))
PY

python3 - "$OUT/ps.json" "$WORK" "$N" > "$OUT/summary.txt" <<'PY'
import json, sys
r, work, n = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
ranks = {int(open(f"{work}/ready-{i}").read()): i for i in range(n)}
d = r["nvml"]
l = d["lists"]
print("nvml:", "answered" if l else d["unavailable"], "| driver", l and l["driver_version"],
      "| host pids", d["host_pids"], f"| {d['elapsed_s']:.3f} s", "| notes", l and l["notes"])
for p in r["processes"]:
    env = dict((p["environment"] or {}).get("launcher", []))
    who = f"rank {ranks[p['pid']]}" if p["pid"] in ranks else f"LOCAL_RANK={env.get('LOCAL_RANK', '?')} (worker)"
    a = p["attribution"]
    ctx = ", ".join(f"{c['gpu']}:{(c['used_bytes'] or 0) >> 20}MiB" for c in a["contexts"])
    v = {c["name"]: c for c in p["checks"]}
    print(f"pid {p['pid']:>7} {who:<28} source={a['source']:<12} contexts=[{ctx}] "
          f"cpus_allowed={p['allowed_cpus']} " + " ".join(f"{k}={c['verdict']}" for k, c in v.items()))
    print(f"        gpu: {v['gpu']['evidence'][:300]}")
    if v.get("cpus") and v["cpus"]["verdict"] != "ok":
        print(f"        cpus: {v['cpus']['evidence'][:200]}")
print("summary:", r["summary"])
PY

echo "== summary (ps --json)"; cat "$OUT/summary.txt"
echo "== nvidia-smi --query-compute-apps"; cat "$OUT/nvidia-smi.csv"
echo "== numapin ps time"; cat "$OUT/timing.txt"
echo "== numapin ps (head)"; head -c 6000 "$OUT/ps.txt"

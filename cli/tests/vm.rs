//! Multi-node behaviour on a real Linux kernel, in an emulated 4-node machine
//! (QEMU software emulation; see docs/vm-tests.md and tests/vm/harness.sh).
//!
//! The machine boots once; every group adds `step` lines to its script and
//! asserts on them in its own `#[test]`. Checks that must run inside as Rust
//! code are the `guest::` tests of this same binary, shipped as
//! `/bin/vm-tests` and run there with `--ignored --exact NAME`.
//!
//! Skips with a message when QEMU, a kernel or busybox is missing (set
//! `NUMAPIN_VM_REQUIRED=1` to make that a failure).
// Test data: counts, sizes, indices and byte patterns far inside every type's range.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "vm/support.rs"]
mod support;

use std::sync::OnceLock;

use numapin::topology::{DeviceKind, Relation, Topology, WarningKind};
use numapin::CpuList;
use support::{Boot, Machine, Outcome, E1000E_PCI_ID, TESTDEV_PCI_ID};

/// The steps run on the 4-node machine, one group per block. A new group adds
/// its lines here and a `#[test]` below that asserts on them.
fn four_node_script() -> String {
    let acc = TESTDEV_PCI_ID;
    [
        // topology
        format!("step topo-json numapin topo --json --no-cuda --accelerator-pci-id {acc}"),
        "step topo-no-accel numapin topo --json --no-cuda".into(),
        "step topo-vendor-only numapin topo --json --no-cuda --accelerator-pci-id 1b36".into(),
        format!("step topo-restricted taskset -c 0,1 numapin topo --json --no-cuda --accelerator-pci-id {acc}"),
        format!("step topo-text numapin topo --accelerator-pci-id {acc}"),
        // the kernel itself: memory policy and thread placement (Rust checks inside)
        guest_step("guest-mbind", "guest::mbind_puts_every_page_on_the_chosen_node"),
        guest_step("guest-first-touch", "guest::first_touch_follows_the_thread"),
        guest_step("guest-affinity", "guest::setaffinity_moves_the_thread_to_node_2"),
        // numapin's arenas: a region on every node, pages checked by the kernel
        guest_step("guest-arena", "guest::arena_regions_land_on_every_node"),
        // ... and under a seccomp filter refusing the NUMA calls (Docker's
        // default profile): first touch on nodes 2 and 3, numa_maps checks
        guest_step("guest-filtered-arena", "guest::arena_under_a_seccomp_filter"),
        // hugetlb pages: a pool on node 2 only; regions follow each node's
        // pool, and a node without pages is an error, never SIGBUS
        guest_step("guest-hugetlb", "guest::hugetlb_regions_follow_each_nodes_pool"),
        format!("step doctor-hugetlb sh -c 'echo 8 > {POOL2}; numapin doctor --json --no-cuda --no-pin-probe --accelerator-pci-id {acc}; rc=$?; echo 0 > {POOL2}; exit $rc'"),
        // numapin exec for the accelerator on node 3 (CUDA order = PCI order
        // without a driver: ordinal 1), and for local rank 0 (node 2)
        format!("step exec-gpu1 numapin exec --no-cuda --accelerator-pci-id {acc} --gpu 1 -- sh -c 'grep Cpus_allowed_list /proc/self/status; grep -c bind:3 /proc/self/numa_maps'"),
        format!("step exec-rank0 env LOCAL_RANK=0 numapin exec --no-cuda --accelerator-pci-id {acc} -- sh -c 'grep Cpus_allowed_list /proc/self/status; grep -c bind:2 /proc/self/numa_maps'"),
        // numapin doctor: as is, and bound to node 0 (away from both accelerators)
        format!("step doctor-json numapin doctor --json --no-cuda --accelerator-pci-id {acc}"),
        format!("step doctor-bound numapin exec --no-cuda --node 0 -- numapin doctor --json --no-cuda --accelerator-pci-id {acc}"),
        format!("step doctor-text numapin doctor --no-cuda --no-pin-probe --accelerator-pci-id {acc}"),
        // NICs: each rank's is the one on its accelerator's node
        "step net-interfaces ls /sys/class/net".into(),
        format!("step affinity-nics numapin affinity --no-cuda --accelerator-pci-id {acc} --format json"),
        format!("step exec-nic-gpu1 numapin exec --no-cuda --accelerator-pci-id {acc} --gpu 1 --nic-env ucx -- sh -c 'echo \"$UCX_NET_DEVICES\"'"),
        format!("step exec-nic-rank0 env LOCAL_RANK=0 UCX_NET_DEVICES=all numapin exec --no-cuda --accelerator-pci-id {acc} --nic-env ucx -- sh -c 'echo \"$UCX_NET_DEVICES\"'"),
        format!("step exec-nic-nccl numapin exec --no-cuda --accelerator-pci-id {acc} --gpu 1 --nic-env nccl -- true"),
        // loaders (host mode for the stand-in accelerator)
        guest_step("guest-loader", "guest::loader_for_the_node_2_accelerator_stays_on_node_2"),
        // the machine budget: two processes on nodes 2 and 3, each taking
        // its node's whole budget, a third refused
        guest_step("guest-machine-budget", "guest::machine_budget_is_per_node"),
    ]
    .join("\n")
        + "\n"
        + &ps_script()
}

/// `numapin ps`: processes that have an accelerator's sysfs `config` open
/// (the documented way a process names the device it uses, see
/// docs/ps.md), started with different bindings, and two ranks named by
/// their launcher variables alone. Each writes `/tmp/ps-ready-NAME` once
/// set up and its pid to `/tmp/ps-pid-NAME`; `ps-pids` lists them.
fn ps_script() -> String {
    let acc = TESTDEV_PCI_ID;
    let ps = format!("numapin ps --no-cuda --accelerator-pci-id {acc}");
    [
        // ACC2, ACC3: the config files of the accelerators on nodes 2 and 3;
        // FAR: the NIC interface on node 2 (for a rank of node 3).
        "for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/vendor):$(cat $d/device)\" = 0x1b36:0x0005 ] && export ACC$(cat $d/numa_node)=$d/config; done".to_string(),
        "FAR=; for i in /sys/class/net/*; do [ \"$(cat $i/device/numa_node 2>/dev/null)\" = 2 ] && FAR=${i##*/}; done".into(),
        "psbg() { name=$1; shift; \"$@\" & echo $! > /tmp/ps-pid-$name; }".into(),
        // GPU 0 (node 2), bound there by numapin exec.
        format!("psbg right numapin exec --no-cuda --accelerator-pci-id {acc} --gpu 0 -- sh -c 'exec 3<$ACC2; : > /tmp/ps-ready-right; exec sleep 600'"),
        // GPU 0 (node 2), bound to node 0.
        "psbg wrong numapin exec --no-cuda --node 0 -- sh -c 'exec 3<$ACC2; : > /tmp/ps-ready-wrong; exec sleep 600'".into(),
        // GPU 1 (node 3), not bound.
        "psbg unbound sh -c 'exec 3<$ACC3; : > /tmp/ps-ready-unbound; exec sleep 600'".into(),
        // GPU 0 (node 2): 32 MiB first touched on node 0's CPU, then moved
        // to node 2's CPU; its sleeping child does not hold the device.
        "psbg memory taskset -c 0 sh -c 'exec 3<$ACC2; x=$(head -c 33554432 /dev/zero | tr \"\\0\" a); taskset -p 4 $$ >/dev/null; : > /tmp/ps-ready-memory; while :; do sleep 600 3<&-; done'".into(),
        // Local rank 1 (GPU 1, node 3) by its variables: on node 3, and on
        // node 0 told to use node 2's NIC.
        "psbg rank-right env LOCAL_RANK=1 taskset -c 3 sh -c ': > /tmp/ps-ready-rank-right; exec sleep 600'".into(),
        "psbg rank-wrong env LOCAL_RANK=1 UCX_NET_DEVICES=${FAR:-eth0} taskset -c 0 sh -c ': > /tmp/ps-ready-rank-wrong; exec sleep 600'".into(),
        "for i in $(seq 600); do [ $(ls /tmp/ps-ready-* 2>/dev/null | wc -l) = 6 ] && break; sleep 0.1; done".into(),
        "step ps-pids sh -c 'for f in /tmp/ps-pid-*; do echo ${f#/tmp/ps-pid-} $(cat $f); done; ls /tmp/ps-ready-*'".into(),
        format!("step ps-scan {ps} --json"),
        format!("step ps-text {ps}"),
        format!("step ps-ranks sh -c '{ps} --json --pid $(cat /tmp/ps-pid-rank-right),$(cat /tmp/ps-pid-rank-wrong)'"),
        format!("step ps-missing {ps} --pid 4194304"),
        "kill $(cat /tmp/ps-pid-*) 2>/dev/null".into(),
    ]
    .join("\n")
        + "\n"
}

/// Node 2's pool of 2 MiB hugetlb pages, inside the guest.
const POOL2: &str = "/sys/devices/system/node/node2/hugepages/hugepages-2048kB/nr_hugepages";

/// A step that runs one in-guest check of this binary (see [`Boot::guest_test_passed`]).
fn guest_step(step: &str, test: &str) -> String {
    format!("step {step} vm-tests --ignored --exact --nocapture {test}")
}

/// The 4-node machine (one CPU per node: node N has CPU N), stand-in
/// accelerators on nodes 2 and 3, an Ethernet NIC on each of nodes 2 and 3,
/// booted once for every test in this file.
fn four_nodes() -> Option<&'static Boot> {
    static BOOT: OnceLock<Outcome> = OnceLock::new();
    BOOT.get_or_init(|| {
        Machine::new("four-nodes", 4)
            .accelerator_on(2)
            .accelerator_on(3)
            .nic_on(2)
            .nic_on(3)
            .boot(&four_node_script())
    })
    .get()
}

fn topology(boot: &Boot, step: &str) -> Topology {
    let s = boot.ok(step);
    serde_json::from_str(&s.stdout)
        .unwrap_or_else(|e| panic!("step {step}: not topology JSON ({e}):\n{}", s.stdout))
}

fn cpus(s: &str) -> CpuList {
    CpuList::parse(s).unwrap()
}

#[test]
fn topo_reports_four_nodes_and_the_accelerators_on_nodes_2_and_3() {
    let Some(boot) = four_nodes() else { return };
    let t = topology(boot, "topo-json");
    assert_eq!(t.source, "live");
    assert_eq!(
        t.numa_nodes.iter().map(|n| n.os_index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    for n in &t.numa_nodes {
        let i = n.os_index;
        assert_eq!(n.cpus, cpus(&i.to_string()), "node {i} CPUs");
        // 512 MiB each, less what the kernel keeps for itself.
        assert!(
            n.memory_bytes > 384 << 20 && n.memory_bytes <= 512 << 20,
            "node {i} memory {}",
            n.memory_bytes
        );
        let expect: Vec<u32> = (0..4).map(|j| if j == i { 10 } else { 20 }).collect();
        assert_eq!(n.distances, expect, "node {i} distances");
    }
    assert_eq!(t.allowed.cpus, cpus("0-3"));
    assert_eq!(t.allowed.numa_nodes, [0, 1, 2, 3]);
    let found: Vec<_> = t
        .gpus
        .iter()
        .map(|g| {
            (
                g.index.get(),
                g.numa_node,
                g.local_cpus.to_string(),
                g.vendor_id.as_str(),
                g.device_id.as_str(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (0, Some(2), "2".to_string(), "0x1b36", "0x0005"),
            (1, Some(3), "3".to_string(), "0x1b36", "0x0005")
        ],
        "accelerators (index, node, local CPUs, vendor, device)"
    );
    // In PCI order, one behind each expander bridge, CUDA ordinals by PCI order.
    assert!(t.gpus[0].pci_bus_id < t.gpus[1].pci_bus_id);
    assert_eq!(
        t.gpus.iter().map(|g| g.cuda_ordinal).collect::<Vec<_>>(),
        [Some(numapin::CudaOrdinal(0)), Some(numapin::CudaOrdinal(1))]
    );
    assert!(
        t.warnings.is_empty(),
        "no warnings on a fully allowed machine: {:?}",
        t.warnings
    );
    // The human report says the same.
    let text = &boot.ok("topo-text").stdout;
    assert!(
        text.contains("4 NUMA node(s), 2 GPU(s); this process may use CPUs 0-3 and nodes 0,1,2,3"),
        "{text}"
    );
}

#[test]
fn topo_counts_test_devices_only_when_asked() {
    let Some(boot) = four_nodes() else { return };
    assert!(
        topology(boot, "topo-no-accel").gpus.is_empty(),
        "pci-testdev is no GPU without --accelerator-pci-id"
    );
    // A vendor-only id matches the two test devices, not the vendor's PCIe
    // root ports and bridges (1b36:000c, 1b36:000b) that carry them.
    let by_vendor = topology(boot, "topo-vendor-only");
    let exact = topology(boot, "topo-json");
    assert_eq!(by_vendor.gpus, exact.gpus);
}

#[test]
fn topo_warns_when_the_cpuset_excludes_the_accelerators() {
    let Some(boot) = four_nodes() else { return };
    let t = topology(boot, "topo-restricted");
    assert_eq!(t.allowed.cpus, cpus("0-1"));
    let excluded: Vec<_> = t
        .warnings
        .iter()
        .filter(|w| w.kind == WarningKind::GpuCpusExcluded)
        .map(|w| w.gpu.map(numapin::GpuIndex::get))
        .collect();
    assert_eq!(excluded, [Some(0), Some(1)], "{:?}", t.warnings);
}

#[test]
fn kernel_places_memory_and_threads_where_asked() {
    let Some(boot) = four_nodes() else { return };
    boot.guest_test_passed(
        "guest-mbind",
        "guest::mbind_puts_every_page_on_the_chosen_node",
    );
    boot.guest_test_passed("guest-first-touch", "guest::first_touch_follows_the_thread");
    boot.guest_test_passed(
        "guest-affinity",
        "guest::setaffinity_moves_the_thread_to_node_2",
    );
}

/// The checks of a `numapin doctor --json` step, after checking that its
/// exit code is 1 exactly when a check fails.
fn doctor_checks(boot: &Boot, step: &str) -> Vec<serde_json::Value> {
    let s = boot.step(step);
    let v: serde_json::Value = serde_json::from_str(&s.stdout).unwrap_or_else(|e| {
        panic!(
            "step {step}: not doctor JSON ({e}):\n{}\n{}",
            s.stdout, s.stderr
        )
    });
    let checks = v["checks"].as_array().expect("checks").clone();
    let fails = checks.iter().any(|c| c["verdict"] == "fail");
    assert_eq!(
        s.rc,
        i32::from(fails),
        "step {step}: exit code\n{}",
        s.stdout
    );
    checks
}

fn verdicts_of(checks: &[serde_json::Value], name: &str) -> Vec<(Option<u64>, String)> {
    checks
        .iter()
        .filter(|c| c["name"] == name)
        .map(|c| {
            let who = c["gpu"].as_u64().or(c["node"].as_u64());
            (who, c["verdict"].as_str().unwrap().to_string())
        })
        .collect()
}

fn ok_for(ids: &[u64]) -> Vec<(Option<u64>, String)> {
    ids.iter().map(|&i| (Some(i), "ok".to_string())).collect()
}

#[test]
fn doctor_pin_probe_passes_on_every_node() {
    let Some(boot) = four_nodes() else { return };
    let checks = doctor_checks(boot, "doctor-json");
    assert_eq!(
        verdicts_of(&checks, "pin_probe"),
        ok_for(&[0, 1, 2, 3]),
        "{checks:#?}"
    );
    for c in checks.iter().filter(|c| c["name"] == "pin_probe") {
        let n = c["node"].as_u64().unwrap();
        let ev = c["evidence"].as_str().unwrap();
        assert!(ev.contains(&format!("all 512 pages on node {n}")), "{ev}");
    }
    // The accelerators are where the topology says, and this process may
    // use their CPUs and nodes.
    for name in ["gpu_locality", "gpu_cpus_allowed", "gpu_memory_allowed"] {
        assert_eq!(
            verdicts_of(&checks, name),
            ok_for(&[0, 1]),
            "{name}: {checks:#?}"
        );
    }
    let loc: Vec<&str> = checks
        .iter()
        .filter(|c| c["name"] == "gpu_locality")
        .map(|c| c["evidence"].as_str().unwrap())
        .collect();
    assert!(
        loc[0].contains("on NUMA node 2") && loc[1].contains("on NUMA node 3"),
        "{loc:?}"
    );
    for name in ["memlock", "memory_policy", "cuda_driver"] {
        assert_eq!(
            verdicts_of(&checks, name),
            [(None, "ok".to_string())],
            "{name}: {checks:#?}"
        );
    }
    for name in ["transparent_hugepages", "numa_balancing", "iommu"] {
        assert_eq!(verdicts_of(&checks, name).len(), 1, "{name}");
    }
}

#[test]
fn doctor_flags_a_process_bound_away_from_its_accelerators() {
    let Some(boot) = four_nodes() else { return };
    let checks = doctor_checks(boot, "doctor-bound");
    let policy = checks
        .iter()
        .find(|c| c["name"] == "memory_policy")
        .unwrap();
    assert_eq!(policy["verdict"], "fail", "{policy}");
    let ev = policy["evidence"].as_str().unwrap();
    assert!(
        ev.contains("memory policy bind over node 0; the GPUs this process sees are on nodes 2-3"),
        "{ev}"
    );
    let fail = |i: u64| (Some(i), "fail".to_string());
    assert_eq!(verdicts_of(&checks, "gpu_cpus_allowed"), [fail(0), fail(1)]);
    // The arena binds each region itself (mbind), so the process's own
    // policy does not stop pinning on every node.
    assert_eq!(
        verdicts_of(&checks, "pin_probe"),
        ok_for(&[0, 1, 2, 3]),
        "{checks:#?}"
    );
}

#[test]
fn doctor_text_report_lists_every_check() {
    let Some(boot) = four_nodes() else { return };
    let s = boot.step("doctor-text");
    let out = &s.stdout;
    assert!(out.starts_with("numapin doctor: this machine"), "{out}");
    assert!(out.contains("ok    gpu_locality (GPU 1)"), "{out}");
    assert!(out.contains("not run: pin_probe (--no-pin-probe)"), "{out}");
}

/// The machine budget is kept per node across processes (checked inside).
#[test]
fn machine_budget_is_per_node() {
    let Some(boot) = four_nodes() else { return };
    boot.guest_test_passed("guest-machine-budget", "guest::machine_budget_is_per_node");
}

#[test]
fn arena_regions_land_on_every_node() {
    let Some(boot) = four_nodes() else { return };
    boot.guest_test_passed("guest-arena", "guest::arena_regions_land_on_every_node");
}

#[test]
fn arena_regions_under_a_seccomp_filter_are_placed_by_first_touch() {
    let Some(boot) = four_nodes() else { return };
    boot.guest_test_passed(
        "guest-filtered-arena",
        "guest::arena_under_a_seccomp_filter",
    );
}

/// hugetlb regions follow each node's pool (checked inside), and the
/// doctor shows the pools per node and which GPU nodes lack pages.
#[test]
fn hugetlb_pools_are_per_node() {
    let Some(boot) = four_nodes() else { return };
    boot.guest_test_passed(
        "guest-hugetlb",
        "guest::hugetlb_regions_follow_each_nodes_pool",
    );
    let s = boot.ok("doctor-hugetlb");
    let v: serde_json::Value =
        serde_json::from_str(&s.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", s.stdout));
    let pools = v["huge_pages"]["pools"].as_array().unwrap();
    for node in 0..4u64 {
        let row = pools
            .iter()
            .find(|r| r["node"] == node && r["page_bytes"] == 2u64 << 20)
            .unwrap_or_else(|| panic!("node {node}: no 2 MiB row in {pools:?}"));
        let want = if node == 2 { 8 } else { 0 };
        assert_eq!(
            (&row["total"], &row["free"], &row["surplus"]),
            (&want.into(), &want.into(), &0.into()),
            "node {node}: {row}"
        );
    }
    let c = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "huge_pages")
        .unwrap();
    assert_eq!(c["verdict"], "warn", "{c}");
    let ev = c["evidence"].as_str().unwrap();
    assert!(
        ev.contains("node 2: 2 MiB 8 free of 8")
            && ev.contains("node 2, node 3 have fewer than 128 free 2 MiB pages"),
        "{ev}"
    );
    let fix = c["fix"].as_str().unwrap();
    for node in [2, 3] {
        let want = format!(
            "`echo 128 > /sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages`"
        );
        assert!(fix.contains(&want), "{fix}");
    }
}

#[test]
fn exec_binds_cpus_and_memory_to_the_accelerators_node() {
    let Some(boot) = four_nodes() else { return };
    let t = topology(boot, "topo-json");
    for (step, ordinal, node) in [("exec-gpu1", 1, 3u32), ("exec-rank0", 0, 2)] {
        let g = t
            .gpu_by_ordinal(numapin::CudaOrdinal(ordinal))
            .expect("ordinal");
        assert_eq!(
            g.numa_node,
            Some(node),
            "CUDA device {ordinal} (PCI order) is the accelerator on node {node}"
        );
        let s = boot.ok(step);
        let mut lines = s.stdout.lines();
        let allowed = lines.next().unwrap_or_default();
        assert_eq!(
            allowed.split_whitespace().last().map(cpus),
            Some(t.node(node).unwrap().cpus.clone()),
            "step {step}: {}",
            s.stdout
        );
        let bound: u32 = lines.next().unwrap_or("0").trim().parse().unwrap_or(0);
        assert!(
            bound > 0,
            "step {step}: no mapping with policy bind:{node} in numa_maps:\n{}",
            s.stdout
        );
    }
}

#[test]
fn loader_workers_and_slots_stay_on_the_accelerators_node() {
    let Some(boot) = four_nodes() else { return };
    boot.guest_test_passed(
        "guest-loader",
        "guest::loader_for_the_node_2_accelerator_stays_on_node_2",
    );
}

/// The pid of each `numapin ps` test process, by name (step `ps-pids`).
fn ps_pids(boot: &Boot) -> std::collections::BTreeMap<String, u64> {
    let s = boot.ok("ps-pids");
    let pids: std::collections::BTreeMap<String, u64> = s
        .stdout
        .lines()
        .filter_map(|l| {
            let (name, pid) = l.split_once(' ')?;
            Some((name.to_string(), pid.trim().parse().ok()?))
        })
        .collect();
    assert_eq!(pids.len(), 6, "{}", s.stdout);
    assert_eq!(
        s.stdout.matches("/tmp/ps-ready-").count(),
        6,
        "not all ready:\n{}",
        s.stdout
    );
    pids
}

/// A `numapin ps --json` step: its report, after checking that the exit
/// code is 1 exactly when a verdict fails.
fn ps_report(boot: &Boot, step: &str) -> serde_json::Value {
    let s = boot.step(step);
    let v: serde_json::Value = serde_json::from_str(&s.stdout)
        .unwrap_or_else(|e| panic!("step {step}: not JSON ({e}):\n{}\n{}", s.stdout, s.stderr));
    let fails = v["summary"]["fail"].as_u64().unwrap();
    assert_eq!(
        s.rc,
        i32::from(fails > 0),
        "step {step}: exit code\n{}",
        s.stdout
    );
    v
}

/// The process `pid` of a report, and its `(check, verdict)` pairs.
fn ps_process(v: &serde_json::Value, pid: u64) -> (serde_json::Value, Vec<(String, String)>) {
    let p = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not listed: {v:#}"))
        .clone();
    let checks = p["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (p, checks)
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// The scan finds exactly the four processes with an accelerator open and
/// judges each: bound right (ok), bound to node 0 (threads and memory
/// policy fail), not bound (warn, or fail if its thread ran off node 3),
/// threads right but 32 MiB on node 0 (memory fails).
#[test]
fn ps_judges_processes_bound_right_and_wrong() {
    let Some(boot) = four_nodes() else { return };
    let pids = ps_pids(boot);
    let v = ps_report(boot, "ps-scan");
    let listed: Vec<u64> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    let mut want: Vec<u64> = ["right", "wrong", "unbound", "memory"]
        .iter()
        .map(|n| pids[*n])
        .collect();
    want.sort_unstable();
    assert_eq!(
        listed, want,
        "only the processes holding an accelerator: {v:#}"
    );
    let (p, right) = ps_process(&v, pids["right"]);
    assert_eq!(
        right,
        pairs(&[
            ("gpu", "ok"),
            ("cpus", "ok"),
            ("memory", "ok"),
            ("nic", "ok")
        ]),
        "{p:#}"
    );
    assert_eq!(p["expected"]["nodes"], serde_json::json!([2]), "{p:#}");
    assert_eq!(p["memory"]["policy"], "bind:2", "{p:#}");
    let (p, wrong) = ps_process(&v, pids["wrong"]);
    assert_eq!(
        wrong,
        pairs(&[
            ("gpu", "ok"),
            ("cpus", "fail"),
            ("memory", "fail"),
            ("nic", "ok")
        ]),
        "{p:#}"
    );
    let cpus = &p["checks"][1]["evidence"];
    assert!(
        cpus.as_str().unwrap().starts_with("GPU 0 is on node 2; its thread last ran on CPU 0 (node 0); it may run on CPUs 0 (node 0)"),
        "{cpus}"
    );
    let mem = p["checks"][2]["evidence"].as_str().unwrap();
    assert!(
        mem.contains("memory policy bind:0: its new memory comes from node 0 only"),
        "{mem}"
    );
    let (p, unbound) = ps_process(&v, pids["unbound"]);
    let on3 = p["threads"]["last_cpu"].get("3").is_some();
    assert_eq!(
        unbound,
        pairs(&[
            ("gpu", "ok"),
            ("cpus", if on3 { "warn" } else { "fail" }),
            ("memory", "ok"),
            ("nic", "ok")
        ]),
        "{p:#}"
    );
    assert_eq!(p["expected"]["nodes"], serde_json::json!([3]));
    let (p, memory) = ps_process(&v, pids["memory"]);
    assert_eq!(
        memory,
        pairs(&[
            ("gpu", "ok"),
            ("cpus", "ok"),
            ("memory", "fail"),
            ("nic", "ok")
        ]),
        "{p:#}"
    );
    let data0 = p["memory"]["data"]["0"].as_u64().unwrap();
    assert!(data0 >= 32 << 20, "{p:#}");
    // The summary per node counts that process's data on node 0.
    let n0 = &v["nodes"][0];
    assert!(n0["data_bytes"].as_u64().unwrap() >= data0, "{n0}");
    let text = &boot.step("ps-text").stdout;
    assert!(
        text.starts_with("numapin ps: 4 process(es) with a GPU open, of "),
        "{text}"
    );
    assert!(
        text.contains("  FAIL  memory  GPU 0 is on node 2; "),
        "{text}"
    );
    assert!(text.contains("fix: start it bound near its GPU: `numapin exec -- CMD` under the launcher (CPUs 2, memory on node 2)"), "{text}");
}

/// Ranks named with --pid and found by their launcher variables alone (no
/// device open): local rank 1 is the accelerator on node 3; on node 0 and
/// told to use node 2's NIC it fails; a pid that is not there exits 2.
#[test]
fn ps_judges_ranks_named_by_their_launcher_variables() {
    let Some(boot) = four_nodes() else { return };
    let pids = ps_pids(boot);
    let v = ps_report(boot, "ps-ranks");
    let (p, right) = ps_process(&v, pids["rank-right"]);
    assert_eq!(
        right,
        pairs(&[
            ("gpu", "ok"),
            ("cpus", "ok"),
            ("memory", "ok"),
            ("nic", "ok")
        ]),
        "{p:#}"
    );
    let gpu = p["checks"][0]["evidence"].as_str().unwrap();
    assert!(
        gpu.contains("chosen by local rank 1 from LOCAL_RANK"),
        "{gpu}"
    );
    let (p, wrong) = ps_process(&v, pids["rank-wrong"]);
    let named = boot.ok("net-interfaces").stdout.contains("eth");
    // Without the NIC driver the interfaces have no names: the variable
    // then names none of the NICs, a warning.
    let nic = if named { "fail" } else { "warn" };
    assert_eq!(
        wrong,
        pairs(&[
            ("gpu", "ok"),
            ("cpus", "fail"),
            ("memory", "ok"),
            ("nic", nic)
        ]),
        "{p:#}"
    );
    let missing = boot.step("ps-missing");
    assert_eq!(missing.rc, 2, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("pid 4194304: no such process"),
        "{}",
        missing.stderr
    );
}

/// The step markers read back exactly what the guest printed.
mod markers {
    use super::support::parse_steps;
    use proptest::prelude::*;

    /// Formats one step the way `step` in harness.sh does.
    fn emit(name: &str, out: &str, err: &str, rc: i32) -> String {
        format!("=== STEP {name} stdout\n{out}\n=== STEP {name} stderr\n{err}\n=== STEP {name} rc={rc} seconds=0.25\n")
    }

    #[test]
    fn noise_between_steps_is_ignored() {
        let text = format!(
            "boot noise\n{}between\n{}",
            emit("a", "x\ny", "", 0),
            emit("b c", "", "oops\n", 3)
        );
        let steps = parse_steps(&text);
        assert_eq!(steps.len(), 2);
        assert_eq!(
            (
                steps["a"].stdout.as_str(),
                steps["a"].stderr.as_str(),
                steps["a"].rc
            ),
            ("x\ny", "", 0)
        );
        assert_eq!(
            (
                steps["b c"].stdout.as_str(),
                steps["b c"].stderr.as_str(),
                steps["b c"].rc
            ),
            ("", "oops\n", 3)
        );
        assert_eq!(steps["a"].seconds, 0.25);
    }

    #[test]
    fn a_step_cut_off_by_the_end_of_output_is_absent() {
        let text = emit("whole", "1", "", 0) + "=== STEP cut stdout\npartial\n";
        let steps = parse_steps(&text);
        assert!(steps.contains_key("whole"));
        assert!(!steps.contains_key("cut"));
    }

    proptest! {
        #[test]
        fn output_round_trips(
            out in "[ -~\n]{0,200}",
            err in "[ -~\n]{0,200}",
            rc in 0i32..256,
            name in "[a-z][a-z0-9-]{0,20}",
        ) {
            prop_assume!(!out.contains("=== STEP") && !err.contains("=== STEP"));
            let steps = parse_steps(&emit(&name, &out, &err, rc));
            let s = &steps[&name];
            prop_assert_eq!(&s.stdout, &out);
            prop_assert_eq!(&s.stderr, &err);
            prop_assert_eq!(s.rc, rc);
        }
    }
}

/// Checks that run inside the emulated machine (`NUMAPIN_VM_GUEST` is set
/// there); the host tests above boot it and run each with `--exact`.
mod guest {
    use numapin::CpuList;

    use numapin::runtime::{NodeStats, Runtime};

    const REGION: usize = 64 << 20;
    const MIB: usize = 1 << 20;

    /// Node `node`'s arena stats.
    fn stats_of(rt: &Runtime, node: u32) -> NodeStats {
        rt.stats().into_iter().find(|s| s.node == node).unwrap()
    }

    fn in_guest() -> bool {
        if std::env::var_os("NUMAPIN_VM_GUEST").is_some() {
            return true;
        }
        eprintln!("skipped: runs only inside the emulated machine (the host tests in tests/vm.rs boot it)");
        false
    }

    fn online_nodes() -> CpuList {
        CpuList::parse(
            std::fs::read_to_string("/sys/devices/system/node/online")
                .unwrap()
                .trim(),
        )
        .unwrap()
    }

    fn node_cpus(node: u32) -> CpuList {
        let path = format!("/sys/devices/system/node/node{node}/cpulist");
        CpuList::parse(std::fs::read_to_string(&path).unwrap().trim()).unwrap()
    }

    /// The node of every page of a region, counted per node (negative
    /// values are errors move_pages reported for a page, like -ENOENT).
    fn pages_per_node(r: &raw::Region) -> std::collections::BTreeMap<i32, usize> {
        let mut count = std::collections::BTreeMap::new();
        for n in r.page_nodes().unwrap() {
            *count.entry(n).or_insert(0) += 1;
        }
        count
    }

    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn mbind_puts_every_page_on_the_chosen_node() {
        if !in_guest() {
            return;
        }
        let nodes = online_nodes();
        assert!(nodes.len() >= 2, "the machine has nodes {nodes}");
        for node in nodes.iter() {
            let mut r = raw::Region::map(REGION).unwrap();
            r.bind(node).unwrap();
            r.touch();
            let pages = REGION / r.page_size();
            assert_eq!(
                pages_per_node(&r),
                [(node as i32, pages)].into(),
                "a {REGION}-byte region bound to node {node}"
            );
            println!("node {node}: all {pages} pages there");
        }
    }

    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn arena_regions_land_on_every_node() {
        use numapin::runtime::RuntimeConfig;
        use numapin::topology::{CudaMode, PciId, Topology};
        if !in_guest() {
            return;
        }
        let opts = numapin::topology::ProbeOptions::default()
            .with_cuda(CudaMode::Off)
            .with_accelerator_ids(vec![PciId::parse("1b36:0005").unwrap()]);
        let t = Topology::probe(&opts).unwrap();
        assert_eq!(t.numa_nodes.len(), 4);
        let memory: Vec<(u32, u64)> = t
            .numa_nodes
            .iter()
            .map(|n| (n.os_index, n.memory_bytes))
            .collect();
        let cfg = RuntimeConfig::default().with_region_bytes(32 << 20);
        let rt = Runtime::new(t, cfg).unwrap();
        for (node, mem) in memory {
            a_buffer_lands_on_its_node_within_its_budget(&rt, node, mem);
        }
        drop(rt);
        regions_in_halves_land_on_their_node(&opts);
    }

    /// A buffer on `node` (of `mem` bytes): every page there, the region
    /// counted, the default budget half the node's memory and a request
    /// over it refused with the figures.
    fn a_buffer_lands_on_its_node_within_its_budget(rt: &Runtime, node: u32, mem: u64) {
        const BUF: usize = 8 << 20;
        let mut b = rt.alloc(numapin::Target::HostNode(node), BUF).unwrap();
        assert_eq!(b.node(), node);
        b.fill(7);
        let page = 4096;
        let pages: Vec<*mut libc::c_void> = (0..BUF)
            .step_by(page)
            .map(|o| b.as_mut_ptr().wrapping_add(o).cast())
            .collect();
        let status = raw::query(&pages).unwrap();
        assert!(
            status.iter().all(|&s| s == node as i32),
            "node {node}: pages on {:?}",
            {
                let mut c = std::collections::BTreeMap::new();
                for s in &status {
                    *c.entry(*s).or_insert(0) += 1;
                }
                c
            }
        );
        let st = stats_of(rt, node);
        assert_eq!(st.regions, 1, "node {node}: {st:?}");
        assert_eq!(st.bytes_reserved, 32 << 20, "node {node}: {st:?}");
        assert_eq!(st.bytes_locked, 32 << 20, "node {node}: {st:?}");
        assert_eq!(st.bytes_in_use, BUF as u64, "node {node}: {st:?}");
        assert_eq!(st.pages_off_node, 0, "node {node}: {st:?}");
        assert!(
            st.pages_on_node >= (BUF / page) as u64,
            "node {node}: {st:?}"
        );
        assert_eq!(
            st.budget,
            mem / 2,
            "node {node}: the default budget is half the node's memory: {st:?}"
        );
        // Over budget: the error names the node and the figures.
        match rt.alloc(numapin::Target::HostNode(node), (mem / 2) as usize) {
            Err(numapin::runtime::RuntimeError::BudgetExceeded { node: n, limit, .. }) => {
                assert_eq!((n, limit), (node, mem / 2));
            }
            other => panic!(
                "node {node}: expected BudgetExceeded, got {:?}",
                other.map(|b| b.len())
            ),
        }
        drop(b);
        let st = stats_of(rt, node);
        assert_eq!(st.bytes_in_use, 0, "node {node}: {st:?}");
        println!(
            "node {node}: {} pages of a {BUF}-byte buffer all on node {node}; {} region(s), {} bytes locked, budget {}",
            pages.len(),
            st.regions,
            st.bytes_locked,
            st.budget
        );
    }

    /// Regions made in halves (populated, locked and counted part by part)
    /// land on their node just the same.
    fn regions_in_halves_land_on_their_node(opts: &numapin::topology::ProbeOptions) {
        use numapin::runtime::RuntimeConfig;
        let t = numapin::topology::Topology::probe(opts).unwrap();
        let rt = Runtime::new(
            t,
            RuntimeConfig::default()
                .with_region_bytes(32 << 20)
                .with_register_in_parts(true),
        )
        .unwrap();
        for node in 0..4u32 {
            // Two 12 MiB buffers: one in each half of one region.
            let mut bufs: Vec<_> = (0..2)
                .map(|_| rt.alloc(numapin::Target::HostNode(node), 12 << 20).unwrap())
                .collect();
            for b in &mut bufs {
                b.fill(9);
                let pages: Vec<*mut libc::c_void> = (0..b.len())
                    .step_by(4096)
                    .map(|o| b.as_mut_ptr().wrapping_add(o).cast())
                    .collect();
                let status = raw::query(&pages).unwrap();
                assert!(
                    status.iter().all(|&s| s == node as i32),
                    "node {node}, in halves: a page elsewhere"
                );
            }
            let st = stats_of(&rt, node);
            assert_eq!(
                (st.regions, st.pages_off_node),
                (1, 0),
                "node {node}: {st:?}"
            );
            assert_eq!(st.pages_on_node, (32 << 20) / 4096, "node {node}: {st:?}");
            println!("node {node}: a region in halves, every page on node {node}");
        }
    }

    /// Under a seccomp filter refusing the NUMA calls, run in a child (this
    /// binary again, the filter installed before exec).
    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn arena_under_a_seccomp_filter() {
        if !in_guest() {
            return;
        }
        let prog = crate::common::seccomp::docker_default();
        let out = crate::common::run_child("guest::filtered_arena_child", &[], move || {
            crate::common::seccomp::install(&prog)
        })
        .expect("the child starts");
        crate::common::assert_child_passed(&out);
    }

    /// The child of [`arena_under_a_seccomp_filter`]: regions on nodes 2
    /// and 3 are placed by first touch from each node's CPU and verified
    /// through numa_maps; a region for a node whose CPUs the populate
    /// threads may not use lands elsewhere and the OffNode rule judges
    /// it; a memory cgroup's cap holds over all nodes together.
    #[test]
    #[ignore = "runs inside the emulated machine, in a child under a seccomp filter"]
    fn filtered_arena_child() {
        use numapin::runtime::RuntimeConfig;
        use numapin::topology::{CudaMode, PciId, ProbeOptions, Topology};
        if !in_guest() || !crate::common::in_child("guest::filtered_arena_child") {
            return;
        }
        assert_eq!(
            numapin::internals::proc_status_field("Seccomp").as_deref(),
            Some("2")
        );
        let opts = ProbeOptions::default()
            .with_cuda(CudaMode::Off)
            .with_accelerator_ids(vec![PciId::parse("1b36:0005").unwrap()]);
        let t = Topology::probe(&opts).unwrap();
        let cfg = RuntimeConfig::default().with_region_bytes(16 << 20);
        let rt = Runtime::new(t.clone(), cfg.clone()).unwrap();
        for node in [2u32, 3] {
            a_filtered_region_is_placed_by_first_touch(&rt, node);
        }
        drop(rt);
        a_node_without_cpus_is_left_to_the_placement_rule();
        a_memory_cgroup_caps_all_nodes_together(t, cfg);
    }

    /// Under the filter: a buffer on `node` comes from a region placed by
    /// first touch from the node's CPU, verified through numa_maps, which
    /// agrees over the buffer alone.
    fn a_filtered_region_is_placed_by_first_touch(rt: &Runtime, node: u32) {
        const BUF: usize = 8 << 20;
        let mut b = rt.alloc(numapin::Target::HostNode(node), BUF).unwrap();
        b.fill(5);
        let s = stats_of(rt, node);
        assert_eq!(
            (
                s.regions,
                s.regions_first_touch,
                s.regions_verified_numa_maps
            ),
            (1, 1, 1),
            "node {node}: {s:?}"
        );
        assert_eq!(
            (s.pages_on_node, s.pages_off_node),
            (4096, 0),
            "node {node}: {s:?}"
        );
        assert_eq!(
            s.method_notes,
            [format!(
                "mbind refused (EPERM): touched first from CPUs {node}"
            )]
        );
        // numa_maps over the buffer alone says the same.
        let start = b.as_ptr() as u64;
        let p = numapin::internals::numa_maps_of(start, start + BUF as u64).unwrap();
        assert_eq!(
            p.exact_nodes,
            Some(vec![(node, BUF as u64)]),
            "node {node}: {p:?}"
        );
        println!(
            "node {node}: {}; {} pages on the node",
            s.methods(),
            s.pages_on_node
        );
    }

    /// Node 2 with no CPU to touch from: the populate threads run where
    /// this thread does (CPU 0), the pages land on node 0, and the
    /// OffNode rule decides.
    fn a_node_without_cpus_is_left_to_the_placement_rule() {
        use numapin::region::{Region, RegionOptions};
        use numapin::runtime::{OffNode, RuntimeError};
        numapin::affinity::bind_current_thread(&CpuList::from_iter_unsorted([0])).unwrap();
        let o = RegionOptions {
            node: 2,
            size: 4 << 20,
            cpus: CpuList::new(),
            populate_threads: 1,
            register: false,
            off_node: OffNode::Strict,
            pin_by_registration: None,
            backend: numapin::runtime::Backend::Mapped,
            huge_pages: Default::default(),
            register_part_bytes: 0,
            pool_root: None,
            shared: None,
            fail_after: None,
        };
        let e = Region::create(&o).unwrap_err();
        let msg = numapin::error::with_causes(&e);
        assert!(
            matches!(&e, RuntimeError::OffNode { on_node: 0, elsewhere, .. } if elsewhere == &[(0, 1024)]),
            "{msg}"
        );
        assert!(
            msg.contains("node 2 has no CPU this process may use"),
            "{msg}"
        );
        assert!(e.fix().unwrap().contains("SYS_NICE"));
        let r = Region::create(&RegionOptions {
            off_node: OffNode::Warn,
            shared: None,
            ..o
        })
        .unwrap();
        let c = r.count_pages().unwrap();
        assert_eq!((c.on(2), c.on(0)), (0, 1024), "{c:?}");
        drop(r);
        println!("node 2 without CPUs: {msg}");
    }

    /// A memory cgroup limit of 64 MiB: 32 MiB pinned over all nodes.
    fn a_memory_cgroup_caps_all_nodes_together(
        t: numapin::topology::Topology,
        mut cfg: numapin::runtime::RuntimeConfig,
    ) {
        use numapin::runtime::RuntimeError;
        let root = crate::common::cgroup_v2_root(64 << 20);
        numapin::internals::cgroup_root(&mut cfg, Some(root.path().to_path_buf()));
        let rt = Runtime::new(t, cfg).unwrap();
        let a = rt.alloc(numapin::Target::HostNode(2), 16 << 20).unwrap();
        let b = rt.alloc(numapin::Target::HostNode(3), 16 << 20).unwrap();
        match rt.alloc(numapin::Target::HostNode(1), 2 << 20) {
            Err(RuntimeError::CgroupBudget { limit, in_use, .. }) => {
                assert_eq!((limit, in_use), (32 << 20, 32 << 20));
            }
            other => panic!(
                "expected the cgroup budget error, got {:?}",
                other.map(|b| b.len())
            ),
        }
        drop(a);
        assert_eq!(rt.trim(), 16 << 20);
        drop(rt.alloc(numapin::Target::HostNode(1), 2 << 20).unwrap());
        drop(b);
    }

    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn first_touch_follows_the_thread() {
        if !in_guest() {
            return;
        }
        // With the default policy a page lands on the node of the CPU that
        // first writes it: this proves both that affinity moved the thread
        // and that the nodes really have separate memory. Automatic NUMA
        // balancing scans default-policy memory and, on this kernel (6.1),
        // move_pages then reports -EFAULT for huge pages it is working on;
        // it is off while this runs (bound memory is not scanned).
        let _balancing = NumaBalancingOff::new();
        for &node in online_nodes().as_slice().iter().rev() {
            numapin::affinity::bind_current_thread(&node_cpus(node)).unwrap();
            let mut r = raw::Region::map(REGION).unwrap();
            r.touch();
            let pages = REGION / r.page_size();
            assert_eq!(
                pages_per_node(&r),
                [(node as i32, pages)].into(),
                "first touch from node {node}'s CPUs"
            );
        }
    }

    /// Turns `kernel.numa_balancing` off until dropped, then restores it.
    struct NumaBalancingOff(Option<String>);

    impl NumaBalancingOff {
        const PATH: &'static str = "/proc/sys/kernel/numa_balancing";

        fn new() -> Self {
            let old = std::fs::read_to_string(Self::PATH).ok();
            if old.is_some() {
                std::fs::write(Self::PATH, "0").unwrap();
            }
            Self(old)
        }
    }

    impl Drop for NumaBalancingOff {
        fn drop(&mut self) {
            if let Some(old) = &self.0 {
                let _ = std::fs::write(Self::PATH, old.trim());
            }
        }
    }

    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn setaffinity_moves_the_thread_to_node_2() {
        if !in_guest() {
            return;
        }
        let want = node_cpus(2);
        assert!(!want.is_empty());
        numapin::affinity::bind_current_thread(&want).unwrap();
        assert_eq!(numapin::internals::thread_cpus().unwrap(), want);
        let tid = raw::gettid();
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        let listed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        assert_eq!(CpuList::parse(listed).unwrap(), want);
        for _ in 0..100 {
            std::thread::yield_now();
            let cpu = raw::current_cpu();
            assert!(
                want.contains(cpu),
                "running on CPU {cpu}, outside node 2's CPUs {want}"
            );
        }
    }

    /// A host-mode loader for the accelerator on node 2 (the stand-in has
    /// no CUDA ordinal, so it is named by its topology index): its workers
    /// run only on node 2's CPUs, every batch's slot lies on node 2, and
    /// everything is given back at the end.
    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn loader_for_the_node_2_accelerator_stays_on_node_2() {
        use numapin::loader::{Loader, LoaderConfig, Target};
        use numapin::runtime::{Runtime, RuntimeConfig};
        use numapin::topology::{CudaMode, PciId, ProbeOptions, Topology};
        use std::collections::BTreeSet;
        use std::sync::{Arc, Mutex};

        if !in_guest() {
            return;
        }
        let opts = ProbeOptions::from_process()
            .with_cuda(CudaMode::Off)
            .with_accelerator_ids(vec![PciId::parse(super::TESTDEV_PCI_ID).unwrap()]);
        let topo = Topology::probe(&opts).unwrap();
        let acc = topo
            .gpus
            .iter()
            .find(|g| g.numa_node == Some(2))
            .expect("an accelerator on node 2")
            .index;
        let rt = Runtime::new(topo, RuntimeConfig::default().with_region_bytes(16 << 20)).unwrap();
        let want = node_cpus(2);
        let ran_on = Arc::new(Mutex::new(BTreeSet::new()));
        let seen = ran_on.clone();
        let cfg = LoaderConfig::default()
            .with_batch_bytes(1 << 20)
            .with_workers(2)
            .with_total_batches(Some(24));
        let loader = Loader::new(&rt, Target::HostForGpu(acc), cfg, move |i, s: &mut [u8]| {
            seen.lock().unwrap().insert(raw::current_cpu());
            s.fill(i as u8);
            Ok::<_, String>(s.len())
        })
        .unwrap();
        assert_eq!(loader.worker_cpus(), &want);
        assert_eq!(loader.node(), 2);
        assert!(loader.warnings().is_empty(), "{:?}", loader.warnings());
        for &tid in loader.worker_tids() {
            let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid)).unwrap();
            let got: CpuList = (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .map(|c| c as u32)
                .collect();
            assert_eq!(got, want, "worker {tid}");
        }
        let mut n = 0;
        for b in &loader {
            let b = b.unwrap();
            assert_eq!(b.index(), n);
            let buf = b.host_buf().unwrap();
            assert_eq!(buf.node(), 2);
            assert!(b.host_bytes().unwrap().iter().all(|&x| x == n as u8));
            let pages: Vec<*mut libc::c_void> = (0..buf.len())
                .step_by(4096)
                .map(|off| buf.as_ptr().wrapping_add(off) as *mut libc::c_void)
                .collect();
            let nodes = raw::query(&pages).unwrap();
            assert!(
                nodes.iter().all(|&x| x == 2),
                "batch {n}: pages on {nodes:?}"
            );
            n += 1;
        }
        assert_eq!(n, 24);
        let cpus: CpuList = ran_on.lock().unwrap().iter().copied().collect();
        assert!(
            cpus.is_subset(&want),
            "producers ran on {cpus}, outside node 2 ({want})"
        );
        drop(loader);
        for s in rt.stats() {
            assert_eq!(s.bytes_in_use, 0, "{s:?}");
        }
        println!("24 batches, workers on CPUs {cpus}, every slot page on node 2");
    }

    /// A pool of 2 MiB hugetlb pages on node 2 only: regions of its pages
    /// on node 2 come from it, every page there (move_pages per 4 KiB page,
    /// independently of numapin's count); node 3 has none: asking for them
    /// there is an error and Auto uses THP; and when a pool file lies
    /// (claims node 3 has pages), the machine-wide reservation succeeds
    /// with node 2's pages but faulting them in on node 3 fails, which must
    /// be an error, not SIGBUS, with everything given back.
    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn hugetlb_regions_follow_each_nodes_pool() {
        use numapin::runtime::{HugePages, RuntimeConfig};
        use numapin::topology::{CudaMode, ProbeOptions, Topology};
        if !in_guest() {
            return;
        }
        let pool = crate::common::HugePool::reserve(2, 2 << 20, 8).unwrap();
        let t = Topology::probe(&ProbeOptions::default().with_cuda(CudaMode::Off)).unwrap();
        let explicit = RuntimeConfig::default()
            .with_region_bytes(8 * MIB)
            .with_huge_pages(HugePages::Hugetlb2M);
        explicit_hugetlb_pages_come_from_the_nodes_pool(&t, &explicit, &pool);
        auto_takes_a_pool_only_where_there_is_one(&t, &pool);
        a_lying_pool_file_is_an_error_not_sigbus(t, explicit, &pool);
    }

    /// Explicit 2 MiB pages (`explicit`): a region on node 2 comes from
    /// its pool, every page there; node 3 has none, an error.
    fn explicit_hugetlb_pages_come_from_the_nodes_pool(
        t: &numapin::topology::Topology,
        explicit: &numapin::runtime::RuntimeConfig,
        pool: &crate::common::HugePool,
    ) {
        use numapin::runtime::RuntimeError;
        let rt = Runtime::new(t.clone(), explicit.clone()).unwrap();
        let mut b = rt.alloc(numapin::Target::HostNode(2), 3 * MIB).unwrap();
        b.fill(9);
        let pages: Vec<*mut libc::c_void> = (0..3 * MIB)
            .step_by(4096)
            .map(|o| b.as_mut_ptr().wrapping_add(o).cast())
            .collect();
        let status = raw::query(&pages).unwrap();
        assert!(status.iter().all(|&s| s == 2), "{status:?}");
        let s = stats_of(&rt, 2);
        assert_eq!(
            (
                s.regions_hugetlb_2m,
                s.pages_on_node,
                s.pages_off_node,
                s.bytes_locked
            ),
            (1, 2048, 0, 0),
            "{s:?}"
        );
        assert_eq!(pool.free(), 4);
        match rt.alloc(numapin::Target::HostNode(3), MIB) {
            Err(RuntimeError::HugePages {
                node: 3,
                needed: 4,
                usable: Some(0),
                ..
            }) => {}
            other => panic!(
                "node 3: expected the pool error, got {:?}",
                other.map(|b| b.len())
            ),
        }
        drop(b);
        drop(rt);
        assert_eq!(pool.free(), 8);
    }

    /// Auto: node 2 takes its pool, node 3 (no pool: no note) THP.
    fn auto_takes_a_pool_only_where_there_is_one(
        t: &numapin::topology::Topology,
        pool: &crate::common::HugePool,
    ) {
        let auto = numapin::runtime::RuntimeConfig::default().with_region_bytes(8 * MIB);
        let rt = Runtime::new(t.clone(), auto).unwrap();
        let a = rt.alloc(numapin::Target::HostNode(2), MIB).unwrap();
        let b = rt.alloc(numapin::Target::HostNode(3), MIB).unwrap();
        let (s2, s3) = (stats_of(&rt, 2), stats_of(&rt, 3));
        assert_eq!(s2.regions_hugetlb_2m, 1, "{s2:?}");
        assert_eq!(s3.regions_hugetlb_2m, 0, "{s3:?}");
        assert_eq!(s3.regions_thp + s3.regions_base_pages, 1, "{s3:?}");
        assert!(s3.method_notes.is_empty(), "{s3:?}");
        drop((a, b));
        drop(rt);
        assert_eq!(pool.free(), 8);
    }

    /// A pool file that claims node 3 has 8 free pages: faulting them in
    /// there fails, an error (not SIGBUS), with everything given back.
    fn a_lying_pool_file_is_an_error_not_sigbus(
        t: numapin::topology::Topology,
        mut cfg: numapin::runtime::RuntimeConfig,
        pool: &crate::common::HugePool,
    ) {
        use numapin::runtime::RuntimeError;
        let fake = tempfile::tempdir().unwrap();
        for (dir, files) in [
            (
                "sys/devices/system/node/node3/hugepages/hugepages-2048kB",
                &[
                    ("nr_hugepages", 8),
                    ("free_hugepages", 8),
                    ("surplus_hugepages", 0),
                ][..],
            ),
            (
                "sys/kernel/mm/hugepages/hugepages-2048kB",
                &[
                    ("nr_hugepages", 8),
                    ("free_hugepages", 8),
                    ("resv_hugepages", 0),
                    ("surplus_hugepages", 0),
                    ("nr_overcommit_hugepages", 0),
                ][..],
            ),
        ] {
            let d = fake.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        }
        numapin::internals::pool_root(&mut cfg, Some(fake.path().to_path_buf()));
        let rt = Runtime::new(t, cfg).unwrap();
        let e = rt.alloc(numapin::Target::HostNode(3), MIB).unwrap_err();
        let msg = numapin::error::with_causes(&e);
        assert!(
            matches!(
                &e,
                RuntimeError::HugePages {
                    node: 3,
                    usable: None,
                    source: Some(_),
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains("faulting the pages in failed"), "{msg}");
        assert!(!numapin::internals::is_mapped(
            numapin::internals::last_mapped_addr()
        ));
        assert_eq!(pool.free(), 8, "node 2's pages back in its pool");
        println!("node 3 without pages, past a lying pool file: {msg}");
    }

    /// The raw system calls the checks need (std + libc only).
    mod raw {
        use std::io;

        const MPOL_BIND: libc::c_int = 2;

        /// An anonymous private mapping, unmapped on drop.
        pub(super) struct Region {
            ptr: *mut u8,
            len: usize,
            page: usize,
        }

        impl Region {
            pub(super) fn map(len: usize) -> io::Result<Self> {
                // SAFETY: sysconf has no preconditions.
                let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
                // SAFETY: a fresh anonymous mapping at an address the kernel
                // picks; it aliases nothing.
                let ptr = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                if ptr == libc::MAP_FAILED {
                    return Err(io::Error::last_os_error());
                }
                Ok(Self {
                    ptr: ptr.cast(),
                    len,
                    page,
                })
            }

            pub(super) fn page_size(&self) -> usize {
                self.page
            }

            /// `mbind(MPOL_BIND)` to one node, before any page is touched.
            pub(super) fn bind(&mut self, node: u32) -> io::Result<()> {
                assert!(node < 64);
                let mask: [libc::c_ulong; 1] = [1 << node];
                // SAFETY: the range is our own mapping; the mask is 64 bits
                // long and maxnode (65) tells the kernel to read 64 of them.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_mbind,
                        self.ptr,
                        self.len,
                        MPOL_BIND,
                        mask.as_ptr(),
                        65 as libc::c_ulong,
                        0 as libc::c_uint,
                    )
                };
                if r != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }

            /// Writes one byte of every page, so every page is allocated.
            pub(super) fn touch(&mut self) {
                for off in (0..self.len).step_by(self.page) {
                    // SAFETY: off < len, inside our writable mapping.
                    unsafe { self.ptr.add(off).write_volatile(1) };
                }
            }

            /// The node each page is on (`move_pages` with no target nodes).
            /// A page the kernel is migrating right then (compaction of a
            /// huge page, NUMA balancing) reads as -EFAULT or -ENOENT for a
            /// moment: those are asked again, for up to a second; a page that
            /// is really missing stays negative.
            pub(super) fn page_nodes(&self) -> io::Result<Vec<i32>> {
                let pages: Vec<*mut libc::c_void> = (0..self.len)
                    .step_by(self.page)
                    .map(|off| self.ptr.wrapping_add(off).cast())
                    .collect();
                let mut status = query(&pages)?;
                for _ in 0..50 {
                    let again: Vec<usize> = (0..status.len()).filter(|&i| status[i] < 0).collect();
                    if again.is_empty() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    let now = query(&again.iter().map(|&i| pages[i]).collect::<Vec<_>>())?;
                    for (i, s) in again.into_iter().zip(now) {
                        status[i] = s;
                    }
                }
                Ok(status)
            }
        }

        /// The node of each page (`move_pages` with no target nodes).
        pub(super) fn query(pages: &[*mut libc::c_void]) -> io::Result<Vec<i32>> {
            let mut status = vec![i32::MIN; pages.len()];
            // SAFETY: `pages` and `status` both hold `pages.len()` entries;
            // a null `nodes` only queries; pid 0 is this process. The
            // addresses are only looked up by the kernel, never dereferenced.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_move_pages,
                    0,
                    pages.len() as libc::c_ulong,
                    pages.as_ptr(),
                    std::ptr::null::<libc::c_int>(),
                    status.as_mut_ptr(),
                    0,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(status)
        }

        impl Drop for Region {
            fn drop(&mut self) {
                // SAFETY: unmaps exactly the mapping made in `map`; no
                // reference into it outlives `self`.
                unsafe { libc::munmap(self.ptr.cast(), self.len) };
            }
        }

        pub(super) fn gettid() -> i64 {
            // SAFETY: gettid has no preconditions.
            unsafe { libc::syscall(libc::SYS_gettid) }
        }

        pub(super) fn current_cpu() -> u32 {
            // SAFETY: sched_getcpu has no preconditions.
            let c = unsafe { libc::sched_getcpu() };
            assert!(c >= 0, "sched_getcpu: {}", io::Error::last_os_error());
            c as u32
        }
    }

    /// The machine budget per node across processes: a child pinning on
    /// node 2 and one on node 3, each under a 64 MiB machine budget, each
    /// get all of their own node's (and a third on node 2 is refused,
    /// naming the first), with every page on its node.
    #[test]
    #[ignore = "runs inside the emulated machine; `cargo test --test vm` boots it"]
    fn machine_budget_is_per_node() {
        use numapin::runtime::machine_budget_usage;
        use std::process::{Command, Stdio};
        if !in_guest() {
            return;
        }
        let dir = std::path::PathBuf::from(format!("/tmp/mb-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let release = dir.join("release");
        let child = |node: u32, count: usize| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    "--nocapture",
                    "guest::machine_budget_child",
                ])
                .env("NUMAPIN_MACHINE_BUDGET", "64MiB")
                .env("NUMAPIN_MACHINE_BUDGET_DIR", &dir)
                .env("MB_NODE", node.to_string())
                .env("MB_COUNT", count.to_string())
                .env("MB_READY", dir.join(format!("ready-{node}-{count}")))
                .env("MB_RELEASE", &release)
                // Its own "test result" lines would mix with this test's.
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        };
        let ready = |node: u32, count: usize| -> (usize, String) {
            let p = dir.join(format!("ready-{node}-{count}"));
            for _ in 0..6000 {
                if let Ok(t) = std::fs::read_to_string(&p) {
                    let (n, why) = t.split_once('\n').unwrap();
                    return (n.parse().unwrap(), why.to_string());
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            panic!("child for node {node} never got ready");
        };
        let a = child(2, 6);
        let b = child(3, 6);
        assert_eq!(ready(2, 6).0, 4, "64 MiB of 16 MiB regions on node 2");
        assert_eq!(
            ready(3, 6).0,
            4,
            "and as much again on node 3: budgets are per node"
        );
        let c = child(2, 1);
        let (got, why) = ready(2, 1);
        assert_eq!(got, 0, "node 2's machine budget is spent");
        assert!(why.contains(&format!("pid {} (", a.id())), "{why}");
        let (found, refused) = machine_budget_usage(Some(&dir));
        assert!(refused.is_empty(), "{refused:?}");
        let nodes: Vec<_> = found[0]
            .nodes
            .iter()
            .map(|n| {
                (
                    n.node,
                    n.used,
                    n.holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
                )
            })
            .collect();
        assert_eq!(
            nodes,
            [(2, 64 << 20, vec![a.id()]), (3, 64 << 20, vec![b.id()])],
            "per node: used, by whom"
        );
        std::fs::write(&release, "").unwrap();
        for mut ch in [a, b, c] {
            assert!(ch.wait().unwrap().success());
        }
        assert!(
            machine_budget_usage(Some(&dir)).0.is_empty(),
            "all given back"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The child of [`machine_budget_is_per_node`]: pins up to `MB_COUNT`
    /// buffers of 16 MiB on node `MB_NODE` (every page checked there),
    /// writes how many and the refusal to `MB_READY`, holds them until
    /// `MB_RELEASE` appears.
    #[test]
    #[ignore = "runs inside the emulated machine, started by machine_budget_is_per_node"]
    fn machine_budget_child() {
        use numapin::runtime::{RuntimeConfig, RuntimeError, Target};
        use numapin::topology::{CudaMode, ProbeOptions, Topology};
        let Ok(node) = std::env::var("MB_NODE") else {
            return;
        };
        let node: u32 = node.parse().unwrap();
        let count: usize = std::env::var("MB_COUNT").unwrap().parse().unwrap();
        let t = Topology::probe(&ProbeOptions::default().with_cuda(CudaMode::Off)).unwrap();
        let rt = Runtime::new(t, RuntimeConfig::default().with_region_bytes(16 * MIB)).unwrap();
        let mut held = Vec::new();
        let mut why = String::new();
        for _ in 0..count {
            match rt.alloc(Target::HostNode(node), 16 * MIB) {
                Ok(mut b) => {
                    b.fill(1);
                    held.push(b);
                }
                Err(e) => {
                    assert!(matches!(e, RuntimeError::MachineBudget { .. }), "{e}");
                    why = e.to_string();
                    break;
                }
            }
        }
        let s = stats_of(&rt, node);
        assert_eq!(s.machine_budget, 64 << 20);
        assert_eq!(s.machine_share, held.len() as u64 * (16 << 20));
        assert_eq!(s.pages_off_node, 0);
        assert_eq!(s.pages_on_node, s.bytes_reserved / 4096);
        let ready = std::env::var("MB_READY").unwrap();
        std::fs::write(format!("{ready}.tmp"), format!("{}\n{why}", held.len())).unwrap();
        std::fs::rename(format!("{ready}.tmp"), &ready).unwrap();
        let release = std::path::PathBuf::from(std::env::var("MB_RELEASE").unwrap());
        while !release.exists() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// The NICs on nodes 2 and 3: each accelerator's is the one on its node
/// (`NODE`: another PCIe expander bridge of the same node); the other NIC is
/// on another node (`SOCK` when QEMU puts the nodes in one package, `SYS`
/// otherwise). Each rank gets the NIC on its node, by PCI location and by
/// the interface name the kernel gave it.
#[test]
fn each_rank_gets_the_nic_on_its_node() {
    let Some(boot) = four_nodes() else { return };
    let t = topology(boot, "topo-json");
    let nics: Vec<_> = t
        .nics
        .iter()
        .filter(|n| (n.vendor_id.as_str(), n.device_id.as_str()) == E1000E_PCI_ID)
        .collect();
    assert_eq!(nics.len(), 2, "{:?}", t.nics);
    assert_eq!(
        nics.iter().map(|n| n.numa_node).collect::<Vec<_>>(),
        [Some(2), Some(3)],
        "in PCI order, behind the expander bridges of nodes 2 and 3"
    );
    let package_of = |node: u32| t.node(node).unwrap().package;
    let far = if package_of(2).is_some() && package_of(2) == package_of(3) {
        Relation::Sock
    } else {
        Relation::Sys
    };
    assert_eq!(nics[0].gpu_relations, [Relation::Node, far]);
    assert_eq!(nics[1].gpu_relations, [far, Relation::Node]);
    for n in &nics {
        assert_eq!(n.kind, DeviceKind::Ethernet);
    }
    // The kernel's interfaces: with the e1000e driver loaded (the harness
    // ships it when this kernel's modules have it) each NIC is named.
    let ifaces = boot.ok("net-interfaces").stdout.clone();
    let named = ifaces.split_whitespace().any(|i| i.starts_with("eth"));
    let on = |node: usize| nics[node].names.first().cloned();
    // The plan: rank r drives accelerator r and gets the NIC of its node.
    let plan: serde_json::Value = serde_json::from_str(&boot.ok("affinity-nics").stdout).unwrap();
    for (r, nic) in nics.iter().enumerate() {
        let rn = &plan["ranks"][r]["nics"];
        assert_eq!(rn.as_array().unwrap().len(), 1, "rank {r}: {rn}");
        assert_eq!(
            rn[0]["pci_bus_id"].as_str(),
            nic.pci_bus_id.as_deref(),
            "rank {r}"
        );
        assert_eq!(rn[0]["relation"], "NODE", "rank {r}");
    }
    let gpu1 = boot.step("exec-nic-gpu1");
    let rank0 = boot.step("exec-nic-rank0");
    if named {
        let (eth2, eth3) = (on(0).unwrap(), on(1).unwrap());
        assert!(
            ifaces.contains(&eth2) && ifaces.contains(&eth3),
            "{ifaces} vs {eth2} {eth3}"
        );
        assert_eq!(
            (gpu1.rc, gpu1.stdout.trim()),
            (0, eth3.as_str()),
            "{}",
            gpu1.stderr
        );
        assert_eq!(
            (rank0.rc, rank0.stdout.trim()),
            (0, eth2.as_str()),
            "{}",
            rank0.stderr
        );
    } else {
        // No driver: the NICs are there but unnamed, and numapin refuses
        // rather than guesses.
        support::note(&format!(
            "vm: the NICs have no driver here ({ifaces}): checking the refusal"
        ));
        assert!(on(0).is_none() && on(1).is_none());
        assert_eq!(gpu1.rc, 2, "{}", gpu1.stderr);
        assert!(gpu1.stderr.contains("has no OS name"), "{}", gpu1.stderr);
    }
    // Plain Ethernet has no verbs device for NCCL_IB_HCA: refused, with the
    // variable NCCL uses for it in the fix.
    let nccl = boot.step("exec-nic-nccl");
    assert_eq!(nccl.rc, 2, "{}", nccl.stderr);
    let why = if named {
        "NCCL_SOCKET_IFNAME"
    } else {
        "has no OS name"
    };
    assert!(nccl.stderr.contains(why), "{}", nccl.stderr);
}

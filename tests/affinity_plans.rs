//! Affinity plans on described machines: PyTorch's torchrun NUMA binding
//! cases, SNC/NPS, SMT on and off, restricted allowed sets, unknown locality,
//! and the invariants on every real machine description in
//! `../shared/topologies/`.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

mod common;

use std::path::PathBuf;

use common::{add_gpu, allow_everything, cpus, empty, Shape};
use numapin::affinity::{plan, plan_node, Mode, Plan, PlanOptions};
use numapin::topology::{NodeKind, NumaNode, Package, ProbeOptions, Topology};
use numapin::CpuList;
use proptest::prelude::*;

const MODES: [Mode; 5] = [
    Mode::Node,
    Mode::Socket,
    Mode::Exclusive,
    Mode::Cache,
    Mode::Core,
];

fn all_gpus(t: &Topology) -> Vec<numapin::GpuIndex> {
    (0..u32::try_from(t.gpus.len()).unwrap())
        .map(numapin::GpuIndex)
        .collect()
}

fn run(t: &Topology, mode: Mode) -> Plan {
    plan(t, &all_gpus(t), mode, &PlanOptions::default()).unwrap()
}

/// Asserts that rank `rank` carries a warning containing `needle`.
fn assert_warned(p: &Plan, rank: usize, needle: &str) {
    let w = &p.ranks[rank].warnings;
    assert!(
        w.iter().any(|w| w.contains(needle)),
        "rank {rank}: no warning with {needle:?} in {w:?}"
    );
}

fn cpus_of(p: &Plan, rank: usize) -> String {
    p.ranks[rank].cpus.to_string()
}

// ---- PyTorch's test/test_numa_binding.py, case by case. Their machines
// have SMT on (sibling threads numbered consecutively), and torchrun gives
// local rank R the GPU R; the expected sets are theirs.

#[test]
fn torch_node_binding() {
    // 4 sockets x 2 nodes, 2 GPUs per node: GPU 11 is on node 11 / 2 = 5.
    let t = Shape::new(4, 2, 2, 4, 2).build();
    let p = run(&t, Mode::Node);
    assert_eq!(cpus_of(&p, 11), "80-95");
    assert_eq!(p.ranks[11].mems, [5]);
    assert!(p.ranks[11].warnings.is_empty());
}

#[test]
fn torch_socket_binding_with_two_nodes_per_socket() {
    // GPU 15 is on node 7, in socket 3 with node 6.
    let t = Shape::new(4, 2, 2, 4, 2).build();
    let p = run(&t, Mode::Socket);
    assert_eq!(cpus_of(&p, 15), "96-127");
    assert_eq!(p.ranks[15].mems, [6, 7]);
}

#[test]
fn torch_socket_binding_with_one_node_per_socket() {
    let t = Shape::new(4, 1, 2, 4, 2).build();
    let p = run(&t, Mode::Socket);
    assert_eq!(cpus_of(&p, 7), "48-63");
    assert_eq!(p.ranks[7].mems, [3]);
    assert_eq!(
        p.ranks[7].cpus,
        run(&t, Mode::Node).ranks[7].cpus,
        "one node per socket: socket = node"
    );
}

#[test]
fn torch_exclusive_binding_gives_the_remainder_to_the_lowest_rank() {
    // 3 physical cores per node, 2 GPUs: the first gets the extra core.
    let t = Shape::new(2, 1, 2, 1, 3).build();
    let p = run(&t, Mode::Exclusive);
    assert_eq!(cpus_of(&p, 0), "0-3");
    assert_eq!(cpus_of(&p, 1), "4-5");
    assert_eq!(cpus_of(&p, 2), "6-9");
    assert_eq!(cpus_of(&p, 3), "10-11");
    assert_eq!(p.ranks[1].mems, [0]);
    assert_eq!(p.ranks[3].mems, [1]);
}

#[test]
fn torch_exclusive_refuses_fewer_cores_than_gpus() {
    let t = Shape::new(2, 1, 2, 1, 1).build();
    let e = plan(&t, &all_gpus(&t), Mode::Exclusive, &PlanOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("NUMA node 0 has 1 physical core"), "{msg}");
    assert!(msg.contains("2 ranks"), "{msg}");
    assert!(e.fix().is_some_and(|f| f.contains("--mode node")), "{msg}");
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
}

#[test]
fn torch_core_complex_with_an_extra_l3() {
    // 3 L3 per node, 2 GPUs per node: GPU 3 takes node 1's second L3.
    let t = Shape::new(2, 1, 2, 3, 3).build();
    let p = run(&t, Mode::Cache);
    assert_eq!(cpus_of(&p, 3), "24-29");
    assert_eq!(p.ranks[3].mems, [1]);
    assert_eq!(cpus_of(&p, 2), "18-23");
}

#[test]
fn torch_core_complex_with_fewer_l3_than_gpus() {
    // One L3 per node: GPUs 2 and 3 share node 1's.
    let t = Shape::new(2, 1, 2, 1, 3).build();
    let p = run(&t, Mode::Cache);
    assert_eq!(cpus_of(&p, 3), "6-11");
    assert_eq!(cpus_of(&p, 2), "6-11");
    assert_warned(&p, 3, "shares");
    assert!(
        p.ranks[2].warnings.is_empty(),
        "the first rank on the cache has it to itself"
    );
}

#[test]
fn torch_core_complex_prefers_caches_with_more_allowed_cpus() {
    let mut t = Shape::new(1, 1, 1, 3, 3).build();
    t.allowed.cpus = CpuList::from_iter_unsorted([0, 4, 6, 7, 9]);
    let p = run(&t, Mode::Cache);
    assert_eq!(cpus_of(&p, 0), "6-7,9");
}

#[test]
fn torch_core_complex_ties_go_to_lower_cpus() {
    let t = Shape::new(1, 1, 1, 2, 1).build();
    assert_eq!(cpus_of(&run(&t, Mode::Cache), 0), "0-1");
}

#[test]
fn torch_node_minus_one_on_a_one_node_machine() {
    // torchrun reads sysfs numa_node -1 as node 0. On a one-node machine the
    // probe itself places the GPU on node 0; a description that leaves it
    // unknown gets the same CPUs, with a warning instead of a guess.
    let mut t = Shape::new(1, 1, 1, 1, 1).build();
    t.gpus[0].numa_node = None;
    let p = run(&t, Mode::Node);
    assert_eq!(cpus_of(&p, 0), "0-1");
    assert_eq!(p.ranks[0].mems, [0]);
    assert_warned(&p, 0, "unknown");
}

// ---- Where numapin answers differently from torchrun (docs/affinity.md).

#[test]
fn unknown_locality_on_a_multi_node_machine_is_not_node_0() {
    let mut t = Shape::new(2, 1, 1, 1, 4).build();
    let all = t.all_cpus();
    t.gpus[1].numa_node = None;
    t.gpus[1].package = None;
    t.gpus[1].local_cpus = all.clone();
    for mode in MODES {
        let p = run(&t, mode);
        let r = &p.ranks[1];
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("unknown") && w.contains("node 0")),
            "{mode}: {:?}",
            r.warnings
        );
        assert_eq!(r.mems, [0, 1], "{mode}: memory from every allowed node");
        if matches!(mode, Mode::Node | Mode::Socket) {
            assert_eq!(r.cpus, all, "{mode}: every allowed CPU, not node 0's");
        }
        assert!(p.ranks[0].warnings.is_empty());
    }
}

#[test]
fn unknown_node_but_known_local_cpus_uses_them() {
    // hwloc places the GPU under a package of two SNC nodes: no single node,
    // but its local CPUs are the package's.
    let mut t = Shape::new(2, 2, 1, 1, 2).build();
    t.gpus[2].numa_node = None;
    t.gpus[2].local_cpus = cpus("8-15");
    let p = run(&t, Mode::Node);
    assert_eq!(cpus_of(&p, 2), "8-15");
    assert_eq!(p.ranks[2].mems, [2, 3]);
    assert_warned(&p, 2, "local CPUs 8-15");
}

#[test]
fn exclusive_gives_ranks_without_a_node_what_the_others_leave() {
    // 3 nodes; GPU 1's node is unknown: it gets node 2, which no rank uses.
    let mut t = Shape::new(3, 1, 1, 1, 2).build();
    t.gpus[1].numa_node = None;
    t.gpus[1].local_cpus = t.all_cpus();
    let p = run(&t, Mode::Exclusive);
    assert_eq!(
        [cpus_of(&p, 0), cpus_of(&p, 1), cpus_of(&p, 2)],
        ["0-3", "4-7", "8-11"]
    );
    let q = plan(
        &t,
        &[0, 1].map(numapin::GpuIndex),
        Mode::Exclusive,
        &PlanOptions::default(),
    )
    .unwrap();
    assert_eq!([cpus_of(&q, 0), cpus_of(&q, 1)], ["0-3", "4-11"]);
    assert_warned(&q, 1, "left to them");
}

#[test]
fn exclusive_leaves_gpus_without_a_rank_out() {
    // torchrun divides a node among all of its GPUs; numapin among the ranks
    // of the plan, so two ranks on an 8-GPU node get half each.
    let t = Shape::new(1, 1, 8, 1, 8).build();
    let p = plan(
        &t,
        &[0, 1].map(numapin::GpuIndex),
        Mode::Exclusive,
        &PlanOptions::default(),
    )
    .unwrap();
    assert_eq!(cpus_of(&p, 0), "0-7");
    assert_eq!(cpus_of(&p, 1), "8-15");
}

// ---- SNC / NPS, SMT, restricted sets.

#[test]
fn snc_node_and_socket_differ() {
    // 2 sockets x 2 SNC nodes, 2 GPUs per node (DGX-like under NPS2/SNC2).
    let t = Shape::new(2, 2, 2, 1, 4).build();
    let node = run(&t, Mode::Node);
    let socket = run(&t, Mode::Socket);
    assert_eq!(cpus_of(&node, 5), "16-23");
    assert_eq!(node.ranks[5].mems, [2]);
    assert_eq!(cpus_of(&socket, 5), "16-31");
    assert_eq!(socket.ranks[5].mems, [2, 3]);
    let ex = run(&t, Mode::Exclusive);
    assert_eq!(cpus_of(&ex, 4), "16-19");
    assert_eq!(cpus_of(&ex, 5), "20-23");
}

#[test]
fn smt_off_machine_counts_each_cpu_as_a_core() {
    let mut shape = Shape::new(2, 1, 3, 1, 4);
    shape.smt = false;
    let t = shape.build();
    let ex = run(&t, Mode::Exclusive);
    assert_eq!(
        [cpus_of(&ex, 0), cpus_of(&ex, 1), cpus_of(&ex, 2)],
        ["0-1", "2", "3"]
    );
    let core = run(&t, Mode::Core);
    assert_eq!(
        [cpus_of(&core, 3), cpus_of(&core, 4), cpus_of(&core, 5)],
        ["4", "5", "6"]
    );
}

#[test]
fn core_mode_with_and_without_siblings() {
    let t = Shape::new(1, 1, 3, 1, 4).build();
    let with = run(&t, Mode::Core);
    assert_eq!(
        [cpus_of(&with, 0), cpus_of(&with, 1), cpus_of(&with, 2)],
        ["0-1", "2-3", "4-5"]
    );
    let without = plan(
        &t,
        &all_gpus(&t),
        Mode::Core,
        &PlanOptions::default().with_smt(false),
    )
    .unwrap();
    assert_eq!(
        [
            cpus_of(&without, 0),
            cpus_of(&without, 1),
            cpus_of(&without, 2)
        ],
        ["0", "2", "4"]
    );
    let few = Shape::new(1, 1, 3, 1, 2).build();
    let e = plan(&few, &all_gpus(&few), Mode::Core, &PlanOptions::default()).unwrap_err();
    assert!(e.to_string().contains("2 physical core"), "{e}");
}

#[test]
fn interleaved_siblings_are_kept_together() {
    // Linux numbers SMT siblings far apart on most x86 servers (0 and 8).
    let mut t = Shape::new(1, 1, 2, 1, 4).build();
    t.cores = (0..4)
        .map(|c| numapin::topology::Core {
            cpus: CpuList::from_iter_unsorted([c, c + 4]),
            numa_node: Some(0),
        })
        .collect();
    let ex = run(&t, Mode::Exclusive);
    assert_eq!(cpus_of(&ex, 0), "0-1,4-5");
    assert_eq!(cpus_of(&ex, 1), "2-3,6-7");
    let core = plan(
        &t,
        &[0, 1].map(numapin::GpuIndex),
        Mode::Core,
        &PlanOptions::default().with_smt(false),
    )
    .unwrap();
    assert_eq!([cpus_of(&core, 0), cpus_of(&core, 1)], ["0", "1"]);
}

#[test]
fn restricted_cpus_shrink_the_sets_and_say_so() {
    let mut t = Shape::new(2, 1, 2, 1, 4).build();
    t.allowed.cpus = cpus("2-7,8-9");
    let node = run(&t, Mode::Node);
    assert_eq!(cpus_of(&node, 0), "2-7");
    assert!(
        node.ranks[0]
            .warnings
            .iter()
            .any(|w| w.contains("0-1") && w.contains("outside")),
        "{:?}",
        node.ranks[0].warnings
    );
    assert_eq!(cpus_of(&node, 2), "8-9");
    // Exclusive divides what is allowed: core 0-1 is gone, 2-3 and 4-5 and
    // 6-7 remain; the first rank takes two of them.
    let ex = plan(
        &t,
        &[0, 1].map(numapin::GpuIndex),
        Mode::Exclusive,
        &PlanOptions::default(),
    )
    .unwrap();
    assert_eq!(cpus_of(&ex, 0), "2-5");
    assert_eq!(cpus_of(&ex, 1), "6-7");
    let e = plan(
        &t,
        &[2, 3].map(numapin::GpuIndex),
        Mode::Exclusive,
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("NUMA node 1 has 1 physical core"),
        "{e}"
    );
}

#[test]
fn a_node_wholly_outside_the_allowed_cpus_falls_back_with_a_warning() {
    let mut t = Shape::new(2, 1, 1, 1, 4).build();
    t.allowed.cpus = cpus("0-7");
    t.allowed.numa_nodes = vec![0];
    for mode in MODES {
        let p = run(&t, mode);
        let r = &p.ranks[1];
        assert!(r.cpus.is_subset(&cpus("0-7")), "{mode}");
        if mode == Mode::Exclusive {
            // Both ranks can only use node 0: they divide it.
            assert_eq!([cpus_of(&p, 0), cpus_of(&p, 1)], ["0-3", "4-7"]);
        }
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("8-15") && w.contains("outside")),
            "{mode}: {:?}",
            r.warnings
        );
        assert_eq!(r.mems, [0], "{mode}: only allowed memory");
    }
}

#[test]
fn a_node_whose_memory_is_not_allowed_keeps_its_cpus() {
    let mut t = Shape::new(2, 1, 1, 1, 2).build();
    t.allowed.numa_nodes = vec![0];
    let p = run(&t, Mode::Node);
    assert_eq!(cpus_of(&p, 1), "4-7");
    assert_eq!(p.ranks[1].mems, [0]);
    assert_warned(&p, 1, "memory");
}

#[test]
fn socket_memory_skips_gpu_memory_nodes() {
    // Grace Hopper style: the GPU's HBM is a CPU-less node in the package.
    let mut t = Shape::new(1, 1, 1, 1, 4).build();
    t.numa_nodes.push(NumaNode {
        os_index: 1,
        package: Some(0),
        cpus: CpuList::new(),
        memory_bytes: 1 << 30,
        distances: vec![],
        kind: NodeKind::GpuMemory,
    });
    t.packages[0].numa_nodes.push(1);
    allow_everything(&mut t);
    assert_eq!(run(&t, Mode::Socket).ranks[0].mems, [0]);
}

#[test]
fn no_core_or_cache_information_nccl_style() {
    // NCCL XML: nodes and GPUs only.
    let mut t = empty("nccl");
    for n in 0..2u32 {
        t.numa_nodes.push(NumaNode {
            os_index: n,
            package: None,
            cpus: CpuList::range(n * 4, n * 4 + 3),
            memory_bytes: 0,
            distances: vec![],
            kind: NodeKind::Normal,
        });
        add_gpu(&mut t, Some(n), None, CpuList::range(n * 4, n * 4 + 3));
        add_gpu(&mut t, Some(n), None, CpuList::range(n * 4, n * 4 + 3));
    }
    allow_everything(&mut t);
    let ex = run(&t, Mode::Exclusive);
    assert_eq!([cpus_of(&ex, 2), cpus_of(&ex, 3)], ["4-5", "6-7"]);
    let cache = run(&t, Mode::Cache);
    assert_eq!(
        [cpus_of(&cache, 2), cpus_of(&cache, 3)],
        ["4-7", "4-7"],
        "the node is one cache"
    );
    let core = run(&t, Mode::Core);
    assert_eq!([cpus_of(&core, 2), cpus_of(&core, 3)], ["4", "5"]);
    let socket = run(&t, Mode::Socket);
    assert_eq!(cpus_of(&socket, 2), "4-7");
    assert_warned(&socket, 2, "no package");
}

#[test]
fn gpus_out_of_range_and_empty_lists() {
    let t = Shape::new(1, 1, 2, 1, 2).build();
    let e = plan(
        &t,
        &[0, 2].map(numapin::GpuIndex),
        Mode::Node,
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(e.to_string().contains("GPU 2"), "{e}");
    assert!(plan(&t, &[], Mode::Exclusive, &PlanOptions::default())
        .unwrap()
        .ranks
        .is_empty());
    // A GPU listed twice is two ranks: exclusive gives each its own share.
    let p = plan(
        &t,
        &[1, 1].map(numapin::GpuIndex),
        Mode::Exclusive,
        &PlanOptions::default(),
    )
    .unwrap();
    assert!(p.ranks[0].cpus.is_disjoint(&p.ranks[1].cpus));
}

#[test]
fn node_plans() {
    let mut t = Shape::new(2, 1, 0, 1, 2).build();
    let r = plan_node(&t, 1).unwrap();
    assert_eq!(
        (r.cpus.to_string(), r.mems.clone(), r.gpu),
        ("4-7".to_string(), vec![1], None)
    );
    assert!(plan_node(&t, 2).unwrap_err().to_string().contains("node 2"));
    t.allowed.cpus = cpus("0-3");
    let e = plan_node(&t, 1).unwrap_err();
    assert!(e.to_string().contains("no CPU this process may use"), "{e}");
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    t.allowed.cpus = cpus("0-5");
    t.allowed.numa_nodes = vec![0];
    assert!(plan_node(&t, 1)
        .unwrap_err()
        .to_string()
        .contains("memory node"));
}

#[test]
fn plans_serialize_as_documented() {
    let t = Shape::new(1, 1, 1, 1, 2).build();
    let v: serde_json::Value = serde_json::to_value(run(&t, Mode::Exclusive)).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"mode":"exclusive","ranks":[{"local_rank":0,"gpu":0,"pci_bus_id":"0000:01:00.0","cpus":"0-3","mems":[0],"warnings":[],"nics":[]}]})
    );
    // With a NIC, each rank names it (docs/affinity.md).
    let mut t = t;
    common::add_nic(
        &mut t,
        "mlx5_0",
        numapin::topology::DeviceKind::Infiniband,
        &[numapin::topology::Relation::Pix],
    );
    let v: serde_json::Value = serde_json::to_value(run(&t, Mode::Exclusive)).unwrap();
    assert_eq!(
        v["ranks"][0]["nics"],
        serde_json::json!([{"nic":0,"pci_bus_id":"0000:80:00.0","names":["mlx5_0","if_mlx5_0"],"relation":"PIX"}])
    );
}

// ---- Invariants, on every described machine.

/// What every plan must satisfy: non-empty sets within the allowed CPUs and
/// nodes, exclusive and core shares disjoint, exclusive shares of a node
/// covering all of its allowed CPUs.
fn check(t: &Topology, p: &Plan, what: &str) {
    let allowed = if t.allowed.cpus.is_empty() {
        t.all_cpus()
    } else {
        t.allowed.cpus.clone()
    };
    for r in &p.ranks {
        assert!(
            !r.cpus.is_empty(),
            "{what}: rank {} has no CPUs",
            r.local_rank
        );
        assert!(
            r.cpus.is_subset(&allowed),
            "{what}: rank {} CPUs {} outside allowed {allowed}",
            r.local_rank,
            r.cpus
        );
        assert!(
            !r.mems.is_empty(),
            "{what}: rank {} has no memory node",
            r.local_rank
        );
        if !t.allowed.numa_nodes.is_empty() {
            assert!(
                r.mems.iter().all(|m| t.allowed.numa_nodes.contains(m)),
                "{what}: rank {} mems {:?}",
                r.local_rank,
                r.mems
            );
        }
    }
    if matches!(p.mode, Mode::Exclusive | Mode::Core) {
        for (i, a) in p.ranks.iter().enumerate() {
            for b in &p.ranks[i + 1..] {
                assert!(
                    a.cpus.is_disjoint(&b.cpus),
                    "{what}: ranks {} and {} overlap ({} / {})",
                    a.local_rank,
                    b.local_rank,
                    a.cpus,
                    b.cpus
                );
            }
        }
    }
    if p.mode == Mode::Exclusive {
        // The shares leave nothing of the ranks' nodes unused.
        let gpus: Vec<numapin::GpuIndex> = p.ranks.iter().map(|r| r.gpu.unwrap()).collect();
        let node = plan(t, &gpus, Mode::Node, &PlanOptions::default()).unwrap();
        let homes = node
            .ranks
            .iter()
            .fold(CpuList::new(), |a, r| a.union(&r.cpus));
        let shares = p.ranks.iter().fold(CpuList::new(), |a, r| a.union(&r.cpus));
        assert_eq!(shares, homes, "{what}: exclusive shares leave CPUs unused");
    }
}

fn shared_files() -> Option<Vec<PathBuf>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/topologies");
    if !dir.is_dir() {
        common::skip(common::Need::Shared, "../shared/topologies is not there (the real-machine data set lives beside the checkout)");
        return None;
    }
    let mut files = Vec::new();
    for sub in ["hwloc-xml", "nccl", "sysfs"] {
        for e in std::fs::read_dir(dir.join(sub))
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = e.path();
            let name = p.to_string_lossy();
            if name.ends_with(".xml") || name.ends_with(".tar.bz2") || name.ends_with(".tar.gz") {
                files.push(p);
            }
        }
    }
    files.sort();
    Some(files)
}

#[test]
fn every_shared_topology_gives_sound_plans() {
    let Some(files) = shared_files() else { return };
    assert!(!files.is_empty());
    let mut planned = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let t =
            Topology::load(f, &ProbeOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Every GPU, then every node bound directly.
        for mode in MODES {
            match plan(&t, &all_gpus(&t), mode, &PlanOptions::default()) {
                Ok(p) => {
                    check(&t, &p, &format!("{name} {mode}"));
                    planned += 1;
                }
                Err(e) => {
                    // Only a node with fewer cores than GPUs may refuse.
                    assert!(
                        matches!(mode, Mode::Exclusive | Mode::Core),
                        "{name} {mode}: {e}"
                    );
                    assert!(
                        e.to_string().contains("physical core"),
                        "{name} {mode}: {e}"
                    );
                }
            }
        }
        for n in &t.numa_nodes {
            if let Ok(r) = plan_node(&t, n.os_index) {
                assert!(
                    !r.cpus.is_empty() && r.cpus.is_subset(&n.cpus),
                    "{name}: node {}",
                    n.os_index
                );
            }
        }
    }
    eprintln!(
        "planned {planned} mode/machine pairs from {} files",
        files.len()
    );
}

#[test]
fn shared_topology_expectations() {
    let Some(files) = shared_files() else { return };
    let find = |part: &str| {
        files
            .iter()
            .find(|f| f.to_string_lossy().contains(part))
            .cloned()
    };
    // Azure ND96asr v4: 4 nodes x 24 CPUs, 2 A100 per node.
    if let Some(f) = find("azure-ndv4") {
        let t = Topology::load(&f, &ProbeOptions::default()).unwrap();
        let ex = run(&t, Mode::Exclusive);
        // GPUs 0 and 1 sit on node 1 (CPUs 24-47).
        assert_eq!([cpus_of(&ex, 0), cpus_of(&ex, 1)], ["24-35", "36-47"]);
        assert_eq!(ex.ranks[0].mems, [1]);
    }
    // Only CPUs 0-15 allowed, GPUs on nodes whose CPUs are all excluded.
    if let Some(f) = find("64intel64-3g2n+2n-irregulargroups") {
        let t = Topology::load(&f, &ProbeOptions::default()).unwrap();
        let p = run(&t, Mode::Node);
        for r in &p.ranks {
            assert!(r.cpus.is_subset(&cpus("0-15")), "{:?}", r);
            assert!(
                r.warnings.iter().any(|w| w.contains("outside")),
                "{:?}",
                r.warnings
            );
        }
    }
    // Interleaved CPUs between two nodes, SMT siblings 12 apart.
    if let Some(f) = find("24em64t-2n6c2t") {
        let t = Topology::load(&f, &ProbeOptions::default()).unwrap();
        let ex = run(&t, Mode::Exclusive);
        assert_eq!(cpus_of(&ex, 0), "0,2,4,6,8,10,12,14,16,18,20,22");
        assert_eq!(cpus_of(&ex, 1), "1,3,5,13,15,17");
        assert_eq!(cpus_of(&ex, 2), "7,9,11,19,21,23");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn plans_hold_their_invariants(
        sockets in 1u32..4, nodes in 1u32..3, gpus in 0u32..4, l3 in 1u32..4, cores in 1u32..5, smt: bool,
        allowed_mask in proptest::collection::vec(any::<bool>(), 96),
        unknown in proptest::collection::vec(any::<bool>(), 24),
    ) {
        let mut t = Shape { sockets, nodes_per_socket: nodes, gpus_per_node: gpus, l3_per_node: l3, cores_per_l3: cores, smt }.build();
        let all = t.all_cpus();
        let restricted: CpuList = all.iter().filter(|&c| allowed_mask[c as usize % 96]).collect();
        if !restricted.is_empty() {
            t.allowed.cpus = restricted;
        }
        for (g, u) in t.gpus.iter_mut().zip(&unknown) {
            if *u {
                g.numa_node = None;
                g.local_cpus = all.clone();
            }
        }
        for mode in MODES {
            match plan(&t, &all_gpus(&t), mode, &PlanOptions::default().with_smt(smt)) {
                Ok(p) => {
                    prop_assert_eq!(p.ranks.len(), t.gpus.len());
                    check(&t, &p, &format!("{mode}"));
                }
                Err(e) => {
                    prop_assert!(matches!(mode, Mode::Exclusive | Mode::Core), "{}: {}", mode, e);
                    prop_assert!(e.to_string().contains("physical core"), "{}", e);
                }
            }
        }
    }
}

#[test]
fn package_without_nodes_listed_uses_its_cpus_nodes() {
    let mut t = Shape::new(2, 1, 1, 1, 2).build();
    t.packages = vec![
        Package {
            index: 0,
            cpus: cpus("0-3"),
            numa_nodes: vec![],
        },
        Package {
            index: 1,
            cpus: cpus("4-7"),
            numa_nodes: vec![],
        },
    ];
    assert_eq!(run(&t, Mode::Socket).ranks[1].mems, [1]);
}

//! `Runtime::place`: the one answer to "which node and CPUs for this GPU",
//! on fixtures of real machines, with one test per fallback. No memory is
//! touched: a runtime makes no region until its first allocation.
#![allow(clippy::unwrap_used)] // tests fail loudly

use std::path::PathBuf;

use numapin::runtime::{Runtime, RuntimeConfig, Target};
use numapin::topology::{NodeKind, ProbeOptions, Topology};
use numapin::{CpuList, CudaOrdinal, GpuIndex};

fn load(name: &str) -> Topology {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("topology")
        .join(name);
    Topology::load(&path, &ProbeOptions::default()).unwrap()
}

fn runtime(t: Topology) -> Runtime {
    Runtime::new(t, RuntimeConfig::default()).unwrap()
}

/// The CPUs of `node` in `t`.
fn cpus_of(t: &Topology, node: u32) -> CpuList {
    t.node(node).unwrap().cpus.clone()
}

#[test]
fn a_gpu_gets_its_own_node_and_cpus_without_warnings() {
    let t = load("dgx-h100.xml");
    let want = cpus_of(&t, 1);
    let rt = runtime(t);
    let s = rt.place(Target::Gpu(CudaOrdinal(4))).unwrap();
    assert_eq!(s.node, 1);
    assert_eq!(s.cpus, want);
    assert_eq!(s.gpu, Some(GpuIndex(4)));
    assert_eq!(s.ordinal(), Some(CudaOrdinal(4)));
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    // The same answer by index (host mode), by the node, and for
    // allocations and thread binding.
    let h = rt.place(Target::HostForGpu(GpuIndex(4))).unwrap();
    assert_eq!((h.node, &h.cpus, h.ordinal()), (1, &want, None));
    assert_eq!(rt.node_for_gpu(CudaOrdinal(4)).unwrap(), 1);
    let n = rt.place(Target::HostNode(1)).unwrap();
    assert_eq!((n.node, &n.cpus), (1, &want));
    // The planner `numapin affinity` uses gives the same CPUs.
    let t = rt.topology();
    let mut plan = numapin::affinity::plan(
        t,
        &[GpuIndex(4)],
        numapin::affinity::Mode::Node,
        &numapin::affinity::PlanOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.ranks.remove(0).cpus, want);
}

#[test]
fn a_gpu_whose_node_has_no_arena_gets_the_nearest_node_with_one() {
    let mut t = load("dgx-h100.xml");
    for n in &mut t.numa_nodes {
        if n.os_index == 1 {
            n.memory_bytes = 0;
        }
    }
    let node1 = cpus_of(&t, 1);
    let rt = runtime(t);
    let s = rt.place(Target::Gpu(CudaOrdinal(4))).unwrap();
    assert_eq!(s.node, 0, "the only node with memory");
    // Threads stay near the GPU: only the memory moves.
    assert_eq!(s.cpus, node1);
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    assert!(
        s.warnings[0].contains("node 1 has no memory") && s.warnings[0].contains("node 0"),
        "{:?}",
        s.warnings
    );
    assert_eq!(rt.node_for_gpu(CudaOrdinal(4)).unwrap(), 0);
}

#[test]
fn a_grace_hopper_gpu_memory_node_is_not_an_arena() {
    let t = load("grace-hopper.xml");
    let gpu_nodes: Vec<u32> = t
        .numa_nodes
        .iter()
        .filter(|n| n.kind == NodeKind::GpuMemory)
        .map(|n| n.os_index)
        .collect();
    assert!(!gpu_nodes.is_empty(), "the fixture has GPU memory nodes");
    let rt = runtime(t);
    let s = rt.place(Target::Gpu(CudaOrdinal(0))).unwrap();
    assert!(!gpu_nodes.contains(&s.node), "{s:?}");
    assert!(rt.arena_nodes().any(|n| n == s.node));
}

#[test]
fn a_gpu_of_unknown_locality_says_so_and_uses_the_allowed_cpus() {
    let t = load("cloud-vm-2n-nolocality.xml");
    assert!(t.numa_nodes.len() > 1);
    let g = t.gpu_by_ordinal(CudaOrdinal(0)).unwrap();
    assert_eq!(g.numa_node, None);
    let allowed = t.allowed.cpus.clone();
    let rt = runtime(t);
    let s = rt.place(Target::Gpu(CudaOrdinal(0))).unwrap();
    assert_eq!(s.cpus, allowed);
    assert!(rt.arena_nodes().any(|n| n == s.node));
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("NUMA node is unknown")),
        "{:?}",
        s.warnings
    );
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains(&format!("pinned memory goes on node {}", s.node))),
        "{:?}",
        s.warnings
    );
}

#[test]
fn a_gpu_whose_cpus_are_not_allowed_runs_on_the_allowed_cpus_with_memory_on_its_node() {
    let mut t = load("dgx-h100.xml");
    let node0 = cpus_of(&t, 0);
    t.allowed.cpus = node0.clone();
    let rt = runtime(t);
    let s = rt.place(Target::Gpu(CudaOrdinal(4))).unwrap();
    assert_eq!(s.cpus, node0, "the CPUs this process may use");
    assert_eq!(s.node, 1, "memory stays on the GPU's node");
    assert!(
        s.warnings.iter().any(|w| w.contains("outside the CPUs")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn unknown_gpus_and_nodes_are_input_errors() {
    let rt = runtime(load("dgx-h100.xml"));
    let e = rt.place(Target::Gpu(CudaOrdinal(8))).unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(e.to_string().contains("GPU 8"), "{e}");
    let e = rt.place(Target::HostForGpu(GpuIndex(9))).unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
    assert!(e.to_string().contains("GPU index 9"), "{e}");
    assert!(e.fix().is_some());
    let e = rt.place(Target::HostNode(7)).unwrap_err();
    assert_eq!(e.kind(), numapin::ErrorKind::Input);
}

#[test]
fn one_node_machines_have_nothing_to_warn_about() {
    let t = load("cloud-vm-1n.xml");
    let allowed = t.allowed.cpus.clone();
    let rt = runtime(t);
    let s = rt.place(Target::Gpu(CudaOrdinal(0))).unwrap();
    assert_eq!(s.cpus, allowed);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

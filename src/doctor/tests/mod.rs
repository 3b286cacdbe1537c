//! Each verdict of each check, from synthetic inputs; the report as a
//! whole; the pin probe on this machine.

mod checks;
mod containers;
mod huge_pages;
mod pin_probe;

use super::{evaluate, run, Check, DoctorOptions, Subject, Verdict, CHECKS, LIVE_CHECKS};
use crate::cpulist::CpuList;
use crate::gpu::{CudaError, CudaOrdinal, GpuIndex};
use crate::platform::cuda::NoDriver;
use crate::system::{
    CudaDriver, HugePages, Iommu, MemlockLimit, PolicyMode, PolicySource, SystemSnapshot, Thp,
    ThreadPolicy,
};
use crate::topology::{Allowed, CudaInfo, Gpu, NodeKind, NumaNode, Topology, VisibleEntry};

/// Fails naming the first of `parts` that `text` lacks.
#[track_caller]
pub(super) fn assert_contains_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}

pub(super) fn cpus(s: &str) -> CpuList {
    CpuList::parse(s).unwrap()
}

/// `nodes` nodes of 4 CPUs and 64 GiB each, everything allowed, no GPU.
pub(super) fn machine(nodes: u32) -> Topology {
    Topology {
        schema_version: crate::topology::SCHEMA_VERSION,
        source: "live".into(),
        packages: vec![],
        numa_nodes: (0..nodes)
            .map(|i| NumaNode {
                os_index: i,
                package: Some(i / 2),
                cpus: CpuList::range(i * 4, i * 4 + 3),
                memory_bytes: 64 << 30,
                distances: vec![],
                kind: NodeKind::Normal,
            })
            .collect(),
        gpus: vec![],
        allowed: Allowed {
            cpus: CpuList::range(0, nodes * 4 - 1),
            numa_nodes: (0..nodes).collect(),
        },
        warnings: vec![],
        cores: vec![],
        caches: vec![],
        cuda: CudaInfo {
            ordinal_source: "none".into(),
            device_order: "FASTEST_FIRST".into(),
            ..Default::default()
        },
        nics: vec![],
        storage: vec![],
    }
}

/// Adds an NVIDIA GPU on `node` (its CPUs local), CUDA ordinal in order.
pub(super) fn gpu(t: &mut Topology, node: Option<u32>) -> &mut Gpu {
    let i = u32::try_from(t.gpus.len()).unwrap();
    let local = match node {
        Some(n) => t.node(n).unwrap().cpus.clone(),
        None => t.all_cpus(),
    };
    t.gpus.push(Gpu {
        index: GpuIndex(i),
        cuda_ordinal: Some(CudaOrdinal(i)),
        pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
        name: None,
        uuid: None,
        numa_node: node,
        package: node.map(|n| n / 2),
        local_cpus: local,
        pcie: None,
        vendor_id: super::words::NVIDIA.into(),
        device_id: "0x2330".into(),
        class_id: "0x0302".into(),
    });
    t.cuda.ordinal_source = "driver".into();
    t.cuda.ordinals.push(VisibleEntry {
        ordinal: CudaOrdinal(i),
        entry: "*".into(),
        gpu: Some(GpuIndex(i)),
        mig: false,
    });
    t.gpus.last_mut().unwrap()
}

pub(super) fn verdicts(v: &[Check]) -> Vec<Verdict> {
    v.iter().map(|c| c.verdict).collect()
}

// ---- all together ----

/// A snapshot of a healthy one-node machine without GPUs.
pub(super) fn healthy() -> SystemSnapshot {
    SystemSnapshot {
        memlock: Ok(MemlockLimit {
            soft: u64::MAX,
            hard: u64::MAX,
        }),
        security: Default::default(),
        cuda_driver: CudaDriver::Unavailable(CudaError::NoDriver(NoDriver::NotInstalled)),
        mempolicy: Ok(ThreadPolicy {
            mode: PolicyMode::Default,
            nodes: vec![],
            source: PolicySource::GetMempolicy,
        }),
        numa_calls: vec![],
        container: Default::default(),
        cgroup: Default::default(),
        thp: Thp {
            enabled: Some("always [madvise] never".into()),
            defrag: Some("[madvise]".into()),
        },
        huge_pages: HugePages {
            thp_enabled: Some("madvise".into()),
            thp_defrag: Some("madvise".into()),
            madv_populate_write: true,
            pools: vec![],
            error: None,
        },
        numa_balancing: Some("0".into()),
        iommu: Iommu::default(),
        mounts: Vec::new(),
    }
}

#[test]
fn evaluate_gives_every_check_name_once_at_least() {
    let t = machine(1);
    let all = evaluate(&t, Some(&healthy()));
    let names: Vec<&str> = all.iter().map(|c| c.name).collect();
    let expected: Vec<&str> = CHECKS
        .iter()
        .copied()
        .filter(|n| *n != "pin_probe")
        .collect();
    assert_eq!(names, expected);
    assert!(all
        .iter()
        .all(|c| c.verdict == Verdict::Ok && !c.evidence.is_empty()));
    // Without live state, only the topology checks.
    let saved = evaluate(&t, None);
    assert!(saved.iter().all(|c| !LIVE_CHECKS.contains(&c.name)));
    assert_eq!(saved.len(), 7);
}

/// The memory policy read from numa_maps says so at the end of its
/// evidence.
#[test]
fn a_policy_from_numa_maps_says_where_it_came_from() {
    let mut s = healthy();
    s.mempolicy = Ok(ThreadPolicy {
        mode: PolicyMode::Default,
        nodes: vec![],
        source: PolicySource::NumaMaps {
            refused: "EPERM".into(),
        },
    });
    let all = evaluate(&machine(1), Some(&s));
    let c = all.iter().find(|c| c.name == "memory_policy").unwrap();
    assert!(
        c.evidence.ends_with(
            "first touches it (read from /proc/self/numa_maps: get_mempolicy is refused (EPERM))"
        ),
        "{}",
        c.evidence
    );
}

/// A saved machine: the live checks come back skipped, with the reason,
/// in the order of [`LIVE_CHECKS`]; no live state is read.
#[test]
fn a_saved_machine_skips_the_live_checks() {
    let mut t = machine(2);
    t.source = "box.xml".into();
    let r = run(&t, &DoctorOptions::default());
    assert!(r.system.is_none());
    let skipped: Vec<&str> = r
        .checks
        .iter()
        .filter(|c| c.verdict == Verdict::Skip)
        .map(|c| c.name)
        .collect();
    assert_eq!(skipped, LIVE_CHECKS);
    let c = r.checks.last().unwrap();
    assert_eq!(c.evidence, "reads this machine's live state, not box.xml's");
    assert_eq!((c.fix.as_ref(), c.subject), (None, Subject::Machine));
    assert_eq!(r.count(Verdict::Skip), LIVE_CHECKS.len());
    assert_eq!(r.count(Verdict::Ok), 7);
    assert_eq!(r.worst(), Verdict::Ok);
    // Turning the live state off does the same on this machine.
    t.source = "live".into();
    let r = run(&t, &DoctorOptions::default().with_live_state(false));
    assert_eq!(r.count(Verdict::Skip), LIVE_CHECKS.len());
    assert!(r.checks.last().unwrap().evidence.contains("live_state"));
}

/// On this machine: every check runs (the pin probe skipped when not asked
/// for) and the snapshot comes back with the report.
#[test]
fn this_machine_runs_every_check() {
    let t = crate::Topology::probe(
        &crate::topology::ProbeOptions::default().with_cuda(crate::topology::CudaMode::Off),
    )
    .unwrap();
    let opts = DoctorOptions::default()
        .with_cuda(false)
        .with_pin_probe(false);
    let r = run(&t, &opts);
    assert!(r.system.is_some());
    let last = r.checks.last().unwrap();
    assert_eq!((last.name, last.verdict), ("pin_probe", Verdict::Skip));
    assert_eq!(r.count(Verdict::Skip), 1);
    for name in CHECKS {
        assert!(r.checks.iter().any(|c| c.name == *name), "{name} missing");
    }
    assert!(r.worst() >= Verdict::Ok);
}

#[test]
fn checks_serialize_with_their_subject() {
    let c = Check::warn("pcie_link", "slow", "look").for_gpu(GpuIndex(3));
    let j = serde_json::to_string(&c).unwrap();
    assert_eq!(
        j,
        r#"{"name":"pcie_link","verdict":"warn","evidence":"slow","fix":"look","gpu":3,"node":null,"nic":null,"subject":"GPU 3"}"#
    );
    let c = Check::ok("pin_probe", "fine").for_node(1);
    assert_eq!((c.node(), c.gpu(), c.nic()), (Some(1), None, None));
    assert_eq!(c.subject.label().as_deref(), Some("node 1"));
    assert_eq!(
        Check::ok("x", "y").for_nic(2).subject.label().as_deref(),
        Some("NIC 2")
    );
    assert_eq!(Subject::Machine.label(), None);
    assert!(Verdict::Skip < Verdict::Ok && Verdict::Warn < Verdict::Fail);
    assert_eq!(Verdict::Fail.to_string(), "fail");
}

//! The pin probe: on this machine, and its verdicts on outcomes made up.

use super::assert_contains_all;
use crate::doctor::pin_probe::{
    judge, probe_all, probe_node, ProbeOutcome, DEFAULT_PROBE_BYTES, READS,
};
use crate::doctor::Verdict;
use crate::runtime::{PageKind, PinnedBy, PlacedBy, RegionMethods, RuntimeError, VerifiedBy};
use crate::topology::{NumaNode, Topology};

/// In this process: every probe passes on a node with memory, and
/// nothing stays locked or mapped afterwards.
#[test]
fn pin_probe_leaves_nothing_locked() {
    let t = crate::Topology::probe(
        &crate::topology::ProbeOptions::default().with_cuda(crate::topology::CudaMode::Off),
    )
    .unwrap();
    let before = crate::platform::sys::locked_bytes();
    let checks = probe_all(&t, DEFAULT_PROBE_BYTES, false);
    assert_eq!(checks.len(), t.numa_nodes.len());
    for c in &checks {
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
    }
    assert_eq!(
        crate::platform::sys::locked_bytes(),
        before,
        "VmLck back where it was"
    );
    let last = crate::arena::region::last_mapped_addr();
    assert_ne!(last, 0, "a probe region was mapped");
    assert!(
        !crate::platform::numa::is_mapped(last),
        "the last probe region is unmapped"
    );
}

fn outcome(on: u64, elsewhere: Vec<(u32, u64)>, errors: u64) -> ProbeOutcome {
    ProbeOutcome {
        node: 1,
        bytes: 2 << 20,
        pages: 512,
        on_node: on,
        elsewhere,
        errors,
        not_registered: Some("no CUDA driver: test".into()),
        reads: 1,
        methods: RegionMethods {
            placed: PlacedBy::Mbind,
            pinned: PinnedBy::Mlock,
            verified: VerifiedBy::MovePages,
            pages: PageKind::Transparent,
        },
        notes: vec![],
    }
}

#[test]
fn every_page_on_the_node_is_ok() {
    let c = judge(1, Ok(outcome(512, vec![], 0)));
    assert_eq!((c.verdict, c.node()), (Verdict::Ok, Some(1)));
    assert!(
        c.evidence.contains("all 512 pages on node 1"),
        "{}",
        c.evidence
    );
    assert!(c
        .evidence
        .contains("not registered with CUDA (no CUDA driver"));
    assert!(c.fix.is_none());
}

#[test]
fn pages_elsewhere_or_unreadable_fail() {
    let c = judge(1, Ok(outcome(500, vec![(0, 10)], 2)));
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(
        c.evidence
            .contains("500 of 512 pages on node 1, 10 on node 0, 2 unreadable"),
        "{}",
        c.evidence
    );
    assert!(c.fix.unwrap().contains("numastat -m"));
    let mut o = outcome(512, vec![], 0);
    o.errors = 1;
    o.on_node = 511;
    o.reads = READS;
    let c = judge(1, Ok(o));
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(c.evidence.contains("after 5 reads"), "{}", c.evidence);
}

/// Under a seccomp profile: the evidence names the methods used and
/// why, and a miss points at first touch's needs and at CAP_SYS_NICE.
#[test]
fn fallback_methods_are_in_the_evidence() {
    let mut o = outcome(512, vec![], 0);
    o.methods = RegionMethods {
        placed: PlacedBy::FirstTouch,
        pinned: PinnedBy::Registration,
        verified: VerifiedBy::NumaMaps,
        pages: PageKind::Base,
    };
    o.notes = vec!["mbind refused (EPERM): touched first from CPUs 2".into()];
    let c = judge(1, Ok(o.clone()));
    assert_eq!(c.verdict, Verdict::Ok);
    assert_contains_all(
        &c.evidence,
        &[
            "2 MiB region of 4 KiB pages mapped, placed by first touch",
            "pinned by CUDA registration (not locked)",
            "mbind refused (EPERM)",
            "numa_maps: all 512 pages on node 1",
        ],
    );
    o.on_node = 0;
    o.elsewhere = vec![(0, 512)];
    let c = judge(1, Ok(o));
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(
        c.evidence
            .contains("numa_maps: 0 of 512 pages on node 1, 512 on node 0"),
        "{}",
        c.evidence
    );
    let fix = c.fix.unwrap();
    assert!(
        fix.contains("first touch") && fix.contains("SYS_NICE"),
        "{fix}"
    );
}

#[test]
fn an_arena_error_fails_with_its_fix() {
    let e = RuntimeError::Memlock {
        node: 1,
        size: 2 << 20,
        limit: 1 << 20,
        locked: 0,
        source: Some(std::io::Error::from_raw_os_error(libc::ENOMEM)),
    };
    let c = judge(1, Err(e));
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(
        c.evidence.contains("RLIMIT_MEMLOCK is 1 MiB"),
        "{}",
        c.evidence
    );
    let fix = c.fix.unwrap();
    assert!(
        fix.contains("ulimit -l") && fix.contains("LimitMEMLOCK="),
        "{fix}"
    );
    assert!(!c.evidence.contains("fix:"));
}

fn topo(nodes: Vec<NumaNode>, allowed: Vec<u32>) -> Topology {
    let mut t: Topology = serde_json::from_str(
        r#"{"schema_version":1,"source":"live","packages":[],"numa_nodes":[],"gpus":[],
            "allowed":{"cpus":"","numa_nodes":[]},"warnings":[],"cores":[],"caches":[],
            "cuda":{"driver_version":null,"ordinal_source":"none","visible_devices":null,
            "device_order":"FASTEST_FIRST","ordinals":[]}}"#,
    )
    .unwrap();
    t.numa_nodes = nodes;
    t.allowed.numa_nodes = allowed;
    t
}

fn node(i: u32, mem: u64) -> NumaNode {
    NumaNode {
        os_index: i,
        package: Some(0),
        cpus: crate::CpuList::new(),
        memory_bytes: mem,
        distances: vec![],
        kind: crate::topology::NodeKind::Normal,
    }
}

#[test]
fn nodes_without_memory_or_not_allowed_are_skipped_not_failed() {
    let t = topo(
        vec![node(0, 1 << 30), node(1, 0), node(2, 1 << 30)],
        vec![0, 1],
    );
    let c = probe_node(&t, &t.numa_nodes[1], DEFAULT_PROBE_BYTES, true);
    assert_eq!((c.verdict, c.node()), (Verdict::Ok, Some(1)));
    assert!(c.evidence.contains("no memory") && c.evidence.contains("skipped"));
    let c = probe_node(&t, &t.numa_nodes[2], DEFAULT_PROBE_BYTES, true);
    assert_eq!(c.verdict, Verdict::Ok);
    assert!(c.evidence.contains("cpuset.mems"), "{}", c.evidence);
    assert_eq!(
        probe_all(&topo(vec![], vec![]), DEFAULT_PROBE_BYTES, true)[0].verdict,
        Verdict::Warn
    );
}
